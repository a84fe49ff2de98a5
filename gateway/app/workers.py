"""``gateway run --workers N``: one supervisor process and N gateway processes on one database,
so one machine uses all its cores.

Each worker is ``python -m gateway run`` started by the supervisor with ``--worker K`` (K = 1..N):
the instance id ``<id>-w<K>`` (``worker_instance_id``: ``instance_id`` or the default id, plus
the worker's number, so a restarted worker takes its predecessor's leases over at once) and
``http.reuse_port`` (``SO_REUSEPORT``: every worker listens on ``http.port`` and the kernel spreads
new connections over them; each webhook is stored into the shared inbox by the worker that
accepted it). Everything else is what several instances on one PostgreSQL already do: lane leases,
outbox claims, the Telegram poller lease (one worker polls), scheduled-fire claims.

The supervisor (``Supervisor.run``):

- migrates the database once, then starts the workers;
- restarts a worker that exits (crash, ``kill -9``, a lost instance id) after a backoff
  (``RESTART_BACKOFF_S``, doubling to ``RESTART_BACKOFF_MAX_S``, back to the start once a worker
  stayed up ``STABLE_AFTER_S``); a worker that exits with status 2 before it was ever ready (a
  configuration or start-up error, the same for every worker) stops them all and the supervisor
  exits 2;
- on SIGTERM, SIGINT or SIGHUP forwards SIGTERM to every worker (each stops gracefully within
  ``stop_timeout_s``), waits for them (SIGKILL after ``stop_timeout_s`` + ``KILL_GRACE_S``) and
  exits 0.

A worker tells the supervisor it is ready by writing one byte to the pipe named by
``--supervisor-fd`` once it has started (``/readyz`` 200); it stops gracefully when its supervisor is gone
(``watch_supervisor``).

SQLite is refused with more than one worker (``check_workers``): its single write lock makes more
processes wait for each other, not answer faster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from sqlalchemy.engine import make_url

from gateway.core.config import GatewayConfig
from gateway.core.errors import ConfigError
from gateway.ops.instance import default_instance_id

log = logging.getLogger("gateway.app.workers")

MAX_WORKERS = 64
RESTART_BACKOFF_S = 0.5
"""Wait before restarting a worker that exited; doubles with each exit in a row."""
RESTART_BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0
"""A worker up this long resets its backoff."""
KILL_GRACE_S = 15.0
"""After ``stop_timeout_s`` a worker has this long to close before it is killed."""
POLL_S = 0.1
STARTUP_ERROR = 2
"""``gateway run``'s exit status for a configuration or start-up error (also the supervisor's)."""


def worker_instance_id(config: GatewayConfig, worker: int) -> str:
    """``<instance_id or the default id>-w<worker>``: stable per worker number, distinct per worker."""
    return f"{config.instance_id or default_instance_id(config.database.url)}-w{worker}"


def check_workers(config: GatewayConfig, workers: int) -> None:
    """Raises ``ConfigError`` (one line) when ``workers`` processes cannot share this configuration:
    fewer than 1 or more than ``MAX_WORKERS``, or several on SQLite."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"workers (--workers or the workers key) must be between 1 and {MAX_WORKERS}, not {workers}")
    if workers > 1 and make_url(config.database.url).get_backend_name() == "sqlite":
        raise ConfigError(f"{workers} workers (--workers or the workers key) need PostgreSQL (database.url): "
                          "SQLite has one write lock, "
                          "so more processes wait for each other instead of answering faster; "
                          "run one process on SQLite")


def worker_config(config: GatewayConfig, worker: int) -> GatewayConfig:
    """The configuration worker ``worker`` runs with: its own instance id, ``http.reuse_port`` on."""
    return config.model_copy(update={
        "instance_id": worker_instance_id(config, worker),
        "http": config.http.model_copy(update={"reuse_port": True}),
    })


