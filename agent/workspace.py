"""Workspace tools: ``read_file``, ``write_file``, ``list_files``, ``run_shell`` (issue 9).

Each session gets its own directory ``<root>/<session id>``; every path the model gives is
resolved the way the kernel would (symlinks followed, ``..`` applied after the symlink it
follows) and refused unless it stays inside that directory. Files are then opened one path
component at a time with ``O_NOFOLLOW`` from the workspace's directory descriptor, so a symlink
swapped in after the check (by a concurrent ``run_shell``, say) is refused, not followed. The permission
ladder decides which tools exist at all: ``read`` (read/list), ``write`` (+ write), ``shell``
(+ run_shell). Shell commands run through ``agent.sandbox`` (see there for what is isolated).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import unicodedata
from pathlib import Path
from typing import Literal

from agent.context import RunContext
from agent.disk_quota import disk_usage
from agent.sandbox import Sandbox
from agent.tools import Tool, tool

Permission = Literal["read", "write", "shell"]
LADDER: dict[str, tuple[str, ...]] = {
    "read": ("list_files", "read_file"),
    "write": ("list_files", "read_file", "write_file"),
    "shell": ("list_files", "read_file", "run_shell", "write_file"),
}
"""Tools offered at each rung of the permission ladder."""
_SAFE_ID = re.compile(r"[^A-Za-z0-9_-]")
_UNSAFE_NAME = re.compile(r"[^\w.+\- ()\[\],@=#]")
MAX_NAME_BYTES = 120
"""Longest file name ``safe_file_name`` returns, in UTF-8 bytes (file systems allow 255)."""


def safe_file_name(name: str | None, fallback: str = "file") -> str:
    """A name that is one plain file in one folder whatever the sender called it: the last path
    component only (``../../etc/passwd`` -> ``passwd``), Unicode normalised (NFC), control and
    format characters dropped, anything but letters, digits, spaces and ``. + - ( ) [ ] , @ = #``
    replaced by ``_``, no leading dot or dash (no hidden file, no shell option), at most
    ``MAX_NAME_BYTES`` bytes with the extension kept; ``fallback`` when nothing is left."""
    base = unicodedata.normalize("NFC", (name or "").replace("\\", "/").rsplit("/", 1)[-1])
    base = "".join(ch for ch in base if unicodedata.category(ch)[0] != "C")
    base = _UNSAFE_NAME.sub("_", " ".join(base.split())).lstrip(".-_ ")
    if not base or base in (".", ".."):
        base = fallback
    if len(base.encode()) > MAX_NAME_BYTES:
        stem, dot, ext = base.rpartition(".")
        ext = ext if dot and len(ext) <= 10 else ""
        stem = stem if ext else base
        room = MAX_NAME_BYTES - len(ext.encode()) - (1 if ext else 0)
        stem = stem.encode()[:room].decode(errors="ignore").rstrip()
        base = f"{stem}.{ext}" if ext else stem
    return base


class WorkspaceError(PermissionError):
    """A path outside the session's workspace (the message is shown to the model)."""


class WorkspaceFull(OSError):
    """The session's workspace is at its quota (``Workspace.max_disk_bytes``; the message is
    shown to the model)."""


