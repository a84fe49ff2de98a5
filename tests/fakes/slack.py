"""A wire-level fake of the Slack Web API (and Socket Mode) for the real slack-sdk / slack-bolt.

Point the SDK at it with ``AsyncWebClient(token, base_url=f"{fake.url}/api/")``. What is emulated
follows PLATFORMS.md §2.4 and the Slack docs (docs.slack.dev/reference/methods/*): the
``{"ok": true, ...}`` / ``{"ok": false, "error": "<code>"}`` envelope (HTTP 200, except 429 +
``Retry-After`` for rate limits); parameters merged from query string, form body and JSON body;
Bearer tokens (missing -> ``not_authed``, wrong -> ``invalid_auth``); per-channel messages keyed by
unique ``ts`` strings; ``chat.postMessage`` limits (``no_text``, ``msg_too_long`` > 40,000 chars,
``channel_not_found``, ``invalid_blocks`` for Block Kit past its limits: > 50 blocks, a section's text
over 3,000 characters); ``chat.update`` ownership (``cant_update_message``, ``message_not_found``).
A stored message keeps its ``blocks``; ``visible_text`` is what a person sees of it.

Events go the other way: ``post_event`` signs an Events API envelope with the signing secret
(``v0=`` HMAC-SHA256 of ``v0:{timestamp}:{body}``) and POSTs it to the gateway, with probes for a
bad signature, a stale timestamp and a body altered after signing. ``GET /link`` is the Socket
Mode WebSocket (``hello`` on connect, ``push`` an ``events_api`` envelope, acks recorded); as Slack
does, an envelope not acked when its connection goes away (or pushed while none is open) is
delivered again on the next connection with ``retry_attempt + 1``; ``disconnect`` sends Slack's
``{"type": "disconnect", "reason": ...}`` and ``drop`` cuts the sockets without a close frame.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import hmac
import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.server import ThreadedServer
from tests.fakes.slack_uploads import SlackUploads

TEXT_LIMIT = 40_000  # chat.postMessage / chat.update: longer text is rejected with msg_too_long
BLOCKS_LIMIT = 50  # Block Kit: at most 50 blocks in a message
SECTION_TEXT_LIMIT = 3000  # Block Kit section block: text "Maximum length for the text in this field is 3000"
JSON = dict[str, Any]
Predicate = Callable[["Call"], bool]

_MARKUP = re.compile(r"<([^<>]*)>")
_VALID_MARKUP = re.compile(r"^(?:(?:https?|mailto|ftp|slack):[^|\s]+(?:\|[^|]*)?|[@#][UWC][A-Z0-9]+(?:\|[^|]*)?"
                           r"|![a-z]+(?:\^[^|]*)?(?:\|[^|]*)?)$")
_FENCED = re.compile(r"```.*?```", re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]+`")


def visible_text(message: JSON) -> str:
    """What a person sees of a stored message: with ``blocks``, Slack shows the blocks (their section
    texts; ``text`` is then only the notification fallback), else ``text``."""
    if message.get("blocks"):
        return "\n".join(str((b.get("text") or {}).get("text") or "") for b in message["blocks"]
                         if b.get("type") == "section")
    return str(message.get("text") or "")


def mrkdwn_problems(text: str) -> list[str]:
    """What in ``text`` Slack would show wrongly (Slack: "Formatting text for app surfaces"): a bare
    ``&``/``<``/``>``, malformed ``<…>`` markup, an unclosed code fence, or standard Markdown that
    mrkdwn does not render (``**bold**``, ``[text](url)``, ``# heading``, ``| table |`` rows)."""
    problems: list[str] = []
    if text.count("```") % 2:
        problems.append("unclosed code fence")
    if re.search(r"&(?!amp;|lt;|gt;)", text):
        problems.append("unescaped &")
    for match in _MARKUP.finditer(text):
        if not _VALID_MARKUP.match(match.group(1)):
            problems.append(f"malformed markup {match.group(0)[:40]!r}")
    if ">" in _MARKUP.sub("", text).replace("\n>", "\n").removeprefix(">"):
        problems.append("unescaped >")
    if "<" in _MARKUP.sub("", text):
        problems.append("unescaped <")
    prose = _INLINE_CODE.sub("", _FENCED.sub("", text))
    if "**" in prose:
        problems.append("markdown bold")
    if re.search(r"\[[^\]]+\]\([^)]+\)", prose):
        problems.append("markdown link")
    if re.search(r"(?m)^#{1,6} ", prose):
        problems.append("markdown heading")
    if re.search(r"(?m)^\|.*\|\s*$", prose):
        problems.append("markdown table")
    return problems


@dataclass
class Call:
    """One recorded Web API call: ``time`` (``time.monotonic()`` s), method, merged ``params``, and
    the token the caller sent (``None`` when absent)."""

    time: float
    method: str
    params: dict[str, Any]
    token: str | None = None


@dataclass
class EventDelivery:
    """One ``post_event``: HTTP ``status``, response ``body`` text, ``latency`` (s), ``headers``."""

    status: int
    body: str
    latency: float
    headers: dict[str, str] = field(default_factory=dict)


class SlackError(Exception):
    """A Web API error answer: ``{"ok": false, "error": code, **extra}`` with HTTP ``status`` and
    ``headers`` (``extra``: e.g. ``needed``/``provided`` of ``missing_scope``)."""

    def __init__(self, error: str, status: int = 200, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(error)
        self.error, self.status, self.headers, self.extra = error, status, headers or {}, extra or {}

    def response(self) -> web.Response:
        return web.json_response({"ok": False, "error": self.error, **self.extra}, status=self.status,
                                 headers=self.headers)


HISTORY_SCOPES = {"C": "channels:history", "G": "groups:history", "D": "im:history"}
"""The scope ``conversations.replies`` needs per conversation type (by channel id prefix)."""
DEFAULT_SCOPES = frozenset({"app_mentions:read", "chat:write", "channels:history", "groups:history", "im:history",
                            "mpim:history", "users:read", "reactions:write"})
REPLIES_MAX_LIMIT = 1000


class FakeSlack(ThreadedServer):
    """The fake server: ``/api/{method}`` (Web API), ``/link`` (Socket Mode WebSocket).

    Args:
        bot_token / app_token / signing_secret: the app's credentials (defaults: the fixture app's).
        team_id / bot_user_id / bot_id / api_app_id: what ``auth.test`` returns; they must match the
            events posted, or Bolt's own-message filter and the adapter's mention stripping miss.
        users: user id -> display name, served by ``users.info``.
        locales: user id -> the locale ``users.info`` gives with ``include_locale=true`` (default ``en-US``).

    ``scopes`` holds the bot token's scopes (``DEFAULT_SCOPES``); ``conversations.replies`` answers
    ``missing_scope`` (with ``needed`` and ``provided``) when the channel type's history scope is not
    among them.
    """

    def __init__(self, *, bot_token: str = "xoxb-fake-0001", app_token: str = "xapp-1-fake",
                 signing_secret: str = "fake-signing-secret-0001", team_id: str = "T0FAKE0001",
                 bot_user_id: str = "U0BOT00001", bot_id: str = "B0BOT00001", api_app_id: str = "A0FAKE0001",
                 users: dict[str, str] | None = None, port: int = 0) -> None:
        super().__init__(port)
        self.bot_token, self.app_token, self.signing_secret = bot_token, app_token, signing_secret
        self.hosted_files: dict[str, bytes] = {}
        """Users' uploads served on their private URLs (``add_file``)."""
        self.files_read_scope = True
        """Whether the bot token has ``files:read``; without it private file URLs answer the sign-in page."""
        self.file_requests: list[JSON] = []
        """Requests to private file URLs: ``{"path", "authorization"}``."""
        self.team_id, self.bot_user_id, self.bot_id, self.api_app_id = team_id, bot_user_id, bot_id, api_app_id
        self.users = dict(users or {"U0ALICE001": "Alice", "U0BOB00001": "Bob"})
        self.locales: dict[str, str] = {}
        self.channels: dict[str, dict[str, JSON]] = {}  # channel -> ts -> message
        self.deliveries: list[EventDelivery] = []
        self.acks: list[JSON] = []
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._faults: dict[str, deque[SlackError | None]] = {}
        self._ts = itertools.count(1)
        self._envelopes = itertools.count(1)
        self._sockets: list[web.WebSocketResponse] = []
        self._unacked: dict[str, JSON] = {}  # envelope id -> frame, until acked (Socket Mode)
        self.connections_opened = 0
        self._methods: dict[str, Callable[[JSON], JSON]] = {
            "auth.test": self._auth_test, "chat.postMessage": self._post_message, "chat.update": self._update,
            "chat.delete": self._delete, "users.info": self._users_info, "conversations.info": self._conversation,
            "reactions.add": self._reactions_add, "reactions.remove": self._reactions_remove,
            "assistant.threads.setStatus": self._set_status, "apps.connections.open": self._connections_open,
            "assistant.threads.setSuggestedPrompts": self._set_prompts, "chat.postEphemeral": self._post_ephemeral,
            "conversations.replies": self._replies, "chat.startStream": self._start_stream,
            "chat.appendStream": self._append_stream, "chat.stopStream": self._stop_stream,
        }
        self.streaming_methods = True
        """The workspace has chat.startStream/appendStream/stopStream; off: they answer ``unknown_method``."""
        self.ephemeral: list[JSON] = []
        """Ephemeral messages shown: ``{"via": "chat.postEphemeral" | "response_url", "channel",
        "user", "text", "thread_ts"}`` in order."""
        self.statuses: list[tuple[str, str, str]] = []
        """``assistant.threads.setStatus`` calls that took effect: ``(channel_id, thread_ts, status)``."""
        self.prompts: dict[tuple[str, str], JSON] = {}
        """Suggested prompts per assistant thread ``(channel_id, thread_ts)``."""
        self.assistant_threads: set[tuple[str, str]] = set()
        """Assistant threads users opened (``assistant_thread_started``); only these take a status
        or prompts when ``assistant_surface`` is on (else Slack answers ``not_allowed``... here
        ``invalid_thread_ts``: the thread is not an assistant thread)."""
        self.assistant_surface = True
        """The workspace has the assistant surface; off: ``assistant.*`` answer ``not_allowed_token_type``."""
        self._hooks: dict[str, JSON] = {}  # response_url path -> {"channel", "user", "uses", "expires"}
        self.scopes: set[str] = set(DEFAULT_SCOPES)
        self.reactions: dict[tuple[str, str], set[str]] = {}
        self.uploads = SlackUploads(self)
        """Files upload v2 (``tests.fakes.slack_uploads``): ``uploads.shared()``, ``uploads.holds``."""
        self._methods.update(self.uploads.methods())
        for channel in ("D0ALICE001", "C0GENERAL1"):
            self.add_channel(channel)

    # ---- test-facing API -----------------------------------------------------------------------

    def add_channel(self, channel: str) -> None:
        """Makes ``channel`` known (posting elsewhere fails with ``channel_not_found``)."""
        with self._lock:
            self.channels.setdefault(channel, {})

    def calls(self, method: str | None = None) -> list[Call]:
        """Recorded calls with a valid token, in arrival order, optionally only ``method``."""
        with self._lock:
            return [c for c in self._calls if method is None or c.method == method]

    async def wait_for_call(self, method: str, predicate: Predicate | None = None, timeout: float = 5.0, *,
                            since: int = 0) -> Call:
        """Waits (polling, from any loop) for a ``method`` call matching ``predicate``, skipping the
        first ``since`` calls of the whole log. Raises ``TimeoutError``."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = next((c for c in self._calls[since:]
                              if c.method == method and (predicate is None or predicate(c))), None)
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                seen = [c.method for c in self.calls()]
                raise TimeoutError(f"no matching {method} within {timeout} s; calls: {seen}")
            await asyncio.sleep(0.01)

    def posted(self, channel: str, thread_ts: str | None = None) -> list[JSON]:
        """Messages the bot posted in ``channel`` (only in thread ``thread_ts`` when given), in order."""
        with self._lock:
            msgs = [copy.deepcopy(m) for m in self.channels.get(channel, {}).values()
                    if m.get("user") == self.bot_user_id]
        return [m for m in msgs if thread_ts is None or m.get("thread_ts") == thread_ts]

    def fail_next(self, method: str, error: str = "ratelimited", status: int | None = None,
                  retry_after: int | None = None, after: int = 0) -> None:
        """Queues a canned error for a coming call of ``method`` (the call is still recorded), e.g.
        ``fail_next("chat.postMessage", "ratelimited", retry_after=1)`` -> HTTP 429 + ``Retry-After``.
        ``after`` lets that many calls succeed first. Status defaults to 429 for ``ratelimited``,
        else 200 (Slack reports most errors with HTTP 200)."""
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        status = status if status is not None else (429 if error == "ratelimited" else 200)
        with self._lock:
            queue = self._faults.setdefault(method, deque())
            queue.extend([None] * after)
            queue.append(SlackError(error, status, headers))

    def clear_faults(self, method: str) -> int:
        """Drops the errors still queued for ``method`` (a test that expected no such call leaves
        none for the next); returns how many there were."""
        with self._lock:
            return len(self._faults.pop(method, ()))

    def envelope(self, event: JSON, event_id: str | None = None) -> JSON:
        """Wraps ``event`` in an ``event_callback`` envelope for this app."""
        n = next(self._envelopes)
        return {"token": "FakeLegacyVerificationToken0001", "team_id": self.team_id, "api_app_id": self.api_app_id,
                "event": event, "type": "event_callback", "event_id": event_id or f"Ev0SIM{n:06d}",
                "event_time": int(time.time()),
                "authorizations": [{"enterprise_id": None, "team_id": self.team_id, "user_id": self.bot_user_id,
                                    "is_bot": True, "is_enterprise_install": False}]}

    def sign(self, body: bytes, timestamp: int) -> str:
        """``v0=`` + hex HMAC-SHA256(signing secret, ``v0:{timestamp}:{body}``) (Slack request signing)."""
        base = b"v0:" + str(timestamp).encode() + b":" + body
        return "v0=" + hmac.new(self.signing_secret.encode(), base, hashlib.sha256).hexdigest()

    async def post_event(self, url: str, payload: JSON | bytes, *, retry_num: int = 0,
                         retry_reason: str = "http_timeout", probe: str | None = None,
                         timeout: float = 10) -> EventDelivery:
        """POSTs a signed event to ``url`` as Slack does; returns (and records) the delivery.

        Args:
            payload: an envelope (``event_callback``/``url_verification``), a bare event (wrapped by
                ``envelope``), or the exact body bytes (e.g. a fixture file's).
            retry_num: sends ``X-Slack-Retry-Num``/``-Reason`` (Slack's redelivery headers) when > 0.
            probe: ``"bad_signature"`` (signed with another secret), ``"stale"`` (timestamp 301 s
                old), ``"altered"`` (body changed after signing), ``"unsigned"`` (no headers).
        """
        if isinstance(payload, bytes):
            body = payload
            try:
                event = json.loads(body).get("event")
            except (ValueError, AttributeError):
                event = None
            if isinstance(event, dict):
                self.remember(event)
        else:
            if payload.get("type") not in ("event_callback", "url_verification"):
                payload = self.envelope(payload)
            body = json.dumps(payload).encode()
            if isinstance(payload.get("event"), dict):
                self.remember(payload["event"])
        timestamp = int(time.time()) - (301 if probe == "stale" else 0)
        signature = self.sign(body, timestamp)
        if probe == "bad_signature":
            signature = "v0=" + hmac.new(b"not-the-secret", b"v0:%d:" % timestamp + body, hashlib.sha256).hexdigest()
        if probe == "altered":
            body = body.replace(b'"text": "', b'"text": "(altered) ', 1) if b'"text": "' in body else body + b" "
        headers = {"Content-Type": "application/json"}
        if probe != "unsigned":
            headers.update({"X-Slack-Request-Timestamp": str(timestamp), "X-Slack-Signature": signature})
        if retry_num:
            headers.update({"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": retry_reason})
        started = time.monotonic()
        async with aiohttp.ClientSession() as session, session.post(
                url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            delivery = EventDelivery(resp.status, await resp.text(), time.monotonic() - started, dict(resp.headers))
        self.deliveries.append(delivery)
        return delivery

    def push(self, frame: JSON | None = None, *, event: JSON | None = None, envelope_id: str | None = None,
             retry_attempt: int = 0) -> str:
        """Sends a Socket Mode ``events_api`` frame to every connected client (any thread): either a
        whole ``frame`` (e.g. a fixture) or one built around ``event``. Returns the envelope id."""
        if frame is None:
            payload = event if event and event.get("type") == "event_callback" else self.envelope(event or {})
            frame = {"envelope_id": envelope_id or f"fake-envelope-sim-{next(self._envelopes)}", "type": "events_api",
                     "accepts_response_payload": False, "retry_attempt": retry_attempt,
                     "retry_reason": "timeout" if retry_attempt else "", "payload": payload}
        if isinstance(frame.get("payload", {}).get("event"), dict):
            self.remember(frame["payload"]["event"])
        text = json.dumps(frame)

        async def send() -> None:  # on the server's loop: atomic with a connection's start (_handle_socket)
            with self._lock:
                self._unacked[str(frame["envelope_id"])] = frame
                targets = list(self._sockets)  # none open: kept in _unacked for the next connection
            for ws in targets:
                await ws.send_str(text)

        self.call(send())
        return str(frame["envelope_id"])

    def disconnect(self, reason: str = "refresh_requested") -> None:
        """Sends Slack's ``disconnect`` frame to every open connection (Socket Mode: Slack asks the
        app to reconnect, e.g. ``refresh_requested`` every few hours, ``warning``, ``link_disabled``);
        the old connection stays open until the client closes it."""
        text = json.dumps({"type": "disconnect", "reason": reason, "debug_info": {"host": "fake-slack"}})

        async def send() -> None:
            for ws in list(self._sockets):
                await ws.send_str(text)

        self.call(send())

    def drop(self) -> None:
        """Cuts every Socket Mode connection without a close frame (a network failure or a Slack
        host going away): the client only notices by its own reads and pings failing."""

        async def cut() -> None:
            for ws in list(self._sockets):
                transport = getattr(ws._req, "transport", None) if ws._req is not None else None
                if transport is not None:
                    transport.abort()

        self.call(cut())

    @property
    def socket_clients(self) -> int:
        """Number of Socket Mode connections open now."""
        return len(self._sockets)

    async def wait_for_ack(self, envelope_id: str, timeout: float = 5.0) -> JSON:
        """Waits for the Socket Mode ack of ``envelope_id``; raises ``TimeoutError``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                ack = next((a for a in self.acks if a.get("envelope_id") == envelope_id), None)
            if ack is not None:
                return ack
            await asyncio.sleep(0.01)
        raise TimeoutError(f"no ack for {envelope_id}")

    # ---- plumbing ------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle_method)
        app.router.add_get("/link", self._handle_socket)
        app.router.add_post("/upload/v1/{file_id}", self.uploads.handle_upload)
        app.router.add_get("/files-pri/{team_file}/{rest:.+}", self._handle_file)
        app.router.add_post("/commands/{team}/{id}/{secret}", self._handle_response_url)
        return app

    SIGN_IN_PAGE = ("<!DOCTYPE html><html lang=\"en-US\"><head><meta charset=\"utf-8\"><title>Slack</title></head>"
                    "<body><h1>Sign in to your workspace</h1><form action=\"/signin\"></form></body></html>")

    def add_file(self, file_id: str, data: bytes, mimetype: str, name: str) -> JSON:
        """Hosts ``data`` as a user's upload and returns its Slack file object (``files`` of a
        message event): ``url_private`` / ``url_private_download`` on ``/files-pri/<team>-<id>/``."""
        self.hosted_files[file_id] = data
        base = f"{self.url}/files-pri/{self.team_id}-{file_id}"
        return {"id": file_id, "created": int(time.time()), "name": name, "title": name, "mimetype": mimetype,
                "filetype": name.rsplit(".", 1)[-1], "size": len(data), "mode": "hosted", "is_external": False,
                "url_private": f"{base}/{name}", "url_private_download": f"{base}/download/{name}"}

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        """A private file URL (Slack "Downloading files": ``url_private``/``url_private_download``
        need ``Authorization: Bearer <token>``). Without a valid token Slack does not answer 401 but
        200 with its HTML sign-in page."""
        self.file_requests.append({"path": request.path, "authorization": request.headers.get("Authorization")})
        header = request.headers.get("Authorization", "")
        file_id = request.match_info["team_file"].removeprefix(f"{self.team_id}-")
        data = self.hosted_files.get(file_id)
        if header != f"Bearer {self.bot_token}" or data is None or not self.files_read_scope:
            return web.Response(text=self.SIGN_IN_PAGE, content_type="text/html", charset="utf-8")
        return web.Response(body=data, content_type="application/octet-stream")

    def remember(self, event: JSON) -> None:
        """Remembers an event's channel and (user) message, as Slack knows what users posted, so
        replies, reactions and ``chat.update`` ownership checks can find it. ``post_event`` and
        ``push`` call it; tests may call it for messages that never became events."""
        channel, ts = event.get("channel"), event.get("ts")
        if not channel:
            return
        with self._lock:
            messages = self.channels.setdefault(str(channel), {})
            if ts and event.get("type") in ("message", "app_mention") and not event.get("subtype"):
                kept = {k: v for k, v in event.items() if k in ("user", "text", "ts", "thread_ts", "files")}
                messages.setdefault(str(ts), {"type": "message", **kept})

    async def _params(self, request: web.Request) -> JSON:
        params: JSON = dict(request.query)
        if request.can_read_body:
            if request.content_type == "application/json":
                try:
                    body = await request.json()
                except ValueError:
                    raise SlackError("invalid_json") from None
                params.update(body if isinstance(body, dict) else {})
            elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
                params.update({k: v for k, v in (await request.post()).items() if isinstance(v, str)})
        return params

    async def _handle_method(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        handler = self._methods.get(method)
        if handler is None:
            return SlackError("unknown_method", 404).response()
        try:
            params = await self._params(request)
        except SlackError as exc:
            return exc.response()
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header.startswith("Bearer ") else params.get("token")
        if not token:
            return SlackError("not_authed").response()
        expected = self.app_token if method == "apps.connections.open" else self.bot_token
        if token != expected:
            return SlackError("invalid_auth").response()
        with self._lock:
            self._calls.append(Call(time.monotonic(), method, params, token))
            faults = self._faults.get(method)
            fault = faults.popleft() if faults else None
        if fault is not None:
            return fault.response()
        try:
            result = handler(params)
        except SlackError as exc:
            return exc.response()
        await self.uploads.holds.gate(method)  # a held call took effect; its answer may never arrive
        return web.json_response({"ok": True, **result})

    async def _handle_socket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=True)  # answers the SDK's sdk-ping-pong pings
        await ws.prepare(request)
        with self._lock:  # Slack retries what was not acked before: pushed while no connection, or lost with one
            retries = [{**frame, "retry_attempt": int(frame.get("retry_attempt") or 0) + 1, "retry_reason": "timeout"}
                       for frame in self._unacked.values()]
            self._unacked.update({str(frame["envelope_id"]): frame for frame in retries})
            self._sockets.append(ws)  # from here on, push() sends to this socket itself
        self.connections_opened += 1
        await ws.send_str(json.dumps({"type": "hello", "num_connections": len(self._sockets),
                                      "debug_info": {"host": "fake-slack"},
                                      "connection_info": {"app_id": self.api_app_id}}))
        for frame in retries:
            await ws.send_str(json.dumps(frame))
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    ack = json.loads(msg.data)
                    with self._lock:
                        self.acks.append(ack)
                        self._unacked.pop(str(ack.get("envelope_id")), None)
        finally:
            self._sockets.remove(ws)
        return ws

    # ---- Web API methods -----------------------------------------------------------------------

    def _auth_test(self, params: JSON) -> JSON:
        return {"url": "https://fake-workspace.slack.com/", "team": "Fake Workspace", "user": "gateway",
                "team_id": self.team_id, "user_id": self.bot_user_id, "bot_id": self.bot_id,
                "is_enterprise_install": False}

    def _channel(self, params: JSON, key: str = "channel") -> dict[str, JSON]:
        channel = str(params.get(key) or "")
        if channel not in self.channels:
            raise SlackError("channel_not_found")
        return self.channels[channel]

    @staticmethod
    def _text(params: JSON) -> str:
        text = params.get("text")
        if not text and not params.get("blocks"):
            raise SlackError("no_text")
        text = str(text or "")
        if len(text) > TEXT_LIMIT:
            raise SlackError("msg_too_long")
        return text

    @staticmethod
    def _blocks(params: JSON) -> list[JSON] | None:
        """``blocks`` (a JSON string or a list) checked as Slack checks Block Kit (Slack Block Kit
        reference: at most 50 blocks in a message; a section's ``text`` 1-3,000 characters; a
        button's ``text`` ≤ 75, ``value`` ≤ 2,000; an actions block ≤ 25 elements): else
        ``invalid_blocks`` with ``response_metadata.messages`` naming the JSON pointer."""
        raw = params.get("blocks")
        if raw is None or raw == "":
            return None
        try:
            blocks = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise SlackError("invalid_blocks_format") from None
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise SlackError("invalid_blocks_format")
        problems = []
        if len(blocks) > BLOCKS_LIMIT:
            problems.append(f"[ERROR] no more than {BLOCKS_LIMIT} items allowed [json-pointer:/blocks]")
        for i, block in enumerate(blocks):
            if block.get("type") == "section":
                text = str((block.get("text") or {}).get("text") or "")
                if not text or len(text) > SECTION_TEXT_LIMIT:
                    problems.append(f"[ERROR] must be between 1 and {SECTION_TEXT_LIMIT} characters "
                                    f"[json-pointer:/blocks/{i}/text/text]")
            elif block.get("type") == "actions":
                elements = block.get("elements") or []
                if len(elements) > 25:
                    problems.append(f"[ERROR] no more than 25 items allowed [json-pointer:/blocks/{i}/elements]")
                for k, element in enumerate(elements):
                    if len(str((element.get("text") or {}).get("text") or "")) > 75 \
                            or len(str(element.get("value") or "")) > 2000:
                        problems.append(f"[ERROR] button too long [json-pointer:/blocks/{i}/elements/{k}]")
        if problems:
            raise SlackError("invalid_blocks", extra={"response_metadata": {"messages": problems}})
        return blocks

    def _new_ts(self) -> str:
        return f"{int(time.time())}.{next(self._ts):06d}"

    def _post_message(self, params: JSON) -> JSON:
        text = self._text(params)
        blocks = self._blocks(params)
        with self._lock:
            messages = self._channel(params)
            ts = self._new_ts()
            msg: JSON = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id, "text": text, "ts": ts,
                         "team": self.team_id, "mrkdwn_problems": mrkdwn_problems(text)}
            if blocks is not None:
                msg["blocks"] = blocks
            if params.get("thread_ts"):
                msg["thread_ts"] = str(params["thread_ts"])
            messages[ts] = msg
            return {"channel": params["channel"], "ts": ts, "message": copy.deepcopy(msg)}

    def _update(self, params: JSON) -> JSON:
        text = self._text(params)
        self._blocks(params)
        with self._lock:
            msg = self._channel(params).get(str(params.get("ts") or ""))
            if msg is None:
                raise SlackError("message_not_found")
            if msg.get("user") != self.bot_user_id or msg.get("streaming"):
                raise SlackError("cant_update_message")  # a stream is stopped before its message is edited
            msg.update(text=text, edited={"user": self.bot_user_id, "ts": self._new_ts()},
                       mrkdwn_problems=mrkdwn_problems(text))
            return {"channel": params["channel"], "ts": msg["ts"], "text": text, "message": copy.deepcopy(msg)}

    def _delete(self, params: JSON) -> JSON:
        with self._lock:
            messages = self._channel(params)
            if messages.pop(str(params.get("ts") or ""), None) is None:
                raise SlackError("message_not_found")
        return {"channel": params["channel"], "ts": params["ts"]}

    def _users_info(self, params: JSON) -> JSON:
        user = str(params.get("user") or "")
        if user not in self.users:
            raise SlackError("user_not_found")
        name = self.users[user]
        found = {"id": user, "team_id": self.team_id, "name": name.lower().replace(" ", "."),
                 "real_name": name, "is_bot": False, "profile": {"display_name": name, "real_name": name}}
        if str(params.get("include_locale", "")).lower() in ("true", "1"):  # users.info: only when asked
            found["locale"] = self.locales.get(user, "en-US")
        return {"user": found}

    def _conversation(self, params: JSON) -> JSON:
        channel = str(params.get("channel") or "")
        self._channel(params)
        return {"channel": {"id": channel, "name": channel.lower(), "is_im": channel.startswith("D"),
                            "is_channel": channel.startswith("C"), "is_private": channel.startswith("G")}}

    def _message_for_reaction(self, params: JSON) -> tuple[str, str]:
        with self._lock:
            messages = self._channel(params)
            ts = str(params.get("timestamp") or "")
            if ts not in messages:
                raise SlackError("message_not_found")
        return str(params["channel"]), ts

    def _reactions_add(self, params: JSON) -> JSON:
        names = self.reactions.setdefault(self._message_for_reaction(params), set())
        if params.get("name") in names:
            raise SlackError("already_reacted")
        names.add(str(params.get("name")))
        return {}

    def _reactions_remove(self, params: JSON) -> JSON:
        names = self.reactions.setdefault(self._message_for_reaction(params), set())
        if params.get("name") not in names:
            raise SlackError("no_reaction")
        names.discard(str(params.get("name")))
        return {}

    def _replies(self, params: JSON) -> JSON:
        """conversations.replies (docs.slack.dev/reference/methods/conversations.replies): the thread
        of ``ts`` (a parent or any message in the thread), parent first then replies, oldest first;
        ``latest``/``oldest`` bound the range (exclusive unless ``inclusive``); ``limit`` (default and
        most 1000) per page; ``cursor`` from ``response_metadata.next_cursor`` while ``has_more``.
        Errors: ``invalid_arguments`` (no ``channel``/``ts``), ``channel_not_found``, ``missing_scope``
        (``needed``, ``provided``), ``thread_not_found``, ``invalid_cursor``, ``invalid_limit``."""
        if not params.get("channel") or not params.get("ts"):
            raise SlackError("invalid_arguments")
        channel = str(params["channel"])
        with self._lock:
            messages = self._channel(params)
            needed = HISTORY_SCOPES.get(channel[:1], "channels:history")
            if needed not in self.scopes:
                raise SlackError("missing_scope", extra={"needed": needed, "provided": ",".join(sorted(self.scopes))})
            target = messages.get(str(params["ts"]))
            if target is None:
                raise SlackError("thread_not_found")
            parent_ts = str(target.get("thread_ts") or target["ts"])
            if parent_ts not in messages:
                raise SlackError("thread_not_found")
            thread = sorted((m for m in messages.values() if m["ts"] == parent_ts or m.get("thread_ts") == parent_ts),
                            key=lambda m: float(m["ts"]))
            parent = messages[parent_ts]
            replies = [m for m in thread if m["ts"] != parent_ts]
            wire = []
            for m in thread:
                out = {k: v for k, v in copy.deepcopy(m).items() if k != "mrkdwn_problems"}
                out.setdefault("type", "message")
                if m["ts"] == parent_ts and replies:
                    out.update(thread_ts=parent_ts, reply_count=len(replies),
                               reply_users=sorted({str(r.get("user")) for r in replies}),
                               latest_reply=replies[-1]["ts"])
                elif m["ts"] != parent_ts:
                    out.update(thread_ts=parent_ts, parent_user_id=parent.get("user"))
                wire.append(out)
        inclusive = str(params.get("inclusive", "")).lower() in ("1", "true")
        if params.get("latest"):
            latest = float(params["latest"])
            wire = [m for m in wire if float(m["ts"]) < latest or (inclusive and float(m["ts"]) == latest)]
        if params.get("oldest"):
            oldest = float(params["oldest"])
            wire = [m for m in wire if float(m["ts"]) > oldest or (inclusive and float(m["ts"]) == oldest)]
        try:
            limit = int(params.get("limit") or REPLIES_MAX_LIMIT)
        except ValueError:
            raise SlackError("invalid_limit") from None
        limit = min(max(limit, 1), REPLIES_MAX_LIMIT)
        start = 0
        if params.get("cursor"):
            try:
                after = base64.b64decode(str(params["cursor"]), validate=True).decode().removeprefix("next_ts:")
                start = next(i for i, m in enumerate(wire) if m["ts"] == after)
            except (ValueError, StopIteration, UnicodeDecodeError):
                raise SlackError("invalid_cursor") from None
        page = wire[start:start + limit]
        answer: JSON = {"messages": page, "has_more": start + limit < len(wire)}
        if answer["has_more"]:
            answer["response_metadata"] = {
                "next_cursor": base64.b64encode(f"next_ts:{wire[start + limit]['ts']}".encode()).decode()}
        return answer

    def _streaming_method(self, params: JSON, *required: str) -> None:
        if not self.streaming_methods:
            raise SlackError("unknown_method")
        self._require(params, "channel", *required)

    def _start_stream(self, params: JSON) -> JSON:
        """chat.startStream (docs.slack.dev/reference/methods/chat.startStream): ``channel``
        required; ``thread_ts`` (a known message: streams are replies), ``markdown_text`` (≤ 12,000
        characters), and outside DMs ``recipient_user_id`` + ``recipient_team_id`` (else
        ``invalid_arguments``). The message is ``streaming`` until chat.stopStream."""
        self._streaming_method(params)
        text = str(params.get("markdown_text") or "")
        if len(text) > 12_000:
            raise SlackError("msg_too_long")
        channel = str(params["channel"])
        if not channel.startswith("D") and not (params.get("recipient_user_id") and params.get("recipient_team_id")):
            raise SlackError("invalid_arguments")
        with self._lock:
            messages = self._channel(params)
            thread = str(params.get("thread_ts") or "")
            if not thread or (thread not in messages and (channel, thread) not in self.assistant_threads):
                raise SlackError("invalid_thread_ts" if thread else "invalid_arguments")
            ts = self._new_ts()
            messages[ts] = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id, "text": text,
                            "ts": ts, "team": self.team_id, "thread_ts": thread, "streaming": True,
                            "markdown": True, "mrkdwn_problems": []}
        return {"channel": channel, "ts": ts}

    def _streamed(self, params: JSON) -> JSON:
        msg = self._channel(params).get(str(params.get("ts") or ""))
        if msg is None:
            raise SlackError("message_not_found")
        if msg.get("user") != self.bot_user_id or not msg.get("streaming"):
            raise SlackError("message_not_in_streaming_state")
        return msg

    def _append_stream(self, params: JSON) -> JSON:
        """chat.appendStream: ``channel``, ``ts``, ``markdown_text`` required; the text is appended;
        ``message_not_in_streaming_state`` once stopped."""
        self._streaming_method(params, "ts", "markdown_text")
        text = str(params["markdown_text"])
        if not text or len(text) > 12_000:
            raise SlackError("no_text" if not text else "msg_too_long")
        with self._lock:
            msg = self._streamed(params)
            msg["text"] += text
        return {"channel": params["channel"], "ts": params["ts"]}

    def _stop_stream(self, params: JSON) -> JSON:
        """chat.stopStream: ``channel``, ``ts`` required, optional last ``markdown_text``; the message
        is final (and editable with chat.update) afterwards."""
        self._streaming_method(params, "ts")
        with self._lock:
            msg = self._streamed(params)
            msg["text"] += str(params.get("markdown_text") or "")
            msg["streaming"] = False
            return {"channel": params["channel"], "ts": params["ts"], "message": copy.deepcopy(msg)}

    @staticmethod
    def _require(params: JSON, *names: str) -> None:
        """Slack answers ``invalid_arguments`` when a required argument is missing."""
        if any(params.get(name) is None for name in names):
            raise SlackError("invalid_arguments")

    def _post_ephemeral(self, params: JSON) -> JSON:
        """chat.postEphemeral (docs.slack.dev/reference/methods/chat.postEphemeral): ``channel``,
        ``user``, ``text`` or ``blocks`` required; ``channel_not_found``, ``user_not_in_channel``
        (the user is not a known member here), ``no_text``, ``msg_too_long``. Returns
        ``message_ts``; nothing is stored in the channel (only that user sees it, once)."""
        self._require(params, "channel", "user")
        text = self._text(params)
        with self._lock:
            self._channel(params)
            if str(params["user"]) not in self.users:
                raise SlackError("user_not_in_channel")
            ts = self._new_ts()
            self.ephemeral.append({"via": "chat.postEphemeral", "channel": str(params["channel"]),
                                   "user": str(params["user"]), "text": text, "thread_ts": params.get("thread_ts"),
                                   "mrkdwn_problems": mrkdwn_problems(text)})
        return {"message_ts": ts}

    def _assistant_thread(self, params: JSON) -> tuple[str, str]:
        if not self.assistant_surface:
            raise SlackError("not_allowed_token_type")
        self._require(params, "channel_id", "thread_ts")
        with self._lock:
            self._channel(params, "channel_id")
            key = (str(params["channel_id"]), str(params["thread_ts"]))
            if key not in self.assistant_threads and key[1] not in self.channels[key[0]]:
                raise SlackError("invalid_thread_ts")
        return key

    def _set_status(self, params: JSON) -> JSON:
        """assistant.threads.setStatus (docs.slack.dev): ``channel_id``, ``thread_ts``, ``status``
        required (``""`` clears); ``loading_messages`` at most 10."""
        self._require(params, "status")
        channel, thread_ts = self._assistant_thread(params)
        if len(params.get("loading_messages") or []) > 10:
            raise SlackError("invalid_arguments")
        with self._lock:
            self.statuses.append((channel, thread_ts, str(params["status"])))
        return {}

    def _set_prompts(self, params: JSON) -> JSON:
        """assistant.threads.setSuggestedPrompts (docs.slack.dev): ``channel_id``, ``thread_ts``,
        ``prompts`` (1-4 objects with ``title`` and ``message``) required; ``title`` optional."""
        self._require(params, "prompts")
        key = self._assistant_thread(params)
        prompts = params["prompts"]
        if isinstance(prompts, str):
            prompts = json.loads(prompts)
        if not isinstance(prompts, list) or not 1 <= len(prompts) <= 4 or not all(
                isinstance(p, dict) and p.get("title") and p.get("message") for p in prompts):
            raise SlackError("invalid_arguments")
        with self._lock:
            self.prompts[key] = {"prompts": prompts, "title": params.get("title")}
        return {}

    def assistant_thread_started(self, *, user: str = "U0ALICE001", channel: str = "D0ALICE001",
                                 context_channel: str = "C0GENERAL1") -> JSON:
        """A user opens the app's assistant container: the thread is created (a new ``thread_ts``)
        and the ``assistant_thread_started`` event to deliver is returned (post or push it)."""
        with self._lock:
            self.channels.setdefault(channel, {})
            thread_ts = self._new_ts()
            self.assistant_threads.add((channel, thread_ts))
        return {"type": "assistant_thread_started", "event_ts": thread_ts,
                "assistant_thread": {"user_id": user, "channel_id": channel, "thread_ts": thread_ts,
                                     "context": {"channel_id": context_channel, "team_id": self.team_id,
                                                 "enterprise_id": None}}}

    # ---- slash commands ------------------------------------------------------------------------

    def command_payload(self, command: str, text: str = "", *, user: str = "U0ALICE001",
                        channel: str = "D0ALICE001") -> dict[str, str]:
        """The fields Slack sends for a slash command typed by ``user`` in ``channel``, with a fresh
        ``response_url`` (5 uses, 30 minutes) and ``trigger_id``."""
        n = next(self._envelopes)
        path = f"/commands/{self.team_id}/{n:013d}/hook{n:06d}{hashlib.sha256(str(n).encode()).hexdigest()[:16]}"
        with self._lock:
            self._hooks[path] = {"channel": channel, "user": user, "uses": 0, "expires": time.time() + 1800}
        return {"token": "FakeLegacyVerificationToken0001", "team_id": self.team_id, "team_domain": "fake-workspace",
                "channel_id": channel, "channel_name": "directmessage" if channel.startswith("D") else channel.lower(),
                "user_id": user, "user_name": self.users.get(user, user).lower(), "command": command, "text": text,
                "api_app_id": self.api_app_id, "is_enterprise_install": "false",
                "response_url": f"{self.url}{path}", "trigger_id": f"{n}.{n * 7}.fake{n:08x}"}

    def expire_response_url(self, response_url: str) -> None:
        """Makes a command's ``response_url`` expired (as after 30 minutes)."""
        with self._lock:
            self._hooks[response_url.removeprefix(self.url)]["expires"] = 0.0

    async def post_command(self, url: str, fields: dict[str, str], *, probe: str | None = None,
                           timeout: float = 10) -> EventDelivery:
        """POSTs a slash command as Slack does: form-encoded ``fields``, signed (``probe``:
        ``"bad_signature"`` signs with another secret). Returns (and records) the delivery."""
        from urllib.parse import urlencode

        body = urlencode(fields).encode()
        timestamp = int(time.time())
        secret = b"not-the-secret" if probe == "bad_signature" else self.signing_secret.encode()
        signature = "v0=" + hmac.new(secret, b"v0:%d:" % timestamp + body, hashlib.sha256).hexdigest()
        headers = {"Content-Type": "application/x-www-form-urlencoded",
                   "X-Slack-Request-Timestamp": str(timestamp), "X-Slack-Signature": signature}
        started = time.monotonic()
        async with aiohttp.ClientSession() as session, session.post(
                url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            delivery = EventDelivery(resp.status, await resp.text(), time.monotonic() - started, dict(resp.headers))
        self.deliveries.append(delivery)
        return delivery

    def push_command(self, fields: dict[str, str]) -> str:
        """Sends a slash command over Socket Mode (a ``slash_commands`` frame, ``accepts_response_payload``
        true); returns the envelope id (its ack is in ``acks``)."""
        frame = {"envelope_id": f"fake-envelope-cmd-{next(self._envelopes)}", "type": "slash_commands",
                 "accepts_response_payload": True, "payload": fields}
        return self.push(frame)

    async def _handle_response_url(self, request: web.Request) -> web.StreamResponse:
        """A command's ``response_url`` (Slack "Handling interaction responses"): JSON ``text`` (or
        ``blocks``), ``response_type`` ``ephemeral`` (default) or ``in_channel``; 200 ``ok``. 404
        ``expired_url`` after 30 minutes, ``used_url`` after 5 uses, ``no_text`` without text; an
        unknown URL 404 ``invalid_token``. No bot token is needed (the URL is the credential)."""
        with self._lock:
            hook = self._hooks.get(request.path)
        if hook is None:
            return web.Response(status=404, text="invalid_token")
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        with self._lock:
            if hook["expires"] < time.time():
                return web.Response(status=404, text="expired_url")
            if hook["uses"] >= 5:
                return web.Response(status=404, text="used_url")
            if not isinstance(body, dict) or not (body.get("text") or body.get("blocks")):
                return web.Response(status=400, text="no_text")
            hook["uses"] += 1
            if body.get("response_type", "ephemeral") == "in_channel":
                ts = self._new_ts()
                self.channels.setdefault(hook["channel"], {})[ts] = {
                    "type": "message", "user": self.bot_user_id, "bot_id": self.bot_id, "text": str(body["text"]),
                    "ts": ts, "team": self.team_id}
            else:
                text = str(body.get("text") or "")
                self.ephemeral.append({"via": "response_url", "channel": hook["channel"], "user": hook["user"],
                                       "text": text, "thread_ts": None, "mrkdwn_problems": mrkdwn_problems(text)})
        return web.Response(text="ok")

    def _connections_open(self, params: JSON) -> JSON:
        return {"url": f"ws://127.0.0.1:{self.port}/link"}


async def post_interaction(fake: FakeSlack, url: str, payload: JSON) -> EventDelivery:
    """POSTs a signed interactivity payload (``block_actions``) as Slack does: a form body
    ``payload=<JSON>`` (Slack interactivity: request URL, ``application/x-www-form-urlencoded``)."""
    from urllib.parse import urlencode

    body = urlencode({"payload": json.dumps(payload)}).encode()
    timestamp = int(time.time())
    headers = {"Content-Type": "application/x-www-form-urlencoded",
               "X-Slack-Request-Timestamp": str(timestamp), "X-Slack-Signature": fake.sign(body, timestamp)}
    started = time.monotonic()
    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as resp:
        return EventDelivery(resp.status, await resp.text(), time.monotonic() - started, dict(resp.headers))
