"""Web chat adapter (platform ``web``): a chat page at ``/`` served by the gateway's HTTP server.

Each browser gets a signed cookie with a random user id (its identity: platform ``web``, tenant
``web``); its chat id is that user id, so each browser user has one DM chat. The cookie is
SameSite=Lax, so arriving from a link on another site keeps the identity (Strict would send no
cookie and the page would make a new identity); a valid cookie is never replaced. POSTs stay
same-site by the ``X-Requested-With`` check. Messages go in with
``POST /web/messages`` and through the same inbox, bus and agent as every platform.

The page listens on ``GET /web/events`` (Server-Sent Events). Each stream sends:
- ``row``: the user and assistant messages of the conversation the user is in, read from the
  transcript (``ConversationReader``), so turns written from a linked Telegram/Slack/Feishu
  account appear too; ``reset`` when that conversation changes (``/new``, ``/resume``, ``/link``);
- ``reply``: what delivery sends to this chat (a streamed preview, edited in place by
  ``preview`` events, then its final text), and ``settled`` once that reply is in the
  transcript (the page then shows the transcript row instead); replies that are not in the
  transcript (command answers, approval prompts) stay on the page as they were sent;
- ``typing`` while a turn runs.
Every text is rendered to HTML on the server (``format``: raw HTML escaped); the page inserts only
that HTML and sets everything else with ``textContent``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from collections import Counter, deque
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode

from aiohttp import web
from itsdangerous import BadSignature, Signer

from adapters.web.format import INLINE_IMAGE_TYPES, attachment_html, markdown_html, plain_html
from adapters.web.inbound import MEDIA_TYPE, TENANT, WebInputError, client_id_of, message_from_post
from adapters.web.quota import UploadQuota
from adapters.wire import UnreadableBody, header_bytes, load_json
from gateway.core.clients import Network, client_address
from gateway.core.errors import BlobMissing
from gateway.core.files import MB, human_size
from gateway.core.i18n import accept_language
from gateway.core.ports import BeforePart, BlobStore, ConversationReader, FileReader, InboundSink, PartSent
from gateway.core.types import ChatAddress, DeliveryResult, OutboundAttachment, OutboundMessage

log = logging.getLogger("adapters.web")

COOKIE = "gw_web"
COOKIE_MAX_AGE_S = 365 * 24 * 3600
REQUESTED_WITH = "gateway-web"
"""Value of the ``X-Requested-With`` header every chat POST carries: a cross-site form cannot set
it, and a cross-site script would need a CORS preflight this server never grants."""
POLL_S = 1.0
"""How often an open page's stream looks for new transcript rows (turns from other platforms)."""
HEARTBEAT_S = 15.0
ADDRESS_FACTOR = 4
"""One client address may upload this many times one browser's quota (several people behind one
NAT; a fresh cookie per request gets no more than this)."""
MAX_STREAMS_PER_USER = 8
"""Open event streams one web user may hold (tabs, devices); a further one gets 429 (the page
retries it, so it comes in once another tab closes)."""
MAX_ROW_ID = 2**63 - 1
UPLOADS_IN_FLIGHT_PER_USER = 2
"""Uploads one browser may have under way at once (the page sends its files one by one)."""
UPLOADS_IN_FLIGHT_PER_ADDRESS = 4
UPLOADS_IN_FLIGHT = 4
"""Uploads under way at once in this process, everyone together: each is held in memory until it is
whole (at most ``media.upload_max_mb``), so this bounds what bodies trickled slowly can pin. A
further one gets 503 with ``Retry-After`` (the page sends it again)."""
DOWNLOADS_PER_USER = 6
"""File responses one browser may be receiving at once (a browser opens six connections per host)."""
SEND_STALL_S = 60.0
"""A file response whose reader takes nothing for this long is cut and its connection closed
(nginx's ``send_timeout``: between two successive writes), so a reader that never reads holds
neither the file's bytes nor the connection."""
SEND_CHUNK = 256 * 1024
MAX_FILE_BYTES = 100 * MB
"""Largest file the agent may send into the web chat (served from the blob store)."""
SENT_FILE_PATH = "/web/files/{sha256}/{name}"
STATIC = Path(__file__).with_name("static")
CSP = ("default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
       "frame-ancestors 'none'; form-action 'self'")


