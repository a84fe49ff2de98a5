"""Files upload v2 for ``FakeSlack``: ``files.getUploadURLExternal``, the upload URL, and
``files.completeUploadExternal`` (PLATFORMS.md §2.3, what slack-sdk's ``files_upload_v2`` does).

Strict like Slack: ``filename`` and a positive integer ``length`` are required
(``invalid_arguments``); a file is at most 1 GB (``file_too_large``); the bytes POSTed to the upload
URL must be exactly ``length`` long (else HTTP 400, nothing stored); completion needs ``files`` as a
JSON array of ``{"id", "title"?}`` whose ids were issued and uploaded (``file_not_found``), an
existing ``channel_id`` (``channel_not_found``), and shares each file as one bot message in the
channel, in ``thread_ts`` when given, with ``initial_comment`` as its text. A file never completed is
never visible.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tests.fakes.holds import Holds

if TYPE_CHECKING:
    from tests.fakes.slack import FakeSlack

MAX_FILE_BYTES = 1_000_000_000
JSON = dict[str, Any]


class SlackUploads:
    """The upload side of one ``FakeSlack``. ``files`` maps file id -> ``{"id", "filename",
    "length", "data", "sha256", "uploaded", "shared": [(channel, ts)]}``; ``holds`` holds the answer
    of the upload POST (``"upload"``) or of a method by name."""

    def __init__(self, fake: FakeSlack) -> None:
        self.fake = fake
        self.files: dict[str, JSON] = {}
        self.holds = Holds()
        self.upload_posts: list[JSON] = []
        """Every POST to an upload URL: ``{"file_id", "size", "status", "authorization"}``."""
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def methods(self) -> dict[str, Any]:
        return {"files.getUploadURLExternal": self._get_upload_url,
                "files.completeUploadExternal": self._complete}

    def shared(self, channel: str | None = None) -> list[JSON]:
        """Files shared by completion, in order: ``{"id", "filename", "size", "sha256", "channel",
        "thread_ts", "ts", "initial_comment", "title"}``."""
        with self._lock:
            out = [dict(s) for f in self.files.values() for s in f["shares"]]
        out.sort(key=lambda s: s["ts"])
        return [s for s in out if channel is None or s["channel"] == channel]

    def _get_upload_url(self, params: JSON) -> JSON:
        from tests.fakes.slack import SlackError

        filename, length = params.get("filename"), str(params.get("length") or "")
        if not filename or not length.isdigit() or int(length) <= 0:
            raise SlackError("invalid_arguments")
        if int(length) > MAX_FILE_BYTES:
            raise SlackError("file_too_large")
        file_id = f"F0FAKE{next(self._ids):05d}"
        with self._lock:
            self.files[file_id] = {"id": file_id, "filename": str(filename), "length": int(length), "data": None,
                                   "sha256": None, "shares": []}
        return {"upload_url": f"{self.fake.url}/upload/v1/{file_id}", "file_id": file_id}

    async def handle_upload(self, request: web.Request) -> web.StreamResponse:
        """``POST /upload/v1/{file_id}``: the raw bytes (or a multipart ``file`` field)."""
        file_id = request.match_info["file_id"]
        if request.content_type == "multipart/form-data":
            form = await request.post()
            field = form.get("file")
            data = field.file.read() if isinstance(field, web.FileField) else b""
        else:
            data = await request.read()
        with self._lock:
            entry = self.files.get(file_id)
            status = 404 if entry is None else 400 if len(data) != entry["length"] else 200
            if status == 200 and entry is not None:
                entry.update(data=data, sha256=hashlib.sha256(data).hexdigest())
            self.upload_posts.append({"file_id": file_id, "size": len(data), "status": status,
                                      "authorization": request.headers.get("Authorization")})
        if status == 200:
            await self.holds.gate("upload")
        return web.Response(status=status, text=f"OK - {len(data)}" if status == 200 else "bad upload")

    def _complete(self, params: JSON) -> JSON:
        from tests.fakes.slack import SlackError

        try:
            wanted = json.loads(str(params.get("files") or ""))
        except ValueError:
            raise SlackError("invalid_arguments") from None
        if not isinstance(wanted, list) or not wanted or not all(isinstance(f, dict) and f.get("id") for f in wanted):
            raise SlackError("invalid_arguments")
        channel = str(params.get("channel_id") or "")
        with self._lock:
            entries = [self.files.get(str(f["id"])) for f in wanted]
        if any(e is None or e["data"] is None for e in entries):
            raise SlackError("file_not_found")
        if channel and channel not in self.fake.channels:
            raise SlackError("channel_not_found")
        out = []
        for spec, entry in zip(wanted, entries, strict=True):
            assert entry is not None
            title = str(spec.get("title") or entry["filename"])
            info = {"id": entry["id"], "name": entry["filename"], "title": title, "size": entry["length"]}
            if channel:
                self._share(entry, info, channel, params)
            out.append(info)
        return {"files": out}

    def _share(self, entry: JSON, info: JSON, channel: str, params: JSON) -> None:
        fake = self.fake
        thread_ts = str(params["thread_ts"]) if params.get("thread_ts") else None
        comment = str(params.get("initial_comment") or "")
        with fake._lock:
            ts = fake._new_ts()
            msg: JSON = {"type": "message", "subtype": "file_share", "user": fake.bot_user_id, "bot_id": fake.bot_id,
                         "text": comment, "ts": ts, "team": fake.team_id, "files": [dict(info)]}
            if thread_ts:
                msg["thread_ts"] = thread_ts
            fake.channels[channel][ts] = msg
        with self._lock:
            entry["shares"].append({"id": entry["id"], "filename": entry["filename"], "size": entry["length"],
                                    "sha256": entry["sha256"], "channel": channel, "thread_ts": thread_ts, "ts": ts,
                                    "initial_comment": comment or None, "title": info["title"],
                                    "time": time.time()})