def reserve_port(host: str) -> socket.socket:
    """A socket bound (not listening) to a free port of ``host`` with ``SO_REUSEPORT``: the
    supervisor holds it so ``http.port = 0`` means one port for every worker, and restarts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock


@dataclass
class Worker:
    """One worker process as the supervisor sees it."""

    number: int
    proc: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None
    started_at: float = 0.0
    ready: bool = False
    ever_ready: bool = False
    exits_in_a_row: int = 0
    restart_at: float | None = None


class Supervisor:
    """Starts and watches ``workers`` gateway processes (see the module doc).

    Args:
        config: the loaded configuration (checked with ``check_workers``).
        workers: how many processes.
        argv: the command line that runs one worker before ``--worker K --supervisor-fd FD``
            are added (default: this interpreter, ``-m gateway``, ``--config`` if given, ``run``).
        env: extra environment for the workers.
    """

    def __init__(self, config: GatewayConfig, workers: int, argv: list[str], env: dict[str, str] | None = None) -> None:
        check_workers(config, workers)
        self.config = config
        self.argv = argv
        self.env = {**os.environ, **(env or {})}
        self.workers = [Worker(k) for k in range(1, workers + 1)]
        self.stopping = False
        self._reserved: socket.socket | None = None

    def _prepare(self) -> None:
        from gateway.store.db import create_db_engine, upgrade

        engine = create_db_engine(self.config.database.url)
        try:
            upgrade(engine)  # once here, instead of N workers queueing on the migration lock
        finally:
            engine.dispose()
        if self.config.http.port == 0:
            self._reserved = reserve_port(self.config.http.host)
            self.env["GATEWAY__HTTP__PORT"] = str(self._reserved.getsockname()[1])
        web_key = self.config.web.secret_env
        if self.config.web.enabled and not self.config.secret(web_key):
            # One cookie key for every worker: a web chat's next request may reach another worker.
            self.env[web_key] = secrets.token_urlsafe(32)

    def _start(self, worker: Worker) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        try:
            worker.proc = subprocess.Popen(
                [*self.argv, "--worker", str(worker.number), "--supervisor-fd", str(write_fd)],
                env=self.env, pass_fds=(write_fd,))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        worker.ready_fd = read_fd
        worker.started_at = time.monotonic()
        worker.ready = False
        worker.restart_at = None
        log.info("worker %d started (pid %d, instance id %s)", worker.number, worker.proc.pid,
                 worker_instance_id(self.config, worker.number))

    def _read_ready(self, worker: Worker) -> None:
        if worker.ready or worker.ready_fd is None:
            return
        with contextlib.suppress(BlockingIOError):
            if os.read(worker.ready_fd, 1):
                worker.ready = worker.ever_ready = True
                log.info("worker %d ready", worker.number)
                if all(w.ready for w in self.workers):
                    log.info("all %d workers ready", len(self.workers))

    def _close_pipe(self, worker: Worker) -> None:
        if worker.ready_fd is not None:
            os.close(worker.ready_fd)
            worker.ready_fd = None

    def _exited(self, worker: Worker, status: int) -> int | None:
        """Handles a worker's exit; returns the supervisor's exit status when it must stop all."""
        self._read_ready(worker)
        self._close_pipe(worker)
        worker.proc = None
        if self.stopping:
            return None
        if status == STARTUP_ERROR and not worker.ever_ready:
            log.error("worker %d could not start (exit status 2, the error is above); stopping the others",
                      worker.number)
            return STARTUP_ERROR
        lived = time.monotonic() - worker.started_at
        worker.exits_in_a_row = 1 if lived >= STABLE_AFTER_S else worker.exits_in_a_row + 1
        wait = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (worker.exits_in_a_row - 1))
        how = f"signal {-status}" if status < 0 else f"status {status}"
        log.warning("worker %d exited (%s) after %.1f s; restarting it in %.1f s", worker.number, how, lived, wait)
        worker.restart_at = time.monotonic() + wait
        return None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if not self.stopping:
            log.info("%s: stopping %d workers", signal.Signals(signum).name, len(self.workers))
        self.stopping = True

    def _terminate_all(self) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(signal.SIGTERM)

    def _wait_all(self) -> None:
        deadline = time.monotonic() + self.config.stop_timeout_s + KILL_GRACE_S
        for worker in self.workers:
            if worker.proc is None:
                continue
            try:
                worker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not stop within stop_timeout_s + %.0f s; killing it", worker.number,
                            KILL_GRACE_S)
                worker.proc.kill()
                worker.proc.wait()
            self._close_pipe(worker)
            worker.proc = None

    def run(self, install_signals: bool = True) -> int:
        """Runs until SIGTERM, SIGINT or SIGHUP (returns 0 once every worker has stopped) or a
        start-up error of a worker (returns 2). Raises what migrating the database raises."""
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, self._on_signal)
        self._prepare()
        status = 0
        try:
            for worker in self.workers:
                self._start(worker)
            while not self.stopping:
                for worker in self.workers:
                    self._read_ready(worker)
                    if worker.proc is not None and (code := worker.proc.poll()) is not None:
                        fatal = self._exited(worker, code)
                        if fatal is not None:
                            status = fatal
                            self.stopping = True
                            break
                    if not self.stopping and worker.proc is None and worker.restart_at is not None \
                            and time.monotonic() >= worker.restart_at:
                        self._start(worker)
                time.sleep(POLL_S)
        finally:
            self.stopping = True
            self._terminate_all()
            self._wait_all()
            if self._reserved is not None:
                self._reserved.close()
        log.info("all workers stopped")
        return status


def worker_argv(config_path: str | None) -> list[str]:
    """The command that runs one worker: this interpreter, ``-m gateway [--config PATH] run``."""
    return [sys.executable, "-m", "gateway", *(["--config", config_path] if config_path else []), "run"]


def signal_ready(fd: int | None) -> None:
    """Tells the supervisor (pipe ``fd``) that this worker has started; a no-op without one."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.write(fd, b"1")
    with contextlib.suppress(OSError):
        os.close(fd)


async def watch_supervisor(on_gone: Callable[[], None], poll_s: float = 1.0) -> None:
    """Calls ``on_gone`` (a graceful stop) once this worker's supervisor is gone (re-parented)."""
    import asyncio

    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(poll_s)
    log.warning("the supervisor (pid %d) is gone; stopping", parent)
    on_gone()
