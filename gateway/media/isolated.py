"""Decoding and reading files in child processes with a time limit and a memory cap.

A file a stranger sends is decoded by Pillow, pypdf, python-docx and openpyxl. Some small files
cost hours or gigabytes there: a 4.6 KB PDF drawing a form 5,000 times (pypdf parses it each time),
a progressive JPEG repeating its last scan a thousand times (libjpeg decodes every one), a 97 KB
XLSX of 24 million empty cells (7 GB of memory). In the gateway's own process that held a turn
thread for hours or got the process OOM-killed. ``MediaReaders`` runs ``prepare_image``,
``thumbnail`` and ``extract`` in a few long-lived child processes instead (fresh interpreters
started on first use, with no secret in their environment, each with ``RLIMIT_AS`` =
``memory_bytes``): a call that takes longer than ``timeout_s``
has its process killed (a new one is started for the next call), one that runs out of memory gets
``MemoryError`` there; either way the caller gets a ``MediaError`` whose message says why, and the
message is answered with that note. A child's answer is unpickled knowing only the result types
(a child a decoder exploit took over cannot run code in the gateway through it), and a child exits
when the gateway dies. At most ``processes`` files are read at once; more wait, at
most ``timeout_s`` (then they get a note too: one user's flood of files cannot hold everyone's).

``processes = 0`` reads in the calling thread (no isolation; tests of the readers themselves).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import queue
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

from gateway.core.errors import MediaError
from gateway.media.extract import Extracted
from gateway.media.images import Rendition

log = logging.getLogger("gateway.media")

TOO_MUCH_MEMORY = "reading it needs more memory than this gateway gives one file"


def _call(kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from gateway.media import extract, images

    functions: dict[str, Callable[..., Any]] = {"prepare_image": images.prepare_image,
                                                "thumbnail": images.thumbnail, "extract": extract.extract}
    return functions[kind](*args, **kwargs)


def serve(fd: int, memory_bytes: int) -> None:
    """A child's loop on the socket ``fd``: one ``(kind, args, kwargs)`` at a time, answered
    ``("ok", result)`` or ``("media", message)``; ends when the parent's end closes."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    parent = os.getppid()

    def orphaned() -> None:  # the gateway was killed (-9) while this one read a hostile file: stop too
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphaned, name="parent-watch", daemon=True).start()
    from gateway.media import extract, images  # noqa: F401  (imported once, before the first file)

    conn = Connection(fd)
    while True:
        try:
            kind, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer: tuple[str, Any] = ("ok", _call(kind, args, kwargs))
        except MediaError as exc:
            answer = ("media", exc.user_message)
        except MemoryError:
            answer = ("media", TOO_MUCH_MEMORY)
        except Exception as exc:  # a reader's own fault on a hostile file: a note, not a crash
            answer = ("media", f"it could not be read ({type(exc).__name__})")
        try:
            conn.send(answer)
        except MemoryError:
            conn.send(("media", TOO_MUCH_MEMORY))


class _Answers(pickle.Unpickler):
    """Unpickles a child's answer allowing only the result types: a child that a hostile file
    took over (a decoder exploit) must not run code in the gateway through a crafted pickle."""

    ALLOWED: ClassVar[dict[tuple[str, str], type]] = {("gateway.media.images", "Rendition"): Rendition,
                                                      ("gateway.media.extract", "Extracted"): Extracted}

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"a reader answered with {module}.{name}") from None


def _answer(data: bytes) -> tuple[str, Any]:
    answer = _Answers(io.BytesIO(data)).load()
    if not (isinstance(answer, tuple) and len(answer) == 2 and answer[0] in ("ok", "media")):
        raise pickle.UnpicklingError("a reader's answer is not (status, value)")
    return answer


_CHILD_CODE = "import sys; from gateway.media.isolated import serve; serve(int(sys.argv[1]), int(sys.argv[2]))"
_ENV_KEPT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "VIRTUAL_ENV")


class _Child:
    """One child process (a fresh interpreter, no secrets in its environment) and the parent's end
    of its socket."""

    def __init__(self, memory_bytes: int) -> None:
        parent_end, child_end = socket.socketpair()
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the gateway package
        env = {k: v for k, v in os.environ.items() if k in _ENV_KEPT}
        env["PYTHONPATH"] = os.pathsep.join([root, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]).rstrip(
            os.pathsep)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _CHILD_CODE, str(child_end.fileno()), str(memory_bytes)],
                pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, env=env, close_fds=True)
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        self.conn = Connection(parent_end.detach())

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.conn.close()
        if self.alive():
            self.process.kill()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            pass


