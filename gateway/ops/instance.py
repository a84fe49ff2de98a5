"""Instance identity: the name this process writes into every lease and claim, and the guard
that makes one live process at a time hold it.

The default id is stable across restarts (host name + a digest of the database's location), so
a process restarted after a crash (``kill -9``, then systemd ``Restart=always``) recognises its
predecessor's leases as its own and takes them over at once instead of waiting out
``bus.lease_s``. Two live processes with one id would share leases, so a process starting with
an id that a live process holds refuses to start (``InstanceInUse``: ``gateway run`` prints one
line and exits 2).

Telling a crashed predecessor from a live twin (``InstanceGuard.acquire``): the holder's row in
``instances`` records its host, pid, pid start time and where that pid can be checked (host name,
kernel boot id, PID namespace). Same scope: the pid decides at once (gone, a zombie, or reused by
another program: crashed; running: live). Other scope (another host or container): the holder is
live while its heartbeat (renewed every ``HEARTBEAT_S``) moves; the newcomer watches it and takes
over once it is ``STALE_AFTER_S`` old. A live process that finds its id taken over (it stalled
past that while a newcomer judged it gone) stops at once without releasing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import secrets
import socket
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.engine import make_url

from gateway.core.errors import ConfigError
from gateway.ops.instance_store import InstanceRecord, InstanceStore, Released

log = logging.getLogger("gateway.ops.instance")
T = TypeVar("T")

HEARTBEAT_S = 1.0
"""How often a running instance renews its row."""
STALE_AFTER_S = 4.0
"""A holder whose pid cannot be checked from here counts as gone once its heartbeat is this old."""
WATCH_POLL_S = 0.2
EXIT_CODE = 2
"""``gateway run``'s exit code when the id is in use (and when this process lost it)."""

_LOCAL: weakref.WeakValueDictionary[str, InstanceGuard] = weakref.WeakValueDictionary()
"""Guards of this process by boot nonce: two gateways in one process (tests, embedding) share a pid."""


class InstanceInUse(ConfigError):
    """A live process holds the instance id this one was configured with (message: who, and what
    to do)."""


