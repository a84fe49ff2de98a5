"""The blob store: content-addressed bytes of the files users send (and the bot sends back).

API (``gateway.core.ports.BlobStore``; synchronous, thread-safe, call it from a worker thread or
through ``asyncio.to_thread`` on the main loop):

* ``put(data, mime_type) -> BlobRef``: stores ``data`` under its SHA-256 (lowercase hex) and
  returns ``BlobRef(sha256, size, mime_type)``. Idempotent: equal bytes are stored once, and a
  concurrent ``put`` of the same bytes from another thread or instance is harmless.
* ``get(ref) -> bytes``: the bytes of a ``BlobRef`` or of a sha256 string; raises
  ``gateway.core.errors.BlobMissing`` when they are gone (retention, ``/forget_files``). The bytes
  are checked against the digest on the way out (a torn or altered file is ``BlobMissing`` too).
* ``exists(sha256) -> bool``; ``delete(sha256s, stored_before=None) -> int`` (blobs removed;
  missing ones ignored; with ``stored_before`` only those last stored before that time):
  callers delete only blobs no ``attachments`` row refers to (``gateway.media.index``).
* ``stored_before(cutoff) -> Iterator[str]``: the blobs last stored (``put``) before ``cutoff``:
  the candidates of the sweep of unreferenced blobs (``MediaIndex.collect_unreferenced``: a web
  upload never sent, a download whose turn crashed before it was recorded).
* ``path(ref) -> Path | None``: the file holding the blob (``FileBlobStore``: hand it to a tool or
  copy it into a workspace without reading it into memory), ``None`` for the database store.
* ``reads``: how many ``get`` calls this store answered (tests and ``/metrics`` count blob reads).

Two implementations, chosen by ``media.store`` (``open_blob_store``):

* ``FileBlobStore`` (``"files"``, the default): ``media.directory/ab/cd/abcd…`` (two levels of
  256 shards, so no directory holds more than a few thousand files). A write goes to a temporary
  file in the target directory, is fsynced and then renamed into place (``os.replace``: atomic on
  POSIX), so a reader sees the whole file or none, also across a crash. Several instances can
  share the directory (NFS, a volume), as the names never change once written.
* ``DatabaseBlobStore`` (``"database"``): the ``blobs`` table of the gateway's database, for
  several instances that share nothing else. On PostgreSQL ``bytea`` values are stored out of
  line (TOAST, ``STORAGE EXTERNAL``; one value may be up to 1 GB); the per-kind limits
  (``media.max_mb``, 50 MB at most by default) keep rows far below that. SQLite keeps the bytes in
  the database file. Either way every blob is one row read by primary key.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from sqlalchemy import ColumnElement, Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from gateway.core.config import MediaConfig
from gateway.core.errors import BlobMissing
from gateway.core.types import BlobRef
from gateway.store.db import read_tx, write_tx
from gateway.store.models import BlobRow, table
from gateway.store.sql import retry_locked

__all__ = ["BlobRef", "DatabaseBlobStore", "FileBlobStore", "digest", "open_blob_store"]

_blobs = table(BlobRow)
_HEX = frozenset("0123456789abcdef")


def digest(data: bytes) -> str:
    """The address of ``data``: lowercase hex SHA-256."""
    return hashlib.sha256(data).hexdigest()


def _sha(ref: BlobRef | str) -> str:
    sha = ref.sha256 if isinstance(ref, BlobRef) else ref
    if len(sha) != 64 or not set(sha) <= _HEX:
        raise BlobMissing(f"not a blob address: {sha[:80]!r}")
    return sha


class _Counted:
    def __init__(self) -> None:
        self.reads = 0
        self._lock = threading.Lock()

    def _counted(self) -> None:
        with self._lock:
            self.reads += 1


class FileBlobStore(_Counted):
    """Blobs as files under ``root`` (created if missing): ``root/ab/cd/<sha256>``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _file(self, sha: str) -> Path:
        return self.root / sha[:2] / sha[2:4] / sha

    def put(self, data: bytes, mime_type: str) -> BlobRef:
        """Stores ``data`` (atomic: temporary file, fsync, rename) unless it is there already."""
        sha = digest(data)
        target = self._file(sha)
        if target.exists():
            with contextlib.suppress(FileNotFoundError):
                os.utime(target)  # stored again now: not an old unreferenced blob (``stored_before``)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return BlobRef(sha, len(data), mime_type)

    def get(self, ref: BlobRef | str) -> bytes:
        """The bytes; ``BlobMissing`` when the file is gone or does not match its digest."""
        sha = _sha(ref)
        self._counted()
        try:
            data = self._file(sha).read_bytes()
        except FileNotFoundError:
            raise BlobMissing(f"blob {sha} is not in {self.root}") from None
        if digest(data) != sha:
            raise BlobMissing(f"blob {sha} is damaged (its bytes do not match the digest)")
        return data

    def exists(self, sha256: str) -> bool:
        return self._file(_sha(sha256)).is_file()

    def path(self, ref: BlobRef | str) -> Path | None:
        """The file holding the blob, or ``None`` when it is not stored."""
        file = self._file(_sha(ref))
        return file if file.is_file() else None

    def delete(self, sha256s: Iterable[str], stored_before: float | None = None) -> int:
        """Removes the blobs (missing ones ignored); with ``stored_before`` (Unix seconds) only
        those last stored before it (a blob stored again meanwhile is kept)."""
        removed = 0
        for sha in sha256s:
            file = self._file(_sha(sha))
            try:
                if stored_before is not None and file.stat().st_mtime >= stored_before:
                    continue
                file.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        return removed

    def stored_before(self, cutoff: float) -> Iterator[str]:
        """The digests of the blobs last stored before ``cutoff`` (Unix seconds; a file's
        modification time, which ``put`` renews), in no particular order."""
        for shard in self.root.glob("[0-9a-f][0-9a-f]/[0-9a-f][0-9a-f]"):
            with os.scandir(shard) as entries:
                for entry in entries:
                    name = entry.name
                    if len(name) != 64 or not set(name) <= _HEX:  # a temporary file of a write under way
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        if entry.stat().st_mtime < cutoff:
                            yield name