class WebAdapter:
    """The web chat.

    Args:
        secret: key that signs the browser's user id cookie.
        cookie_secure: mark the cookie ``Secure`` (HTTPS deployments).
        uploads_per_hour, upload_mb_per_hour: what one browser may upload in an hour
            (``web.uploads_per_hour``, ``web.upload_mb_per_hour``; ``UploadQuota``).
    """

    platform = "web"
    idempotent_send = False
    receiver_lease: str | None = None

    def __init__(self, *, secret: str, cookie_secure: bool = False, uploads_per_hour: int = 60,
                 upload_mb_per_hour: float = 200.0, streams_per_address: int = 64, max_streams: int = 500,
                 proxies: tuple[Network, ...] = ()) -> None:
        self._uploads = UploadQuota(uploads_per_hour, int(upload_mb_per_hour * MB))
        # identities are free (a new cookie per visit): the client's address is limited too
        self._address_uploads = UploadQuota(uploads_per_hour * ADDRESS_FACTOR,
                                            int(upload_mb_per_hour * MB) * ADDRESS_FACTOR)
        self._proxies = proxies
        self._streams_per_address = streams_per_address
        self._max_streams = max_streams
        self._streams: Counter[str] = Counter()  # open event streams per client address
        self._signer = Signer(secret, salt="gateway-web-user")
        self._tickets = Signer(secret, salt="gateway-web-file")
        self._blobs: BlobStore | None = None
        self._upload_max = 20_000_000
        self._file_signer = Signer(secret, salt="gateway-web-sent-file")
        self._files: FileReader | None = None
        self._cookie_secure = cookie_secure
        self._sink: InboundSink | None = None
        self._reader: ConversationReader | None = None
        self._listeners: dict[str, set[asyncio.Queue[dict[str, Any] | None]]] = {}
        self._uploading: Counter[str] = Counter()  # uploads under way by user and by address
        self._downloading: Counter[str] = Counter()  # file responses under way by user

    def bind_blobs(self, blobs: BlobStore, media: Any) -> None:
        """Where uploads are stored (the gateway's blob store) and their limit (``media.upload_max_mb``)."""
        self._blobs = blobs
        self._upload_max = int(media.upload_max_mb * 1_000_000)

    def ticket(self, user_id: str, sha256: str) -> str:
        """Proof that ``user_id`` may use blob ``sha256`` (they uploaded it, or it is in their chat)."""
        return self._tickets.get_signature(f"{user_id}:{sha256}").decode()

    def _ticket_ok(self, user_id: str, sha256: str, ticket: str) -> bool:
        return self._tickets.verify_signature(f"{user_id}:{sha256}".encode(), header_bytes(ticket))

    def bind_conversations(self, reader: ConversationReader) -> None:
        """Gives the adapter the transcript reader its pages show (called by the gateway)."""
        self._reader = reader

    # -- HTTP ------------------------------------------------------------------------------------
    def routes(self) -> list[web.RouteDef]:
        return [web.get("/", self._page), web.get("/web/chat.js", self._static("chat.js", "text/javascript")),
                web.get("/web/chat.css", self._static("chat.css", "text/css")),
                web.get("/web/icon.svg", self._static("icon.svg", "image/svg+xml")),
                web.get("/favicon.ico", self._favicon),
                web.post("/web/messages", self._post), web.get("/web/events", self._events),
                web.post("/web/files", self._upload), web.get("/web/files/{sha256}", self._file),
                web.get(SENT_FILE_PATH, self._sent_file)]

    def user_of(self, request: web.Request) -> str | None:
        """The browser's user id from its signed cookie, or ``None`` (no cookie, bad signature)."""
        value = request.cookies.get(COOKIE)
        if not value:
            return None
        try:  # the cookie's bytes as sent: a forged one that is not UTF-8 is a bad signature too
            return self._signer.unsign(header_bytes(value)).decode()
        except (BadSignature, UnicodeDecodeError):
            return None

    def cookie_for(self, user_id: str) -> str:
        """The signed cookie value of ``user_id``."""
        return self._signer.sign(user_id).decode()

    def bind_files(self, reader: FileReader) -> None:
        """Where the bytes of files the agent sent come from (the gateway's blob store)."""
        self._files = reader

    def attachment_problem(self, attachment: OutboundAttachment) -> str | None:
        """See ``FileSendingAdapter``: the web chat serves files of up to ``MAX_FILE_BYTES``."""
        if attachment.size <= 0:
            return f"{attachment.name} is empty; there is nothing to show."
        if attachment.size > MAX_FILE_BYTES:
            return (f"the web chat takes files up to {human_size(MAX_FILE_BYTES)}; {attachment.name} is "
                    f"{human_size(attachment.size)}.")
        return None

    def file_url(self, user_id: str, attachment: dict[str, Any]) -> str:
        """The address of a file the agent sent to ``user_id``: signed for that user, its bytes'
        digest, type and name, so it opens only in that user's browser (their cookie) and a changed
        type or name is refused."""
        sha, mime, name = str(attachment["sha256"]), str(attachment.get("mime_type") or ""), \
            str(attachment.get("name") or "file")
        signature = self._file_signer.get_signature(_file_claim(user_id, sha, mime, name)).decode()
        return f"/web/files/{sha}/{quote(name, safe='')}?" + urlencode({"type": mime, "sig": signature})

    async def _sent_file(self, request: web.Request) -> web.StreamResponse:
        """``GET /web/files/{sha256}/{name}?type=&sig=``: a file the agent sent to this browser's user.
        Images of a raster type are shown inline, everything else is a download; the body is never
        sniffed into something else (``nosniff``, a sandboxing CSP)."""
        user_id = self.user_of(request)
        if user_id is None:
            return _error(401, "no web identity: reload the page")
        sha, name = request.match_info["sha256"], request.match_info["name"]
        mime = request.query.get("type", "")
        claim = _file_claim(user_id, sha, mime, name)
        if not self._file_signer.verify_signature(claim, request.query.get("sig", "").encode()):
            return _error(403, "this file link is not yours")
        if self._downloading[user_id] >= DOWNLOADS_PER_USER:
            return _error(429, f"too many files downloading at once (at most {DOWNLOADS_PER_USER})",
                          headers={"Retry-After": "5"})
        self._downloading[user_id] += 1
        try:
            data = await self._files.read(sha) if self._files is not None else None
            if data is None:
                return _error(404, "this file is no longer stored")
            inline = mime in INLINE_IMAGE_TYPES
            disposition = "inline" if inline else "attachment"
            headers = {"Content-Disposition": f"{disposition}; filename*=UTF-8''{quote(name, safe='')}",
                       "X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'; sandbox",
                       "Cache-Control": "private, max-age=3600", "Referrer-Policy": "no-referrer",
                       "Content-Type": mime if inline else "application/octet-stream"}
            return await _send_bytes(request, data, headers)
        finally:
            self._release(self._downloading, user_id)

    def _files_html(self, user_id: str, attachments: list[dict[str, Any]]) -> str:
        return "".join(attachment_html(a, self.file_url(user_id, a)) for a in attachments if a.get("sha256"))

    async def _page(self, request: web.Request) -> web.Response:
        response = web.Response(body=(STATIC / "chat.html").read_bytes(), content_type="text/html",
                                charset="utf-8", headers=_page_headers())
        if self.user_of(request) is None:
            response.set_cookie(COOKIE, self.cookie_for(uuid.uuid4().hex), max_age=COOKIE_MAX_AGE_S, httponly=True,
                                samesite="Lax", secure=self._cookie_secure, path="/")
        return response

    async def _favicon(self, _: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently("/web/icon.svg")  # pages without an icon link (admin) ask here

    def _static(self, name: str, content_type: str) -> Any:
        async def serve(_: web.Request) -> web.Response:
            return web.Response(body=(STATIC / name).read_bytes(), content_type=content_type, charset="utf-8",
                                headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
        return serve

    async def _post(self, request: web.Request) -> web.Response:
        if request.headers.get("X-Requested-With") != REQUESTED_WITH:
            return _error(403, f"X-Requested-With must be {REQUESTED_WITH!r} (send messages from the chat page)")
        user_id = self.user_of(request)
        if user_id is None:
            return _error(401, "no web identity: reload the page")
        if self._sink is None:
            return _error(503, "the gateway is starting; try again")
        if request.content_type != "application/json":
            return _error(415, f"Content-Type must be application/json, not {request.content_type!r}")
        try:  # decoded with the Content-Type's charset (the page sends UTF-8)
            body = load_json((await request.read()).decode(request.charset or "utf-8"))
        except (UnreadableBody, UnicodeDecodeError):
            return _error(400, "the request body is not JSON")
        except (LookupError, UnicodeError):  # unknown, or a codec that is no text encoding (punycode)
            return _error(400, f"unknown charset {request.charset!r}: send UTF-8 JSON")
        try:
            message = message_from_post(body, user_id, check=self._ticket_ok,
                                        language=accept_language(request.headers.get("Accept-Language")))
        except WebInputError as exc:
            return _error(400, str(exc))
        try:
            stored = await self._sink(message)
        except Exception:
            log.exception("web message from %s not stored", user_id)
            return _error(503, "the message was not stored; send it again")
        return web.json_response({"ok": True, "stored": stored})

    async def _upload(self, request: web.Request) -> web.Response:
        """``POST /web/files``: the body is the file (``Content-Type`` its type, ``X-File-Name`` its
        URL-encoded name), at most ``media.upload_max_mb``; answers ``{"ok", "file": {"sha256",
        "ticket", "name", "mime_type", "size"}}`` for ``POST /web/messages``' ``files``. Stored in
        the blob store at once; the message then goes through the same inbox as text."""
        if request.headers.get("X-Requested-With") != REQUESTED_WITH:
            return _error(403, f"X-Requested-With must be {REQUESTED_WITH!r} (send files from the chat page)")
        user_id = self.user_of(request)
        if user_id is None:
            return _error(401, "no web identity: reload the page")
        if self._blobs is None:
            return _error(503, "file uploads are not available")
        limit = self._upload_max
        if request.content_length is not None and request.content_length > limit:
            return _error(413, f"the file is too big ({request.content_length / 1e6:.1f} MB); "
                               f"the web chat takes files up to {limit / 1e6:g} MB")
        address = client_address(request, self._proxies)
        # Counted when it starts, at its declared size (a chunked body: the most it may be), so
        # uploads sent together cannot pass the quota together (found by a review).
        declared = max(1, request.content_length if request.content_length is not None else limit)
        if (refused := self._over_quota(user_id, address, declared)) is not None:
            return refused
        if self._uploading[user_id] >= UPLOADS_IN_FLIGHT_PER_USER \
                or self._uploading[f"@{address}"] >= UPLOADS_IN_FLIGHT_PER_ADDRESS:
            return _error(429, "too many uploads under way from this browser or address; send one at a time",
                          headers={"Retry-After": "5"})
        if self._uploading[""] >= UPLOADS_IN_FLIGHT:
            return _error(503, "the chat is busy receiving other files; sending again shortly",
                          headers={"Retry-After": "2"})
        self._uploads.add(user_id, declared)
        self._address_uploads.add(address, declared)
        held = (user_id, f"@{address}", "")
        for key in held:
            self._uploading[key] += 1
        try:
            data = bytearray()
            async for chunk in request.content.iter_chunked(64 * 1024):
                data += chunk
                if len(data) > limit:
                    return _error(413, f"the file is too big; the web chat takes files up to {limit / 1e6:g} MB")
        finally:
            for key in held:
                self._release(self._uploading, key)
        if not data:
            return _error(400, "the file is empty")
        mime = (request.content_type or "application/octet-stream").lower()
        if mime in ("application/x-www-form-urlencoded", "multipart/form-data") or not MEDIA_TYPE.fullmatch(mime):
            mime = "application/octet-stream"
        name = unquote(request.headers.get("X-File-Name", ""))[:255] or None
        ref = await asyncio.to_thread(self._blobs.put, bytes(data), mime)
        return web.json_response({"ok": True, "file": {"sha256": ref.sha256, "ticket": self.ticket(user_id, ref.sha256),
                                                       "name": name, "mime_type": mime, "size": ref.size}})

    @staticmethod
    def _release(counts: Counter[str], key: str) -> None:
        counts[key] -= 1
        if counts[key] <= 0:
            del counts[key]

    def _over_quota(self, user_id: str, address: str, size: int) -> web.Response | None:
        """429 (with ``Retry-After``) when ``user_id``, or anyone at ``address``, may not upload
        ``size`` more bytes this hour."""
        for quota, key, who in ((self._uploads, user_id, "this browser"),
                                (self._address_uploads, address, "this address")):
            wait = quota.wait_s(key, size)
            if wait is not None:
                return _error(429, f"too many uploads from {who}; try again in {max(1, round(wait / 60))} min",
                              headers={"Retry-After": str(max(1, math.ceil(wait)))})
        return None

    async def _file(self, request: web.Request) -> web.StreamResponse:
        """``GET /web/files/<sha256>?t=<ticket>``: a blob of this browser's conversation (an upload or
        the rendition of an image in it), for inline images; anything else is 404."""
        user_id = self.user_of(request)
        sha = request.match_info["sha256"]
        if user_id is None or self._blobs is None or not self._ticket_ok(user_id, sha, request.query.get("t", "")):
            return _error(404, "no such file")
        if self._downloading[user_id] >= DOWNLOADS_PER_USER:
            return _error(429, f"too many files downloading at once (at most {DOWNLOADS_PER_USER})",
                          headers={"Retry-After": "5"})
        self._downloading[user_id] += 1
        try:
            try:
                data = await asyncio.to_thread(self._blobs.get, sha)
            except BlobMissing:
                return _error(404, "the file is no longer stored")
            kind = _image_type(data)
            return await _send_bytes(request, data, {
                "Content-Type": kind or "application/octet-stream", "Cache-Control": "private, max-age=86400",
                "X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'",
                **({} if kind else {"Content-Disposition": "attachment"})})
        finally:
            self._release(self._downloading, user_id)

    def _files_of(self, user_id: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """What the page shows of a row's files: name, kind, size and, for images, a URL of the rendition."""
        out = []
        for ref in row.get("attachments") or ():
            image = (ref.get("image") or {}).get("sha256")
            entry = {"name": ref.get("name"), "kind": ref.get("kind"), "size": ref.get("size")}
            if image:
                entry["url"] = f"/web/files/{image}?t={quote(self.ticket(user_id, image))}"
            out.append(entry)
        return out

    async def _events(self, request: web.Request) -> web.StreamResponse:
        user_id = self.user_of(request)
        if user_id is None:
            return _error(401, "no web identity: reload the page")
        try:
            after = max(0, int(request.query.get("after", "0")))
        except ValueError:
            return _error(400, "after must be a message id")
        if after > MAX_ROW_ID:  # SQLite's integers end there (an OverflowError once the stream began)
            return _error(400, "after must be a message id")
        known = request.query.get("session") or None
        address = client_address(request, self._proxies)
        if sum(self._streams.values()) >= self._max_streams:
            return _error(503, "the chat is at its limit of open pages; try again in a minute",
                          headers={"Retry-After": "60"})
        if self._streams[address] >= self._streams_per_address:
            return _error(429, f"too many open chat pages from this address (at most {self._streams_per_address})")
        listeners = self._listeners.setdefault(user_id, set())
        if len(listeners) >= MAX_STREAMS_PER_USER:
            return _error(429, f"too many open chat pages (at most {MAX_STREAMS_PER_USER}); close one")
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        listeners.add(queue)  # before the first await, so parallel opens count each other
        self._streams[address] += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})
        answered: deque[str] = deque(maxlen=20)  # assistant texts shown from the transcript
        loop = asyncio.get_running_loop()
        last_write = loop.time()
        try:
            await response.prepare(request)
            events: list[dict[str, Any] | None] = []
            read = True
            while True:
                if read and self._reader is not None:
                    session_id, rows = await self._reader.read("web", TENANT, user_id, after)
                    if known is not None and session_id != known:
                        await _emit(response, {"type": "reset", "session": session_id})
                        session_id, rows = await self._reader.read("web", TENANT, user_id, 0)
                        after = 0
                    known = session_id or known
                    for row in rows:
                        if row["platform"] == "web" and row["message_id"]:
                            row = {**row, "message_id": client_id_of(row["message_id"])}  # the page's id
                        html = markdown_html(row["text"]) if row["role"] == "assistant" else plain_html(row["text"])
                        if row["role"] == "assistant" and row.get("attachments"):  # the files the agent sent
                            html += self._files_html(user_id, row["attachments"])
                        await _emit(response, {**row, "type": "row", "html": html, "session": session_id,
                                               "attachments": self._files_of(user_id, row)
                                               if row["role"] == "user" else []})
                        after = max(after, row["id"])
                        if row["role"] == "assistant":
                            answered.append(row["text"].strip())
                    if rows:
                        last_write = loop.time()
                for event in events:
                    if event is None:
                        return response  # the adapter stops
                    if event["type"] == "reply" and event["text"].strip() in answered:
                        event = {"type": "settled", "id": event["id"]}
                    await _emit(response, event)
                    last_write = loop.time()
                if loop.time() - last_write >= HEARTBEAT_S:
                    await response.write(b": ping\n\n")  # finds closed connections
                    last_write = loop.time()
                try:
                    events = [await asyncio.wait_for(queue.get(), POLL_S)]
                except TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        return response  # the page went away: free its place now, not at the next write
                    events, read = [], True
                    continue
                while not queue.empty():
                    events.append(queue.get_nowait())
                read = any(e is None or e["type"] == "reply" for e in events)
        except (ConnectionError, asyncio.CancelledError):  # aiohttp's "Connection lost" is a plain one
            return response
        finally:
            self._streams[address] -= 1
            if self._streams[address] <= 0:
                del self._streams[address]
            listeners.discard(queue)
            if not listeners:
                self._listeners.pop(user_id, None)

    def _publish(self, chat_id: str, event: dict[str, Any]) -> None:
        for queue in self._listeners.get(chat_id, ()):
            queue.put_nowait(event)

    # -- Adapter ---------------------------------------------------------------------------------
    async def start(self, sink: InboundSink) -> None:
        self._sink = sink

    async def start_receiving(self) -> None:
        return None  # messages arrive through routes()

    async def stop_receiving(self) -> None:
        return None

    async def stop(self) -> None:
        """Ends every open event stream (so the HTTP server can close)."""
        self._sink = None
        for listeners in self._listeners.values():
            for queue in listeners:
                queue.put_nowait(None)

    async def send(self, message: OutboundMessage, on_part: PartSent | None = None,
                   before_part: BeforePart | None = None) -> DeliveryResult:
        """Shows the reply on the chat's open pages (one part, the agent's files inline or as
        downloads under the text; a page opened later finds a turn's reply in the transcript). Part
        1 of a reply with ``edit_id`` replaces that preview."""
        if message.resume_from > 0:
            return DeliveryResult(True)
        if before_part is not None:
            await before_part(0)
        message_id = message.edit_id or uuid.uuid4().hex
        html = plain_html(message.text) if message.format == "plain" else markdown_html(message.text)
        html += self._files_html(message.address.chat_id, [a.to_dict() for a in message.attachments])
        self._publish(message.address.chat_id, {"type": "reply", "id": message_id, "text": message.text,
                                                "html": html})
        if on_part is not None:
            await on_part(message_id)
        return DeliveryResult(True, (message_id,))

    async def edit(self, address: ChatAddress, message_id: str, text: str) -> DeliveryResult:
        """Updates a streamed preview on the chat's open pages."""
        self._publish(address.chat_id, {"type": "preview", "id": message_id, "html": plain_html(text)})
        return DeliveryResult(True, (message_id,))

    async def send_typing(self, address: ChatAddress) -> None:
        self._publish(address.chat_id, {"type": "typing"})

    async def check(self) -> str:
        open_pages = sum(len(listeners) for listeners in self._listeners.values())
        return f"web chat at / ({open_pages} open page(s))"


async def _emit(response: web.StreamResponse, event: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode())


def _file_claim(user_id: str, sha256: str, mime: str, name: str) -> str:
    return "\n".join((user_id, sha256, mime, name))


def _image_type(data: bytes) -> str | None:
    """The image type of ``data`` by its magic number (only images are shown inline)."""
    if data[:3] == b"\xff\xd8\xff":
        return "image/jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    return None


def _error(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"ok": False, "error": text}, status=status, headers=headers)


def _page_headers() -> dict[str, str]:
    return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache"}


async def _send_bytes(request: web.Request, data: bytes, headers: dict[str, str]) -> web.StreamResponse:
    """``data`` as the response, written ``SEND_CHUNK`` bytes at a time; a reader that takes none of
    a chunk for ``SEND_STALL_S`` gets its connection closed (aiohttp has no send timeout, and the
    keep-alive timeout does not count while a response is written: a reader that never read held
    the whole file in the connection's buffer for ever; found by a review)."""
    response = web.StreamResponse(headers=headers)
    response.content_length = len(data)
    await response.prepare(request)
    view = memoryview(data)
    try:
        for start in range(0, len(view), SEND_CHUNK):
            async with asyncio.timeout(SEND_STALL_S):
                await response.write(view[start:start + SEND_CHUNK])  # waits while the reader's buffer is full
        await response.write_eof()
    except TimeoutError:
        log.info("GET %s: the reader took nothing for %.0f s; connection closed", request.path, SEND_STALL_S)
        if request.transport is not None:
            request.transport.abort()
    return response
