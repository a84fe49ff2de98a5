"""Image and file uploads for ``FakeFeishu``: ``POST /open-apis/im/v1/images`` and
``POST /open-apis/im/v1/files`` (multipart, tenant token), and the check that a message's
``image_key`` / ``file_key`` was issued by them.

Strict like Feishu (open API im/v1 image/create, file/create): the tenant token must be valid
(99991663 otherwise); ``image_type`` is ``message`` or ``avatar`` and ``file_type`` one of opus,
mp4, pdf, doc, xls, ppt, stream (234001 otherwise); an empty upload is refused (234010); an image
is at most 10 MB and a file 30 MB (234006); an image must be a picture Feishu reads (234011) within
12000 x 12000 pixels (GIF 2000 x 2000; 234007). An ``image`` message (or a ``post`` ``img``
element) must name an ``image_key`` uploaded with ``image_type=message``, a ``file`` message a
``file_key`` this app uploaded (230001 otherwise).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import threading
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web
from PIL import Image

from tests.fakes.holds import Holds

if TYPE_CHECKING:
    from tests.fakes.feishu import FakeFeishu

IMAGE_MAX_BYTES = 10 * 1000 * 1000
FILE_MAX_BYTES = 30 * 1000 * 1000
FILE_TYPES = {"opus", "mp4", "pdf", "doc", "xls", "ppt", "stream"}
JSON = dict[str, Any]


class FeishuUploads:
    """The upload side of one ``FakeFeishu``: ``images`` (image_key -> ``{"image_type", "size",
    "sha256", "width", "height"}``), ``files`` (file_key -> ``{"file_type", "file_name", "size",
    "sha256"}``), ``holds`` (``"images"`` / ``"files"``: the upload takes effect, its answer waits)."""

    def __init__(self, fake: FakeFeishu) -> None:
        self.fake = fake
        self.images: dict[str, JSON] = {}
        self.files: dict[str, JSON] = {}
        self.holds = Holds()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/open-apis/im/v1/images", self._image), web.post("/open-apis/im/v1/files", self._file)]

    def reset(self) -> None:
        with self._lock:
            self.images.clear()
            self.files.clear()

    def check_keys(self, msg_type: str, content: Any) -> None:
        """Raises the fake's ``ApiError`` 230001 when a message names a key no upload issued."""
        from tests.fakes.feishu import ApiError

        keys: list[tuple[str, str]] = []
        if msg_type == "image":
            keys.append(("image", str(content.get("image_key"))))
        elif msg_type == "file":
            keys.append(("file", str(content.get("file_key"))))
        elif msg_type == "post":
            for body in (v for v in content.values() if isinstance(v, dict)):
                for row in body.get("content") or []:
                    keys += [("image", str(e.get("image_key"))) for e in row
                             if isinstance(e, dict) and e.get("tag") == "img"]
        with self._lock:
            for kind, key in keys:
                known = self.images.get(key) if kind == "image" else self.files.get(key)
                if known is None or (kind == "image" and known["image_type"] != "message"):
                    raise ApiError(400, 230001, f"Your request contains an invalid request parameter: {kind}_key "
                                                f"{key[:40]} was not uploaded by this app for messages")

    async def _image(self, request: web.Request) -> web.Response:
        return await self._upload(request, "images")

    async def _file(self, request: web.Request) -> web.Response:
        return await self._upload(request, "files")

    async def _upload(self, request: web.Request, route: str) -> web.Response:
        from tests.fakes.feishu import INVALID_TOKEN, ApiError, Call

        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        call = Call(time.monotonic(), route, "POST", request.path, dict(request.query), None, token=token)
        try:
            with self.fake._lock:
                expiry = self.fake._tokens.get(token or "")
            if expiry is None or expiry < time.time():
                raise ApiError(self.fake.invalid_token_status, INVALID_TOKEN,
                               "Invalid access token for authorization. Please make a request with token attached.")
            fault = self.fake._fault(route)
            if fault is not None:
                raise fault
            form = await request.post()
            fields = {k: v for k, v in form.items() if isinstance(v, str)}
            upload = form.get("image" if route == "images" else "file")
            data = upload.file.read() if isinstance(upload, web.FileField) else b""
            call.body = {**fields, "size": len(data)}
            data_out = self._store_image(fields, data) if route == "images" else self._store_file(fields, data)
        except ApiError as exc:
            call.status, call.code = exc.status, exc.code
            self.fake._record(call)
            return exc.response()
        call.content = data_out
        self.fake._record(call)
        await self.holds.gate(route)
        return web.json_response({"code": 0, "msg": "success", "data": data_out})

    def _store_image(self, fields: dict[str, str], data: bytes) -> JSON:
        from tests.fakes.feishu import ApiError

        if fields.get("image_type") not in ("message", "avatar"):
            raise ApiError(400, 234001, "Invalid request param: image_type")
        if not data:
            raise ApiError(400, 234010, "File's size can't be 0.")
        if len(data) > IMAGE_MAX_BYTES:
            raise ApiError(400, 234006, "The file size exceed the max value.")
        try:
            with Image.open(io.BytesIO(data)) as image:
                width, height, fmt = image.size[0], image.size[1], image.format
        except Exception:
            raise ApiError(400, 234011, "Can't regonnize the image format.") from None
        side = 2000 if fmt == "GIF" else 12000
        if width > side or height > side:
            raise ApiError(400, 234007, "The image resolution exceeds the limit.")
        key = f"img_v3_fake{next(self._ids):08d}"
        with self._lock:
            self.images[key] = {"image_type": fields["image_type"], "size": len(data),
                                "sha256": hashlib.sha256(data).hexdigest(), "width": width, "height": height}
        return {"image_key": key}

    def _store_file(self, fields: dict[str, str], data: bytes) -> JSON:
        from tests.fakes.feishu import ApiError

        if fields.get("file_type") not in FILE_TYPES:
            raise ApiError(400, 234001, "Invalid request param: file_type")
        if not fields.get("file_name"):
            raise ApiError(400, 234001, "Invalid request param: file_name")
        if not data:
            raise ApiError(400, 234010, "File's size can't be 0.")
        if len(data) > FILE_MAX_BYTES:
            raise ApiError(400, 234006, "The file size exceed the max value.")
        key = f"file_v3_fake{next(self._ids):08d}"
        with self._lock:
            self.files[key] = {"file_type": fields["file_type"], "file_name": fields["file_name"], "size": len(data),
                               "sha256": hashlib.sha256(data).hexdigest()}
        return {"file_key": key}