class DatabaseBlobStore(_Counted):
    """Blobs as rows of the ``blobs`` table on ``engine`` (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    @retry_locked
    def put(self, data: bytes, mime_type: str) -> BlobRef:
        """Inserts the row unless a row with the same digest exists (a concurrent insert of the
        same bytes loses the race harmlessly)."""
        sha = digest(data)
        ref = BlobRef(sha, len(data), mime_type)
        if self.exists(sha):
            with write_tx(self.engine) as conn:  # stored again now: not an old unreferenced blob
                conn.execute(update(_blobs).where(_blobs.c.sha256 == sha).values(created_at=time.time()))
            return ref
        try:
            with write_tx(self.engine) as conn:
                conn.execute(insert(_blobs).values(sha256=sha, size=len(data), mime_type=mime_type[:255],
                                                   data=data, created_at=time.time()))
        except IntegrityError:
            pass  # stored by someone else meanwhile: the same bytes
        return ref

    def get(self, ref: BlobRef | str) -> bytes:
        sha = _sha(ref)
        self._counted()
        with read_tx(self.engine) as conn:
            data = conn.execute(select(_blobs.c.data).where(_blobs.c.sha256 == sha)).scalar()
        if data is None:
            raise BlobMissing(f"blob {sha} is not in the blobs table")
        data = bytes(data)
        if digest(data) != sha:
            raise BlobMissing(f"blob {sha} is damaged (its bytes do not match the digest)")
        return data

    def exists(self, sha256: str) -> bool:
        with read_tx(self.engine) as conn:
            return conn.execute(select(_blobs.c.sha256).where(_blobs.c.sha256 == _sha(sha256))).first() is not None

    def path(self, ref: BlobRef | str) -> Path | None:
        """Always ``None``: database blobs have no file (read them with ``get``)."""
        return None

    @retry_locked
    def delete(self, sha256s: Iterable[str], stored_before: float | None = None) -> int:
        """Removes the rows (missing ones ignored); with ``stored_before`` (Unix seconds) only
        those last stored before it."""
        shas = [_sha(s) for s in sha256s]
        if not shas:
            return 0
        where: list[ColumnElement[bool]] = [_blobs.c.sha256.in_(shas)]
        if stored_before is not None:
            where.append(_blobs.c.created_at < stored_before)
        with write_tx(self.engine) as conn:
            return int(conn.execute(delete(_blobs).where(*where)).rowcount or 0)

    def stored_before(self, cutoff: float) -> Iterator[str]:
        """The digests of the blobs last stored before ``cutoff`` (Unix seconds)."""
        with read_tx(self.engine) as conn:
            found = list(conn.execute(select(_blobs.c.sha256).where(_blobs.c.created_at < cutoff)).scalars())
        yield from found


BlobBackend = FileBlobStore | DatabaseBlobStore


def open_blob_store(config: MediaConfig, engine: Engine) -> BlobBackend:
    """The store ``config.store`` names: files under ``config.directory`` or the ``blobs`` table."""
    if config.store == "database":
        return DatabaseBlobStore(engine)
    return FileBlobStore(config.directory)