class Workspace:
    """Per-session directories under ``root`` and the tools confined to them.

    Args:
        root: parent of all session workspaces (created on first use).
        permission: the rung of the ladder (``read`` | ``write`` | ``shell``).
        sandbox: runs ``run_shell`` commands.
        max_read_chars: ``read_file`` returns at most this many characters.
        max_write_bytes: ``write_file`` refuses larger contents.
        max_disk_bytes: what one session's workspace may take on disk (``agent.disk_quota``): a
            command is killed once over it; a write or an upload that would go over is refused.
    """

    def __init__(self, root: str | os.PathLike[str], permission: Permission = "read", *,
                 sandbox: Sandbox | None = None, max_read_chars: int = 50_000,
                 max_write_bytes: int = 1_000_000, max_disk_bytes: int = 1 << 30) -> None:
        self.root = Path(root).resolve()
        self.permission = permission
        self.sandbox = sandbox or Sandbox()
        self.max_read_chars = max_read_chars
        self.max_write_bytes = max_write_bytes
        self.max_disk_bytes = max_disk_bytes

    def check_room(self, session_id: str, size: int) -> None:
        """Raises ``WorkspaceFull`` when ``size`` more bytes would take the session's workspace past
        ``max_disk_bytes``."""
        used = disk_usage(self.directory(session_id), stop_above=self.max_disk_bytes)
        if used + size > self.max_disk_bytes:
            raise WorkspaceFull(f"the workspace is full ({used >> 20} MB of its {self.max_disk_bytes >> 20} MB "
                                f"quota; {size} more bytes do not fit): delete files first")

    def directory(self, session_id: str) -> Path:
        """The session's workspace, created on first use (``ValueError`` for an empty id)."""
        safe = _SAFE_ID.sub("_", session_id)
        if not safe:
            raise ValueError("a workspace needs a session id")
        path = self.root / safe
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def remove(self, session_id: str) -> bool:
        """Deletes the session's workspace with everything in it (``gateway sessions delete``);
        links inside are removed, never followed. Returns whether there was one."""
        safe = _SAFE_ID.sub("_", session_id)
        path = self.root / safe
        if not safe or not path.is_dir() or path.is_symlink():
            return False
        shutil.rmtree(path)
        return True

    def resolve(self, session_id: str, relative: str) -> Path:
        """``relative`` inside the session's workspace, symlinks resolved.

        Raises:
            WorkspaceError: the path (or a symlink on it) leads outside the workspace.
        """
        base = self.directory(session_id).resolve()
        target = (base / relative.lstrip("/") if not os.path.isabs(relative) else Path(relative)).resolve()
        if target != base and not target.is_relative_to(base):
            raise WorkspaceError(f"{relative!r} is outside the workspace; use paths relative to it")
        return target

    def open_inside(self, session_id: str, relative: str, flags: int, *, make_dirs: bool = False) -> int:
        """A file descriptor for the regular file ``relative`` inside the session's workspace
        (``os.open`` ``flags``).

        The path is checked with ``resolve`` and then opened component by component without
        following any symlink; ``make_dirs`` creates missing parent folders (mode 0700). The file
        itself is opened without blocking and must be a regular file: a FIFO made by ``run_shell``
        would otherwise hang the open until something wrote to it (or read from it).

        Raises:
            WorkspaceError: outside the workspace, a symlink appeared on the path meanwhile, or
                not a regular file (a FIFO, a socket, a folder).
            OSError: the file system's own errors (missing file, permissions).
        """
        base = self.directory(session_id).resolve()
        parts = self.resolve(session_id, relative).relative_to(base).parts
        if not parts:
            raise IsADirectoryError(f"{relative!r} is the workspace folder itself")
        parent = self._open_folder(base, parts[:-1], relative, make_dirs=make_dirs)
        try:
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise WorkspaceError(f"{relative!r}: a part of the path is a symlink or not a folder (it "
                                     "changed after the check); refused") from None
            if exc.errno == errno.ENXIO:  # O_WRONLY on a FIFO nobody reads
                raise WorkspaceError(f"{relative!r} is not a regular file; refused") from None
            raise
        finally:
            os.close(parent)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise WorkspaceError(f"{relative!r} is not a regular file; refused")
        os.set_blocking(fd, True)
        return fd

    def open_folder(self, session_id: str, relative: str) -> int:
        """A file descriptor (``O_DIRECTORY``) for the folder ``relative`` inside the session's
        workspace, opened component by component without following any symlink.

        Raises:
            WorkspaceError: outside the workspace, or a symlink or a file on the path.
            OSError: the file system's own errors (missing folder, permissions).
        """
        base = self.directory(session_id).resolve()
        parts = self.resolve(session_id, relative).relative_to(base).parts
        return self._open_folder(base, parts, relative)

    @staticmethod
    def _open_folder(base: Path, parts: tuple[str, ...], relative: str, *, make_dirs: bool = False) -> int:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts:
                if make_dirs:
                    try:
                        os.mkdir(part, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = next_fd
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise WorkspaceError(f"{relative!r}: a part of the path is a symlink or not a folder (it "
                                     "changed after the check); refused") from None
            raise
        return fd

    def save_file(self, session_id: str, folder: str, name: str, data: bytes) -> str:
        """Stores ``data`` as ``folder/<safe name>`` in the session's workspace (an upload the
        user sent, for ``read_file`` and the shell); returns its path relative to the workspace.

        ``name`` goes through ``safe_file_name``. A file of that name with the same bytes is
        reused; with other bytes the new one is called ``name (2).ext``, ``name (3).ext``...
        Never overwrites, never follows a symlink (``open_inside`` with ``O_EXCL``).

        Raises:
            WorkspaceError: ``folder`` leads outside the workspace.
            WorkspaceFull: the workspace has no room for ``data``.
            OSError: the file system's own errors (disk full, permissions).
        """
        safe = safe_file_name(name)
        self.check_room(session_id, len(data))
        stem, dot, ext = safe.rpartition(".")
        if not dot or not stem:
            stem, ext = safe, ""
        for attempt in range(1, 1000):
            candidate = safe if attempt == 1 else f"{stem} ({attempt})" + (f".{ext}" if ext else "")
            relative = f"{folder.strip('/')}/{candidate}"
            try:
                fd = self.open_inside(session_id, relative, os.O_WRONLY | os.O_CREAT | os.O_EXCL, make_dirs=True)
            except FileExistsError:
                if self._same_bytes(session_id, relative, data):
                    return relative
                continue
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            return relative
        raise FileExistsError(f"{folder}/{safe}: too many files of that name")

    def _same_bytes(self, session_id: str, relative: str, data: bytes) -> bool:
        try:
            fd = self.open_inside(session_id, relative, os.O_RDONLY)
        except OSError:
            return False
        with os.fdopen(fd, "rb") as handle:
            return stat.S_ISREG(os.fstat(handle.fileno()).st_mode) and handle.read(len(data) + 1) == data

    # -- the tools' functions (ctx first; the model never sees it) -------------------------------
    def read_file(self, ctx: RunContext, path: str) -> str:
        """Read a text file from your workspace.

        Args:
            path: file path relative to the workspace root.
        """
        target = self.resolve(ctx.session_id, path)
        if not target.is_file():
            return f"Error: {path} is not a file in the workspace."
        fd = self.open_inside(ctx.session_id, path, os.O_RDONLY)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return f"Error: {path} is not a file in the workspace."
        with open(fd, encoding="utf-8", errors="replace") as handle:
            text = handle.read(self.max_read_chars + 1)
        if len(text) > self.max_read_chars:
            text = text[: self.max_read_chars] + f"\n[truncated at {self.max_read_chars} characters]"
        return text

    def write_file(self, ctx: RunContext, path: str, content: str) -> str:
        """Create or overwrite a text file in your workspace (parent folders are created).

        Args:
            path: file path relative to the workspace root.
            content: the full new content of the file.
        """
        data = content.encode()
        if len(data) > self.max_write_bytes:
            return f"Error: content is {len(data)} bytes; the limit is {self.max_write_bytes}."
        target = self.resolve(ctx.session_id, path)
        try:
            self.check_room(ctx.session_id, len(data))
        except WorkspaceFull as exc:
            return f"Error: {exc}."
        # No symlink is followed on the way: one swapped in after the check is refused.
        fd = self.open_inside(ctx.session_id, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, make_dirs=True)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return f"Wrote {len(data)} bytes to {target.relative_to(self.directory(ctx.session_id).resolve())}."

    def list_files(self, ctx: RunContext, path: str = ".") -> str:
        """List files and folders in your workspace (recursive, at most 500 entries).

        Args:
            path: folder relative to the workspace root.
        """
        base = self.directory(ctx.session_id).resolve()
        start = self.resolve(ctx.session_id, path)
        if not start.is_dir():
            return f"Error: {path} is not a folder in the workspace."
        # Walked by descriptor (os.fwalk, no symlink followed): a folder swapped for a symlink
        # while the walk runs (a concurrent run_shell) is skipped, never listed through.
        try:
            top = self.open_folder(ctx.session_id, path)
        except (WorkspaceError, FileNotFoundError):
            return f"Error: {path} is not a folder in the workspace."
        prefix = start.relative_to(base)
        lines: list[str] = []
        try:
            for folder, dirs, files, folder_fd in os.fwalk(".", dir_fd=top):
                dirs.sort()
                for name in sorted(files):
                    try:
                        size = os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_size
                    except FileNotFoundError:  # deleted meanwhile
                        continue
                    lines.append(f"{os.path.normpath(os.path.join(prefix, folder, name))} ({size} bytes)")
                if len(lines) >= 500:
                    lines = [*lines[:500], "[more entries omitted]"]
                    break
        finally:
            os.close(top)
        return "\n".join(lines) or "(empty)"

    def run_shell(self, ctx: RunContext, command: str) -> str:
        """Run a shell command (/bin/sh) in your workspace folder; returns exit code and output.
        No network, limited CPU time, memory and output; state outside the workspace is not kept.

        Args:
            command: the shell command line.
        """
        result = self.sandbox.run(command, self.directory(ctx.session_id), max_disk_bytes=self.max_disk_bytes)
        return result.describe()

    def tools(self) -> list[Tool]:
        """The tools of this rung of the ladder."""
        made = {
            "read_file": tool(self.read_file, name="read_file", takes_context=True, side_effect="read",
                              idempotent=True),
            "list_files": tool(self.list_files, name="list_files", takes_context=True, side_effect="read",
                               idempotent=True),
            "write_file": tool(self.write_file, name="write_file", takes_context=True, side_effect="write",
                               idempotent=True),
            "run_shell": tool(self.run_shell, name="run_shell", takes_context=True, side_effect="write",
                              timeout_s=self.sandbox.timeout_s + 5, retries=0),
        }
        return [made[name] for name in LADDER[self.permission]]