class MediaReaders:
    """``prepare_image``, ``thumbnail`` and ``extract`` (same arguments and results as
    ``gateway.media.images`` / ``gateway.media.extract``) run in child processes (module doc).

    Args:
        processes: children at most (files read at once); 0: in the calling thread.
        timeout_s: longest one file may take; its child is then killed.
        memory_bytes: each child's address-space limit (``RLIMIT_AS``).

    Every method raises ``MediaError`` for a file that cannot be used, including one that took
    too long or too much memory, and for a child that died.
    """

    def __init__(self, processes: int = 2, timeout_s: float = 30.0, memory_bytes: int = 1 << 30) -> None:
        self.processes = processes
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self._slots: queue.LifoQueue[_Child | None] = queue.LifoQueue()
        for _ in range(processes):
            self._slots.put(None)
        self._closed = threading.Event()
        self._live: set[_Child] = set()  # every started child, busy or not (close kills them all)
        self._live_lock = threading.Lock()

    def prepare_image(self, data: bytes, max_side: int = 2048, max_bytes: int = 3_500_000) -> Rendition:
        """``images.prepare_image`` in a child."""
        return self._run("prepare_image", (data, max_side, max_bytes), {})

    def thumbnail(self, data: bytes, side: int = 256) -> Rendition:
        """``images.thumbnail`` in a child."""
        return self._run("thumbnail", (data, side), {})

    def extract(self, data: bytes, *, name: str | None = None, mime: str | None = None,
                max_tokens: int = 8000) -> Extracted:
        """``extract.extract`` in a child."""
        return self._run("extract", (data,), {"name": name, "mime": mime, "max_tokens": max_tokens})

    def _run(self, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.processes == 0:
            try:
                return _call(kind, args, kwargs)
            except MediaError:
                raise
            except MemoryError:
                raise MediaError(TOO_MUCH_MEMORY) from None
            except Exception as exc:
                raise MediaError(f"it could not be read ({type(exc).__name__})") from exc
        if self._closed.is_set():
            raise MediaError("the gateway is stopping")
        try:  # every reader busy for a whole file's time: other files (a flood of them) go first
            child = self._slots.get(timeout=self.timeout_s)
        except queue.Empty:
            raise MediaError("the gateway is busy reading other files; please send it again in a minute") from None
        try:
            if child is None or not child.alive():
                child = _Child(self.memory_bytes)
                with self._live_lock:
                    self._live.add(child)
            try:
                child.conn.send((kind, args, kwargs))
                if not child.conn.poll(self.timeout_s):
                    log.warning("media reader: %s took longer than %g s; its process was killed", kind, self.timeout_s)
                    self._discard(child)
                    child = None
                    raise MediaError(f"reading it took longer than {self.timeout_s:g} s, so it was given up")
                status, value = _answer(child.conn.recv_bytes())
            except (EOFError, OSError, BrokenPipeError, pickle.UnpicklingError) as exc:
                log.warning("media reader: the process reading a file (%s) died: %s", kind, type(exc).__name__)
                if child is not None:
                    self._discard(child)
                child = None
                raise MediaError("it could not be read (its reader stopped)") from None
            if status != "ok":
                raise MediaError(str(value))
            return value
        finally:
            if child is not None and self._closed.is_set():
                self._discard(child)
                child = None
            self._slots.put(child)

    def _discard(self, child: _Child) -> None:
        child.kill()
        with self._live_lock:
            self._live.discard(child)

    def close(self) -> None:
        """Stops the children, busy ones too (their calls get ``MediaError``); later calls are
        refused."""
        self._closed.set()
        with self._live_lock:
            children, self._live = list(self._live), set()
        for child in children:
            child.kill()

    def pids(self) -> list[int]:
        """The children's process ids (started ones; tests and ``/metrics``)."""
        with self._live_lock:
            return [child.process.pid for child in self._live if child.alive()]

    def __repr__(self) -> str:
        return f"MediaReaders(processes={self.processes}, timeout_s={self.timeout_s:g}, pid={os.getpid()})"