def default_instance_id(database_url: str) -> str:
    """``<host name>-<8 hex>``: the hex digest covers the database's location (SQLite: the file's
    absolute path; others: driver, user, host, port, database; never the password), so the same
    deployment restarted gets the same id, and processes on different hosts get different ones."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        memory = not url.database or url.database == ":memory:"
        where = f"sqlite:{':memory:' if memory else Path(url.database).resolve()}"  # type: ignore[arg-type]
    else:
        where = (f"{url.get_backend_name()}://{url.username or ''}@{url.host or ''}:{url.port or ''}/"
                 f"{url.database or ''}")
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:100] or "host"
    return f"{host}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def instance_id_for(configured: str | None, database_url: str, role: str | None = None) -> str:
    """The id a process uses: ``instance_id`` when configured, else ``default_instance_id``. A
    ``role`` (``chat``, ``jobs``: short-lived commands beside a running gateway) gets its own id
    per process, ``<id>+<role>.<pid>``, so it never takes over the gateway's leases."""
    base = configured or default_instance_id(database_url)
    return f"{base}+{role}.{os.getpid()}" if role else base


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """Who this process is, as recorded in its ``instances`` row."""

    host: str
    pid: int
    scope: str
    start: str | None

    @classmethod
    def current(cls) -> ProcessInfo:
        host = socket.gethostname()
        return cls(host, os.getpid(), _pid_scope(host), _start_ticks(os.getpid()))

    def alive(self, record: InstanceRecord) -> bool | None:
        """Whether the holder in ``record`` runs: ``True``/``False`` when its pid can be checked
        from here (same scope), ``None`` when not (another host, container or PID namespace)."""
        if record.pid_scope != self.scope:
            return None
        if record.pid == self.pid:  # our own pid: a gateway in this process, or a predecessor that had it
            guard = _LOCAL.get(record.boot)
            return guard is not None and guard.running
        if Path("/proc/self/stat").exists():
            state = _proc_stat(record.pid)
            if state is None or state[0] in ("Z", "X"):
                return False  # gone, or a zombie not yet reaped
            return record.pid_start is None or state[1] == record.pid_start  # else: the pid was reused
        try:
            os.kill(record.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _pid_scope(host: str) -> str:
    """Host name, kernel boot id and PID namespace: a pid means the same process only within it."""
    parts = [host]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return "|".join(parts)[:255]


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """``(state, start time in clock ticks)`` of ``pid`` from ``/proc``, ``None`` if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], fields[19]


def _start_ticks(pid: int) -> str | None:
    state = _proc_stat(pid)
    return state[1] if state is not None else None


class InstanceGuard:
    """Holds this process's instance id: ``acquire`` at start, a heartbeat while running,
    ``release`` at a graceful stop.

    Args:
        store: the ``instances`` table.
        instance_id: the id to hold.
        run_db: runs a blocking store call off the loop (``Gateway.run_db``).
        on_lost: called (on the loop) when another process took the id over while this one ran;
            it must stop this process without releasing anything (``exit_now``).
    """

    def __init__(self, store: InstanceStore, instance_id: str,
                 run_db: Callable[..., Awaitable[Any]], on_lost: Callable[[InstanceRecord | None], None]) -> None:
        self.store = store
        self.instance_id = instance_id
        self.boot = secrets.token_hex(16)
        self.process = ProcessInfo.current()
        self._run_db = run_db
        self._on_lost = on_lost
        self._task: asyncio.Task[None] | None = None
        self.held = False

    @property
    def running(self) -> bool:
        """Holds the id and its heartbeat runs."""
        task = self._task
        return self.held and task is not None and not task.done() and not task.get_loop().is_closed()

    def _record(self) -> InstanceRecord:
        now = time.time()
        p = self.process
        return InstanceRecord(self.instance_id, self.boot, p.host[:255], p.pid, p.scope, p.start, now, now)

    async def acquire(self) -> Released:
        """Takes the id (and every lease and claim it holds) or raises ``InstanceInUse``.

        Returns at once when the id is free or its holder is known to be gone; when the holder's
        pid cannot be checked from here, watches its heartbeat for at most ``STALE_AFTER_S``.
        """
        watched: tuple[str, float] | None = None
        while True:
            holder = await self._run_db(self.store.get, self.instance_id)
            why = ""
            if holder is not None:
                age = time.time() - holder.heartbeat_at
                alive = self.process.alive(holder)
                if alive is True:
                    raise InstanceInUse(self._in_use(holder, age))
                if alive is None and age <= STALE_AFTER_S:
                    if watched is None:
                        log.info("instance id %s: held by pid %s on %s (heartbeat %.1f s ago); waiting up to "
                                 "%.0f s for it to go quiet", self.instance_id, holder.pid, holder.host, age,
                                 STALE_AFTER_S)
                        watched = (holder.boot, holder.heartbeat_at)
                    elif watched != (holder.boot, holder.heartbeat_at):
                        raise InstanceInUse(self._in_use(holder, age))
                    await asyncio.sleep(WATCH_POLL_S)
                    continue
                why = (f"pid {holder.pid} is gone" if alive is False
                       else f"its heartbeat stopped {age:.1f} s ago")
            released = await self._run_db(self.store.take, self._record(), holder.boot if holder else None)
            if released is not None:
                break
            watched = None  # someone else took the id meanwhile: judge the new holder
        self.held = True
        _LOCAL[self.boot] = self
        if holder is not None:
            log.warning("instance id %s: the previous process (pid %s on %s) stopped without releasing it (%s); "
                        "took over %s", self.instance_id, holder.pid, holder.host, why, released)
        self._task = asyncio.create_task(self._beat(), name="instance-heartbeat")
        return released

    def _in_use(self, holder: InstanceRecord, age: float) -> str:
        return (f"instance id {self.instance_id!r} is in use by pid {holder.pid} on {holder.host} "
                f"(heartbeat {max(age, 0.0):.1f} s ago): stop that process, or give each process its own "
                f"instance_id (GATEWAY__INSTANCE_ID)")

    async def _beat(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                held = await self._run_db(self.store.beat, self.instance_id, self.boot)
            except Exception as exc:  # the database is away: keep trying; leases wait with us
                if not failing:
                    log.warning("instance heartbeat failed (%s); retrying", type(exc).__name__)
                failing = True
                continue
            failing = False
            if not held:
                self.held = False
                holder = None
                with contextlib.suppress(Exception):
                    holder = await self._run_db(self.store.get, self.instance_id)
                self._on_lost(holder)
                return

    async def release(self) -> Released | None:
        """Stops the heartbeat and gives the id up with every lease and claim it holds (call once
        nothing of this process holds a lease any more). A no-op unless ``acquire`` succeeded."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if not self.held:
            return None
        self.held = False
        _LOCAL.pop(self.boot, None)
        try:
            released = await self._run_db(self.store.release, self.instance_id, self.boot)
        except Exception as exc:  # the database is away: the leases expire after bus.lease_s instead
            log.warning("instance id %s not released (%s); its leases expire on their own", self.instance_id,
                        type(exc).__name__)
            return None
        if released is not None and (released.lanes or released.replies or released.runs):
            log.info("instance id %s released: %s", self.instance_id, released)
        return released


def exit_now(instance_id: str) -> Callable[[InstanceRecord | None], None]:
    """The default ``on_lost``: logs who took ``instance_id`` and ends the process with
    ``EXIT_CODE`` at once, like a crash (a graceful stop would release leases that are the new
    holder's now; nothing is lost: the new holder resumes whatever this process left)."""

    def lost(holder: InstanceRecord | None) -> None:
        who = f"pid {holder.pid} on {holder.host}" if holder is not None else "another process"
        log.critical("instance id %r was taken over by %s while this process ran (its heartbeat stalled "
                     "for over %.0f s); stopping now", instance_id, who, STALE_AFTER_S)
        logging.shutdown()
        os._exit(EXIT_CODE)

    return lost
