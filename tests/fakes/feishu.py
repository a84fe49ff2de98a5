"""A wire-level fake of the Feishu/Lark open API (and its event push) for the real lark-oapi to talk to.

Point lark-oapi at it with ``lark.Client.builder().domain(fake.url)`` and ``lark.ws.Client(domain=fake.url)``.
What is emulated follows PLATFORMS.md §3.4 and the Feishu open platform docs (im/v1 message create,
reply, update, patch; auth/v3 tenant_access_token; event subscription, encryption and signatures;
the long connection's protobuf frames):

- the ``{"code", "msg", "data"}`` envelope; tenant tokens ``t-<n>`` with ``expire``; a missing, unknown,
  revoked or expired Bearer token answers ``invalid_token_status`` (HTTP 400 by default) + 99991663;
- ``receive_id_type`` required; ``content`` must be a JSON string whose object matches ``msg_type``
  (a post's ``a`` elements need an ``http(s)://`` ``href``, else 230001; a card's markdown holds at
  most five tables, else 230099 with ErrCode 11310);
  request bodies over 150 KB (text) / 30 KB (post, interactive) answer 230025; ``uuid`` (≤ 50 chars)
  dedupes creates and replies (the first message is returned again, nothing new is stored);
- reply targets must exist (messages learned from posted events, seeded with ``seed_message``, or sent
  by the bot); ``GET …/messages/{id}`` returns one, ``GET …/messages?container_id_type=chat|thread``
  lists a chat's or thread's (``page_size`` ≤ 50, ``sort_type``, ``page_token``/``has_more``), both
  refused with 99991672 while ``can_read_messages`` is false; ``reply_in_thread``
  puts the reply in the target's thread (a new ``omt_`` one when it had none); edits (PUT) ≤ 20 per
  message and only of the bot's text/post messages; PATCH only on interactive cards sent with
  ``config.update_multi: true`` (shared cards);
- card callbacks: ``card_action`` builds the ``card.action.trigger`` body Feishu sends when a user
  presses a button of a card the bot sent (the button must be on the card); post it with
  ``post_event`` (webhook) or ``ws_push`` (long connection);
- canned faults per route (``fail_next``), e.g. 429 + 99991400 + ``x-ogw-ratelimit-reset``;
- event push: ``post_event`` sends plaintext or ``{"encrypt"}`` bodies (AES-256-CBC, key = SHA-256 of
  the encrypt key, base64 of IV + ciphertext) with ``X-Lark-Request-Timestamp/-Nonce/-Signature``;
- long connection: ``POST /callback/ws/endpoint`` and a ``/ws`` WebSocket speaking ``pbbp2.Frame``;
  ``ws_push`` sends a data frame and waits for the client's echoed ack.

Every call is recorded as a ``Call`` with the decoded ``content``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import itertools
import json
import os
import re
import threading
import time
import uuid as uuid_lib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pyromark
from aiohttp import web
from Crypto.Cipher import AES
from lark_oapi.ws.pb.pbbp2_pb2 import Frame

from tests.fakes.feishu_uploads import FeishuUploads
from tests.fakes.server import ThreadedServer

JSON = dict[str, Any]
TEXT_BODY_LIMIT = 150 * 1024  # Feishu: text message request body ≤ 150 KB
CARD_BODY_LIMIT = 30 * 1024  # Feishu: post / interactive request body ≤ 30 KB
MAX_EDITS = 20  # Feishu: a message can be edited at most 20 times
CARD_TABLE_LIMIT = 5  # Feishu cards, table component: "单张卡片最多支持放置五个表格组件"; markdown tables count
INVALID_TOKEN = 99991663
RECEIVE_ID_TYPES = {"chat_id", "open_id", "user_id", "union_id", "email"}
LOCALES = {"zh_cn", "en_us", "ja_jp", "zh_hk", "zh_tw"}
POST_TAGS = {"text", "a", "at", "img", "media", "emotion", "hr", "code_block", "md"}
MSG_TYPES = {"text", "post", "image", "file", "audio", "media", "sticker", "interactive", "share_chat", "share_user"}


@dataclass
class Call:
    """One recorded API call: ``route`` (``token``, ``bot_info``, ``create``, ``reply``, ``update``,
    ``patch``, ``get``, ``list``, ``delete``, ``reaction``, ``reaction_delete``, ``resource``, ``user``, ``images``,
    ``files``, ``ws_endpoint``),
    the HTTP ``method``/``path``/``query``, the JSON ``body``, the decoded ``content`` (or ``None``), the
    Bearer ``token`` and what the fake answered (``status``, Feishu ``code``). ``time`` is monotonic."""

    time: float
    route: str
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content: Any = None
    token: str | None = None
    status: int = 200
    code: int = 0
    message_id: str | None = field(default=None, repr=False)


class ApiError(Exception):
    """A Feishu error answer: HTTP ``status``, ``code``, ``msg`` and optional headers."""

    def __init__(self, status: int, code: int, msg: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(msg)
        self.status, self.code, self.msg, self.headers = status, code, msg, headers or {}

    def response(self) -> web.Response:
        return web.json_response({"code": self.code, "msg": self.msg, "data": {}}, status=self.status,
                                 headers=self.headers)


def _bad_content(detail: str) -> ApiError:
    return ApiError(400, 230001, f"Your request contains an invalid request parameter: {detail}")


def validate_content(msg_type: str, content: Any) -> Any:
    """Decodes ``content`` (a JSON string) and checks it matches ``msg_type``; raises ``ApiError`` 230001."""
    if msg_type not in MSG_TYPES:
        raise ApiError(400, 230001, f"invalid msg_type {msg_type!r}")
    if not isinstance(content, str):
        raise _bad_content("content must be a JSON string")
    try:
        decoded = json.loads(content)
    except ValueError:
        raise _bad_content("content is not valid JSON") from None
    if not isinstance(decoded, dict):
        raise _bad_content("content must be a JSON object")
    if msg_type == "text":
        if not isinstance(decoded.get("text"), str) or not decoded["text"].strip():
            raise _bad_content("text content needs a non-empty text")
    elif msg_type == "post":
        locales = [k for k in decoded if k in LOCALES]
        if not locales:
            raise _bad_content("post content needs a locale such as zh_cn")
        for locale in locales:
            rows = decoded[locale].get("content") if isinstance(decoded[locale], dict) else None
            if not isinstance(rows, list) or not rows:
                raise _bad_content("post content needs a non-empty content array")
            for row in rows:
                if not isinstance(row, list):
                    raise _bad_content("post rows must be arrays")
                for element in row:
                    if not isinstance(element, dict) or element.get("tag") not in POST_TAGS:
                        raise _bad_content(f"unknown post element {element!r:.60}")
                    if element["tag"] in ("text", "a", "code_block", "md") and not isinstance(element.get("text"), str):
                        raise _bad_content(f"{element['tag']} element needs text")
                    if element["tag"] == "a" and not element.get("href"):
                        raise _bad_content("a element needs href")
                    if element["tag"] == "a" and not re.match(r"(?i)https?://", str(element["href"])):
                        # Feishu takes only http(s) links in a post (others: 230001 "invalid href",
                        # "scheme not in scheme whitelist"; reported by openabdev/openab#1328 and
                        # chenhg5/cc-connect#83 for file://, data:, ftp:// and relative links).
                        raise _bad_content(f"invalid href {element['href']!r:.80}: scheme not in scheme whitelist")
                    if element["tag"] in ("code_block", "hr", "md") and len(row) != 1:
                        raise _bad_content(f"{element['tag']} must be alone in its paragraph")
    elif msg_type == "interactive":
        if not any(k in decoded for k in ("elements", "body", "header", "type")):
            raise _bad_content("interactive content is not a card")
        tables = sum(_markdown_tables(str(el.get("content") or ""))
                     for el in card_elements(decoded) if el.get("tag") == "markdown")
        if tables > CARD_TABLE_LIMIT:  # the body Feishu answers (larksuite/openclaw-lark#53, sipeed/picoclaw#1727)
            raise ApiError(400, 230099, "Failed to create card content, ext=ErrCode: 11310; ErrMsg: card table number "
                                        "over limit; ErrorValue: table; ")
    elif msg_type == "image" and not decoded.get("image_key"):
        raise _bad_content("image content needs image_key")
    elif msg_type in ("file", "audio", "media", "sticker") and not decoded.get("file_key"):
        raise _bad_content(f"{msg_type} content needs file_key")
    return decoded


def _markdown_tables(markdown: str) -> int:
    """GFM tables in a card's markdown (CommonMark + tables, as the card renders them)."""
    return sum(1 for event in pyromark.events(markdown, options=pyromark.Options.ENABLE_TABLES)
               if isinstance(event, dict) and isinstance(event.get("Start"), dict) and "Table" in event["Start"])


def _dig(value: Any, *keys: str) -> Any:
    """``value[k1][k2]…`` when every level is an object, else ``None`` (hostile events nest anything)."""
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def encrypt_body(plaintext: bytes, encrypt_key: str, iv: bytes | None = None) -> str:
    """Feishu event encryption: base64(IV + AES-256-CBC(PKCS#7(plaintext))), key = SHA-256(encrypt_key)."""
    iv = iv or os.urandom(16)
    pad = 16 - len(plaintext) % 16
    cipher = AES.new(hashlib.sha256(encrypt_key.encode()).digest(), AES.MODE_CBC, iv)
    return base64.b64encode(iv + cipher.encrypt(plaintext + bytes([pad]) * pad)).decode()


def signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """``X-Lark-Signature``: hex SHA-256 of timestamp + nonce + encrypt key + raw body."""
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()


def card_elements(content: Any) -> list[JSON]:
    """The elements of a decoded card (JSON 2.0 ``body.elements`` or 1.0 ``elements``), nested ones
    (columns) flattened, in order."""
    found: list[JSON] = []

    def walk(elements: Any) -> None:
        for element in elements or ():
            if isinstance(element, dict):
                found.append(element)
                walk(element.get("elements"))
                walk(element.get("columns"))
                walk(element.get("actions"))

    walk(((content or {}).get("body") or {}).get("elements") or (content or {}).get("elements"))
    return found


def post_text(content: Any) -> str:
    """The visible text of a decoded ``post`` (rows joined by newlines), ``text`` or card content
    (its markdown and plain text elements joined by newlines)."""
    if isinstance(content, dict) and "text" in content:
        return str(content["text"])
    if isinstance(content, dict) and ("body" in content or "elements" in content):
        texts = [str(el.get("content") if el.get("tag") == "markdown" else (el.get("text") or {}).get("content", ""))
                 for el in card_elements(content) if el.get("tag") in ("markdown", "div")]
        return "\n".join(texts)
    locale = next((v for k, v in (content or {}).items() if k in LOCALES), {})
    return "\n".join("".join(str(el.get("text", "")) for el in row) for row in locale.get("content", []))


class FakeFeishu(ThreadedServer):
    """Fake Feishu open API on 127.0.0.1 (PLATFORMS.md §3.4); the defaults are the fixture app.

    Test-facing state: ``resources`` (key -> bytes for message resources), ``users`` (open_id -> name
    for contact/v3 users), ``invalid_token_status``
    (HTTP status sent with 99991663), ``token_ttl`` (seconds, the ``expire`` of new tokens),
    ``latency`` (seconds per API route) and ``event_deliveries`` (``(status, seconds)`` of each
    ``post_event``).
    """

    def __init__(self, app_id: str = "cli_fake00000000001", app_secret: str = "fake-app-secret-0001",
                 bot_open_id: str = "ou_fakebot000000000000000000000001",
                 verification_token: str = "fake-verification-token-0001",
                 encrypt_key: str = "fake-encrypt-key-0001", tenant_key: str = "fake_tenant_0001",
                 port: int = 0) -> None:
        super().__init__(port)
        self.app_id, self.app_secret, self.bot_open_id = app_id, app_secret, bot_open_id
        self.verification_token, self.encrypt_key, self.tenant_key = verification_token, encrypt_key, tenant_key
        self.token_ttl = 7200
        self.invalid_token_status = 400
        self.resources: dict[str, bytes] = {}
        self._resource_of: dict[str, tuple[str, str]] = {}  # key -> (message id, type)
        self.users: dict[str, str] = {"ou_fakealice00000000000000000000001": "Alice",
                                      "ou_fakebob000000000000000000000001": "Bob"}
        self.event_deliveries: list[tuple[int, float]] = []
        self.latency: dict[str, float] = {}
        """Route name (``bot_info``, ``create``, ...) -> seconds the fake waits before answering."""
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._faults: dict[str, deque[ApiError]] = {}
        self._limited: dict[str, float] = {}  # route -> monotonic time its rate limit lifts
        self._tokens: dict[str, float] = {}  # token -> expiry (time.time())
        self._token_ids = itertools.count(1)
        self._message_ids = itertools.count(1)
        self._thread_ids = itertools.count(1)
        self._reaction_ids = itertools.count(1)
        self._messages: dict[str, JSON] = {}
        self._order: list[str] = []
        self._uuids: dict[str, str] = {}
        self._reactions: dict[str, JSON] = {}
        self._ws: list[web.WebSocketResponse] = []
        self._ws_acks: dict[str, JSON] = {}
        self.ws_endpoint_hangs = 0
        """The next this-many ``/callback/ws/endpoint`` calls never answer (a silent network)."""
        self.can_read_messages = True
        """The app holds a message-read permission (``get`` and ``list`` answer 99991672 otherwise)."""
        self.uploads = FeishuUploads(self)
        """Image and file uploads (``tests.fakes.feishu_uploads``): ``uploads.images``, ``uploads.holds``."""

    # ---- test-facing API -------------------------------------------------------------------------

    def reset(self) -> None:
        """Forgets calls, messages, ``uuid``s, reactions and queued faults (issued tokens stay valid).
        Each test's gateway starts with a fresh database whose idempotency keys repeat, and Feishu
        keeps one message per ``uuid`` for an hour: tests reset the fake instead of reusing uuids."""
        with self._lock:
            self._calls.clear()
            self._faults.clear()
            self._limited.clear()
            self._messages.clear()
            self._order.clear()
            self._uuids.clear()
            self._reactions.clear()
            self._ws_acks.clear()
        self.uploads.reset()
        self.event_deliveries.clear()
        self.latency.clear()
        self.invalid_token_status = 400
        self.ws_endpoint_hangs = 0
        self.can_read_messages = True

    def calls(self, route: str | None = None) -> list[Call]:
        """Recorded calls in arrival order, optionally only those of ``route``."""
        with self._lock:
            return [c for c in self._calls if route is None or c.route == route]

    async def wait_for_call(self, route: str, predicate: Callable[[Call], bool] | None = None,
                            timeout: float = 5.0) -> Call:
        """Waits (polling every 10 ms, from any loop) for a recorded successful ``route`` call matching
        ``predicate``. Raises ``TimeoutError`` listing the calls seen."""
        deadline = time.monotonic() + timeout
        while True:
            for call in self.calls(route):
                if call.code == 0 and (predicate is None or predicate(call)):
                    return call
            if time.monotonic() >= deadline:
                seen = [(c.route, c.status, c.code) for c in self.calls()]
                raise TimeoutError(f"no matching {route} call within {timeout} s; calls: {seen}")
            await asyncio.sleep(0.01)

    def sent(self, chat_id: str | None = None) -> list[JSON]:
        """Messages the bot created (create or reply), in order, with ``content`` decoded."""
        with self._lock:
            msgs = [copy.deepcopy(self._messages[i]) for i in self._order]
        return [m for m in msgs if m["sender_type"] == "app" and (chat_id is None or m["chat_id"] == chat_id)]

    def reactions(self) -> list[JSON]:
        """Reactions currently on messages: ``{"reaction_id", "message_id", "emoji_type"}``."""
        with self._lock:
            return [dict(r) for r in self._reactions.values()]

    @property
    def tokens_issued(self) -> int:
        with self._lock:
            return len([c for c in self._calls if c.route == "token" and c.code == 0])

    def revoke_tokens(self) -> None:
        """Invalidates every token issued so far (as if they expired or were reset)."""
        with self._lock:
            self._tokens.clear()

    def fail_next(self, route: str, status: int, code: int, msg: str = "",
                  headers: dict[str, str] | None = None) -> None:
        """Queues a canned answer for the next call of ``route`` (the call is still recorded; no state
        changes), e.g. ``fail_next("reply", 429, 99991400, headers={"x-ogw-ratelimit-reset": "1"})``."""
        msg = msg or {99991400: "request trigger frequency limit", 230020: "The chat is being rate limited",
                      INVALID_TOKEN: "Invalid access token for authorization."}.get(code, "error")
        with self._lock:
            self._faults.setdefault(route, deque()).append(ApiError(status, code, msg, headers))

    def rate_limit(self, route: str, seconds: float) -> None:
        """Frequency control on ``route`` for ``seconds``: every call meanwhile is answered HTTP 429,
        code 99991400, with ``x-ogw-ratelimit-reset`` = the whole seconds left (Feishu "Rate limits":
        "Recovery period for limit, unit: second"; under a second left reads ``0``)."""
        with self._lock:
            self._limited[route] = time.monotonic() + seconds

    def drop_ws(self) -> None:
        """Closes every long connection from the server side (a Feishu host restarting)."""
        async def close() -> None:
            for ws in list(self._ws):
                await ws.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)

    def text_event(self, text: str, *, chat_id: str = "oc_fakep2p000000000000000000000001", chat_type: str = "p2p",
                   sender: str = "ou_fakealice00000000000000000000001", mention_bot: bool = False,
                   mentions: list[tuple[str, str]] = (), thread_id: str | None = None,
                   message_id: str | None = None, event_id: str | None = None, message_type: str = "text",
                   content: JSON | None = None, parent_id: str = "", root_id: str = "") -> JSON:
        """A schema 2.0 ``im.message.receive_v1`` body. ``mention_bot`` prefixes ``@_user_1`` (the bot);
        ``mentions`` adds ``(open_id, name)`` users as ``@_user_2…`` (append their keys to ``text``
        yourself); ``parent_id`` makes it a reply to that message. Ids default to fresh unique values."""
        people = ([(self.bot_open_id, "Gateway")] if mention_bot else []) + list(mentions)
        entries = [{"key": f"@_user_{i}", "id": {"open_id": oid, "union_id": "", "user_id": ""}, "name": name,
                    "tenant_key": self.tenant_key} for i, (oid, name) in enumerate(people, start=1)]
        if mention_bot and message_type == "text":
            text = f"@_user_1 {text}"
        now = str(int(time.time() * 1000))
        message: JSON = {
            "message_id": message_id or f"om_evt{uuid_lib.uuid4().hex[:24]}", "root_id": root_id or parent_id,
            "parent_id": parent_id,
            "create_time": now, "update_time": now, "chat_id": chat_id, "chat_type": chat_type,
            "message_type": message_type, "content": json.dumps(content if content is not None else {"text": text}),
            "mentions": entries,
        }
        if thread_id:
            message["thread_id"] = thread_id
        return {
            "schema": "2.0",
            "header": {"event_id": event_id or uuid_lib.uuid4().hex, "token": self.verification_token,
                       "create_time": now, "event_type": "im.message.receive_v1", "tenant_key": self.tenant_key,
                       "app_id": self.app_id},
            "event": {"sender": {"sender_id": {"open_id": sender, "union_id": "", "user_id": ""},
                                 "sender_type": "user", "tenant_key": self.tenant_key}, "message": message},
        }

    def card_action(self, message_id: str, label: str, *, operator: str = "ou_fakealice00000000000000000000001",
                    event_id: str | None = None) -> JSON:
        """The ``card.action.trigger`` callback body (schema 2.0) for ``operator`` pressing the button
        labelled ``label`` on the bot's card ``message_id``, as Feishu sends it: ``action.value`` is
        the button's value. Raises ``LookupError`` when the card has no such button."""
        with self._lock:
            message = copy.deepcopy(self._messages.get(message_id))
        if message is None or message["msg_type"] != "interactive":
            raise LookupError(f"{message_id} is not a card the bot sent")
        button = next((el for el in card_elements(message["content"]) if el.get("tag") == "button"
                       and (el.get("text") or {}).get("content") == label), None)
        if button is None:
            raise LookupError(f"card {message_id} has no button {label!r}")
        return {
            "schema": "2.0",
            "header": {"event_id": event_id or uuid_lib.uuid4().hex, "token": self.verification_token,
                       "create_time": str(int(time.time() * 1000)), "event_type": "card.action.trigger",
                       "tenant_key": self.tenant_key, "app_id": self.app_id},
            "event": {"operator": {"tenant_key": self.tenant_key, "open_id": operator, "user_id": "", "union_id": ""},
                      "token": f"c-{uuid_lib.uuid4().hex}", "host": "im_message",
                      "action": {"tag": "button", "value": button.get("value") or {}},
                      "context": {"open_message_id": message_id, "open_chat_id": message["chat_id"]}},
        }

    def encrypt(self, plaintext: bytes) -> str:
        return encrypt_body(plaintext, self.encrypt_key)

    async def post_event(self, url: str, body: JSON | None = None, *, raw: bytes | None = None,
                         encrypt: bool = False, sign: bool | None = None, sign_key: str | None = None,
                         headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """POSTs an event to the gateway like Feishu's event push; usable from the test's loop.

        ``raw`` sends those bytes as they are; otherwise ``body`` is JSON-encoded and, with ``encrypt``,
        wrapped as ``{"encrypt": ...}``. ``sign`` (default: same as ``encrypt``; Feishu signs only when
        an encrypt key is set) adds the timestamp/nonce/signature headers computed with ``sign_key``
        (default: the app's encrypt key). Message events are learned so replies can target them.
        Returns ``(status, parsed JSON or text)``; ``event_deliveries`` gets ``(status, seconds)``."""
        if body is not None:
            self._learn(body)
        payload = raw if raw is not None else json.dumps(body).encode()
        if raw is None and encrypt:
            payload = json.dumps({"encrypt": self.encrypt(payload)}).encode()
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if sign if sign is not None else encrypt:
            timestamp, nonce = str(int(time.time())), uuid_lib.uuid4().hex
            all_headers.update({"X-Lark-Request-Timestamp": timestamp, "X-Lark-Request-Nonce": nonce,
                                "X-Lark-Signature": signature(timestamp, nonce, sign_key or self.encrypt_key, payload)})
        started = time.monotonic()
        async with aiohttp.ClientSession() as session, session.post(
                url, data=payload, headers=all_headers, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            text = await resp.text()
            status = resp.status
        self.event_deliveries.append((status, time.monotonic() - started))
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    # ---- long connection -------------------------------------------------------------------------

    async def wait_ws_connected(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._ws:
            if time.monotonic() >= deadline:
                raise TimeoutError("no long-connection client connected")
            await asyncio.sleep(0.01)

    async def ws_push(self, body: JSON, timeout: float = 5.0) -> JSON:
        """Sends ``body`` as an event data frame to the connected client (from any loop) and returns its
        ack payload (``{"code": 200}`` when handled)."""
        self._learn(body)
        frame_id = uuid_lib.uuid4().hex
        future = asyncio.run_coroutine_threadsafe(self._ws_send_event(frame_id, body), self.loop)
        await asyncio.wrap_future(future)
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                ack = self._ws_acks.get(frame_id)
            if ack is not None:
                return ack
            if time.monotonic() >= deadline:
                raise TimeoutError("the long-connection client did not ack the event")
            await asyncio.sleep(0.01)

    async def _ws_send_event(self, frame_id: str, body: JSON) -> None:
        frame = Frame()
        frame.SeqID, frame.LogID, frame.service, frame.method = 1, 1, 7, 1
        for key, value in (("type", "event"), ("message_id", frame_id), ("sum", "1"), ("seq", "0"),
                           ("trace_id", frame_id)):
            header = frame.headers.add()
            header.key, header.value = key, value
        frame.payload = json.dumps(body).encode()
        await self._ws[-1].send_bytes(frame.SerializeToString())

    async def _ws_endpoint(self, request: web.Request) -> web.Response:
        """The long connection bootstrap; ``fail_next("ws_endpoint", ...)`` and ``ws_endpoint_hangs``
        make it fail (canned answer) or never answer."""
        body = await request.json()
        ok = body.get("AppID") == self.app_id and body.get("AppSecret") == self.app_secret
        self._record(Call(time.monotonic(), "ws_endpoint", "POST", request.path, {}, {"AppID": body.get("AppID")},
                          code=0 if ok else 10014))
        with self._lock:
            hang = self.ws_endpoint_hangs > 0
            self.ws_endpoint_hangs -= 1 if hang else 0
        if hang:  # until the client gives up and disconnects
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.05)
            return web.Response(status=504)
        fault = self._fault("ws_endpoint")
        if fault is not None:
            return fault.response()
        if not ok:
            return web.json_response({"code": 10014, "msg": "app secret invalid"})
        return web.json_response({"code": 0, "msg": "ok", "data": {
            "URL": f"ws://127.0.0.1:{self.port}/ws?device_id=fake-device&service_id=7",
            "ClientConfig": {"ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 0,
                             "PingInterval": 30}}})

    async def _ws_handler(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._ws.append(ws)
        try:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.BINARY:
                    continue
                frame = Frame()
                frame.ParseFromString(msg.data)
                headers = {h.key: h.value for h in frame.headers}
                if frame.method == 0 and headers.get("type") == "ping":
                    pong = Frame()
                    pong.CopyFrom(frame)
                    for h in pong.headers:
                        if h.key == "type":
                            h.value = "pong"
                    await ws.send_bytes(pong.SerializeToString())
                elif frame.method == 1:
                    with self._lock:
                        self._ws_acks[headers.get("message_id", "")] = json.loads(frame.payload or b"{}")
        finally:
            self._ws.remove(ws)
        return ws

    # ---- plumbing --------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)  # uploads: files up to 30 MB
        base = "/open-apis/im/v1/messages"
        app.add_routes([
            web.post("/open-apis/auth/v3/tenant_access_token/internal", self._token),
            web.get("/open-apis/bot/v3/info", self._api("bot_info", self._bot_info)),
            web.post(base, self._api("create", self._create)),
            web.post(base + "/{message_id}/reply", self._api("reply", self._reply)),
            web.put(base + "/{message_id}", self._api("update", self._update)),
            web.patch(base + "/{message_id}", self._api("patch", self._patch)),
            web.get(base, self._api("list", self._list)),
            web.get(base + "/{message_id}", self._api("get", self._get)),
            web.delete(base + "/{message_id}", self._api("delete", self._delete)),
            web.post(base + "/{message_id}/reactions", self._api("reaction", self._reaction)),
            web.delete(base + "/{message_id}/reactions/{reaction_id}", self._api("reaction_delete",
                                                                                   self._reaction_delete)),
            web.get(base + "/{message_id}/resources/{key}", self._resource),
            web.get("/open-apis/contact/v3/users/{user_id}", self._api("user", self._user)),
            web.post("/callback/ws/endpoint", self._ws_endpoint),
            web.get("/ws", self._ws_handler),
            *self.uploads.routes(),
        ])
        return app

    def _record(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)

    def _fault(self, route: str) -> ApiError | None:
        with self._lock:
            faults = self._faults.get(route)
            if faults:
                return faults.popleft()
            left = self._limited.get(route, 0.0) - time.monotonic()
        if left > 0:
            return ApiError(429, 99991400, "request trigger frequency limit",
                            {"x-ogw-ratelimit-reset": str(int(left))})
        return None

    def _learn(self, body: JSON) -> None:
        """Remembers a user message from an event (so replies to it can be validated and the message
        APIs can return it); a malformed event (tests send those too) is not Feishu's and is not learned."""
        event = body.get("event") if isinstance(body, dict) else None
        message = event.get("message") if isinstance(event, dict) else None
        if not isinstance(message, dict) or not isinstance(message.get("message_id"), str) or not message["message_id"]:
            return
        try:
            content = json.loads(message.get("content") or "null")
        except (TypeError, ValueError):
            content = None
        sender = _dig(event, "sender", "sender_id", "open_id")
        listed = message.get("mentions")
        mentions = [{"key": m.get("key"), "id": _dig(m, "id", "open_id") or "", "id_type": "open_id",
                     "name": m.get("name"), "tenant_key": self.tenant_key}
                    for m in (listed if isinstance(listed, list) else ()) if isinstance(m, dict)]
        self._keep_user_message({
            "message_id": message["message_id"], "chat_id": message.get("chat_id", ""),
            "thread_id": message.get("thread_id") or "", "root_id": message.get("root_id") or "",
            "parent_id": message.get("parent_id") or "", "msg_type": message.get("message_type", "text"),
            "content": content, "sender_type": "user", "sender": str(sender or ""), "edits": 0,
            "create_time": str(message.get("create_time") or int(time.time() * 1000)), "mentions": mentions,
        })

    def _keep_user_message(self, message: JSON) -> None:
        with self._lock:
            if message["message_id"] not in self._messages:
                self._messages[message["message_id"]] = message
                self._order.append(message["message_id"])

    def seed_message(self, text: str, *, chat_id: str, sender: str = "ou_fakealice00000000000000000000001",
                     thread_id: str = "", parent_id: str = "", root_id: str = "", create_ms: int | None = None,
                     message_id: str | None = None, msg_type: str = "text", content: JSON | None = None) -> str:
        """A user message Feishu has but the gateway never received as an event (sent before the bot
        was mentioned, or in a thread it is not part of); returns its ``message_id``."""
        message_id = message_id or f"om_seed{uuid_lib.uuid4().hex[:24]}"
        self._keep_user_message({
            "message_id": message_id, "chat_id": chat_id, "thread_id": thread_id, "root_id": root_id,
            "parent_id": parent_id, "msg_type": msg_type, "content": content if content is not None else {"text": text},
            "sender_type": "user", "sender": sender, "edits": 0,
            "create_time": str(create_ms if create_ms is not None else int(time.time() * 1000)), "mentions": [],
        })
        return message_id

    async def _token(self, request: web.Request) -> web.Response:
        body = await request.json()
        call = Call(time.monotonic(), "token", "POST", request.path, {}, {"app_id": body.get("app_id")})
        fault = self._fault("token")
        if fault is None and body.get("app_id") != self.app_id:
            fault = ApiError(400, 10003, "invalid param")  # Feishu: an app id it does not know
        elif fault is None and body.get("app_secret") != self.app_secret:
            fault = ApiError(400, 10014, "app secret invalid")
        if fault is not None:
            call.status, call.code = fault.status, fault.code
            self._record(call)
            return fault.response()
        token = f"t-{next(self._token_ids)}"
        with self._lock:
            self._tokens[token] = time.time() + self.token_ttl
        call.content = {"token": token}
        self._record(call)
        return web.json_response({"code": 0, "msg": "ok", "tenant_access_token": token, "expire": self.token_ttl})

    def _api(self, route: str, handler: Callable[..., Any]) -> Callable[[web.Request], Any]:
        async def endpoint(request: web.Request) -> web.Response:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            auth = request.headers.get("Authorization", "")
            token = auth[7:] if auth.startswith("Bearer ") else None
            call = Call(time.monotonic(), route, request.method, request.path, dict(request.query), body, token=token)
            if self.latency.get(route):
                await asyncio.sleep(self.latency[route])  # a slow network or a busy open platform
            try:
                with self._lock:
                    expiry = self._tokens.get(token or "")
                if expiry is None or expiry < time.time():
                    raise ApiError(self.invalid_token_status, INVALID_TOKEN,
                                   "Invalid access token for authorization. Please make a request with token attached.")
                fault = self._fault(route)
                if fault is not None:
                    raise fault
                data = handler(request, body, raw, call)
            except ApiError as exc:
                call.status, call.code = exc.status, exc.code
                self._record(call)
                return exc.response()
            self._record(call)
            if route == "bot_info":
                return web.json_response({"code": 0, "msg": "ok", "bot": data})
            return web.json_response({"code": 0, "msg": "success", "data": data})

        return endpoint

    def _user(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        if request.query.get("user_id_type", "open_id") != "open_id":
            raise ApiError(400, 99992402, "field validation failed: user_id_type")
        name = self.users.get(request.match_info["user_id"])
        if name is None:
            raise ApiError(400, 41050, "no user authority error")
        return {"user": {"open_id": request.match_info["user_id"], "name": name, "en_name": name}}

    def _bot_info(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        return {"activate_status": 2, "app_name": "Gateway", "avatar_url": "", "ip_white_list": [],
                "open_id": self.bot_open_id}

    def _check_message(self, body: Any, raw: bytes, call: Call) -> None:
        if not isinstance(body, dict):
            raise ApiError(400, 99992402, "field validation failed: body")
        msg_type = body.get("msg_type")
        limit = TEXT_BODY_LIMIT if msg_type == "text" else CARD_BODY_LIMIT
        if len(raw) > limit:
            raise ApiError(400, 230025, "The length of the message content reaches its limit.")
        call.content = validate_content(str(msg_type), body.get("content"))
        self.uploads.check_keys(str(msg_type), call.content)
        if len(str(body.get("uuid") or "")) > 50:
            raise ApiError(400, 99992402, "field validation failed: uuid is longer than 50 characters")

    def _store(self, body: JSON, chat_id: str, call: Call, **links: str) -> JSON:
        """Stores a bot message (or returns the one already created under the same ``uuid``)."""
        key = body.get("uuid")
        with self._lock:
            if key and key in self._uuids:
                existing = self._messages[self._uuids[key]]
                call.message_id = existing["message_id"]
                return self._wire(existing)
            message_id = f"om_bot{next(self._message_ids):026d}"
            message = {"message_id": message_id, "chat_id": chat_id, "thread_id": links.get("thread_id", ""),
                       "root_id": links.get("root_id", ""), "parent_id": links.get("parent_id", ""),
                       "msg_type": body["msg_type"], "content": call.content, "sender_type": "app", "edits": 0,
                       "uuid": key, "create_time": str(int(time.time() * 1000))}
            self._messages[message_id] = message
            self._order.append(message_id)
            if key:
                self._uuids[key] = message_id
        call.message_id = message_id
        return self._wire(message)

    def _wire(self, message: JSON) -> JSON:
        """A stored message as the open API's Message (create/reply answers, get and list items):
        the bot's are sent by ``app_id``, users' by their open_id."""
        now = str(int(time.time() * 1000))
        created = message.get("create_time") or now
        if message["sender_type"] == "app":
            sender = {"id": self.app_id, "id_type": "app_id", "sender_type": "app", "tenant_key": self.tenant_key}
        else:
            sender = {"id": message.get("sender", ""), "id_type": "open_id", "sender_type": "user",
                      "tenant_key": self.tenant_key}
        data = {"message_id": message["message_id"], "root_id": message["root_id"], "parent_id": message["parent_id"],
                "msg_type": message["msg_type"], "create_time": created, "update_time": now, "deleted": False,
                "updated": message["edits"] > 0, "chat_id": message["chat_id"], "sender": sender,
                "body": {"content": json.dumps(message["content"])}, "mentions": list(message.get("mentions") or [])}
        if message["thread_id"]:
            data["thread_id"] = message["thread_id"]
        return data

    def _target(self, request: web.Request) -> JSON:
        with self._lock:
            target = self._messages.get(request.match_info["message_id"])
        if target is None:
            raise ApiError(400, 230001, "Your request contains an invalid request parameter: message not found")
        return target

    def _create(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        if request.query.get("receive_id_type") not in RECEIVE_ID_TYPES:
            raise ApiError(400, 99992402, "field validation failed: receive_id_type is required")
        self._check_message(body, raw, call)
        if not body.get("receive_id"):
            raise ApiError(400, 99992402, "field validation failed: receive_id is required")
        return self._store(body, str(body["receive_id"]), call)

    def _reply(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        target = self._target(request)
        self._check_message(body, raw, call)
        links = {"parent_id": target["message_id"], "root_id": target["root_id"] or target["message_id"]}
        if body.get("reply_in_thread") or target["thread_id"]:
            links["thread_id"] = target["thread_id"] or f"omt_fake{next(self._thread_ids):011d}"
            if not target["thread_id"]:
                with self._lock:
                    target["thread_id"] = links["thread_id"]
        return self._store(body, target["chat_id"], call, **links)

    def _update(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        target = self._target(request)
        if target["sender_type"] != "app":
            raise ApiError(400, 230027, "Lack of necessary permissions: not the message's sender")
        if body.get("msg_type") not in ("text", "post") or target["msg_type"] not in ("text", "post"):
            raise ApiError(400, 230001, "Your request contains an invalid request parameter: only text and post")
        self._check_message(body, raw, call)
        with self._lock:
            if target["edits"] >= MAX_EDITS:
                raise ApiError(400, 230072, "The message has reached the number of times it can be edited.")
            target.update(edits=target["edits"] + 1, content=call.content, msg_type=body["msg_type"])
        return self._wire(target)

    def _patch(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        target = self._target(request)
        if target["msg_type"] != "interactive":
            raise ApiError(400, 230001, "Your request contains an invalid request parameter: not a card")
        if not ((target["content"] or {}).get("config") or {}).get("update_multi"):
            raise ApiError(400, 230001, "Your request contains an invalid request parameter: not a shared card")
        self._check_message({**(body or {}), "msg_type": "interactive"}, raw, call)
        with self._lock:
            target.update(edits=target["edits"] + 1, content=call.content)
        return {}

    def _may_read(self) -> None:
        if not self.can_read_messages:
            raise ApiError(400, 99991672, "Access denied. One of the following scopes is required: "
                                          "[im:message, im:message:readonly, im:message.history:readonly].")

    def _get(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        """GET /open-apis/im/v1/messages/{message_id}: ``{"items": [Message]}``."""
        self._may_read()
        return {"items": [self._wire(self._target(request))]}

    def _list(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        """GET /open-apis/im/v1/messages (the history of a chat or a thread): ``container_id_type``
        ``chat``|``thread`` and ``container_id`` required; ``page_size`` 1-50 (default 20);
        ``sort_type`` ``ByCreateTimeAsc`` (default) or ``ByCreateTimeDesc``; ``page_token`` from the
        previous page while ``has_more``. An unknown container answers 230001; without a message-read
        permission 99991672."""
        query = request.query
        kind, container = query.get("container_id_type"), query.get("container_id")
        if kind not in ("chat", "thread") or not container:
            raise ApiError(400, 99992402, "field validation failed: container_id_type and container_id are required")
        try:
            page_size = int(query.get("page_size", "20"))
        except ValueError:
            raise ApiError(400, 99992402, "field validation failed: page_size") from None
        if not 1 <= page_size <= 50:
            raise ApiError(400, 99992402, "field validation failed: page_size must be between 1 and 50")
        sort = query.get("sort_type", "ByCreateTimeAsc")
        if sort not in ("ByCreateTimeAsc", "ByCreateTimeDesc"):
            raise ApiError(400, 99992402, "field validation failed: sort_type")
        self._may_read()
        field = "chat_id" if kind == "chat" else "thread_id"
        with self._lock:
            found = [copy.deepcopy(self._messages[i]) for i in self._order if self._messages[i][field] == container]
        if not found:
            raise ApiError(400, 230001, f"Your request contains an invalid request parameter: invalid {kind} id")
        found.sort(key=lambda m: int(m.get("create_time") or 0), reverse=sort == "ByCreateTimeDesc")
        start = 0
        if query.get("page_token"):
            try:
                start = int(base64.b64decode(query["page_token"], validate=True).decode())
            except ValueError:
                raise ApiError(400, 99992402, "field validation failed: page_token") from None
        page = found[start:start + page_size]
        more = start + page_size < len(found)
        return {"has_more": more, "page_token": base64.b64encode(str(start + page_size).encode()).decode() if more
                else "", "items": [self._wire(m) for m in page]}

    def _delete(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        target = self._target(request)
        with self._lock:
            self._messages.pop(target["message_id"], None)
            if target["message_id"] in self._order:
                self._order.remove(target["message_id"])
        return {}

    def _reaction(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        target = self._target(request)
        emoji = ((body or {}).get("reaction_type") or {}).get("emoji_type")
        if not emoji:
            raise ApiError(400, 231001, "reaction type is invalid")
        reaction = {"reaction_id": f"r-{next(self._reaction_ids)}", "message_id": target["message_id"],
                    "emoji_type": emoji}
        with self._lock:
            self._reactions[reaction["reaction_id"]] = reaction
        call.content = reaction
        return {"reaction_id": reaction["reaction_id"], "operator": {"operator_id": self.app_id,
                "operator_type": "app"}, "action_time": str(int(time.time() * 1000)),
                "reaction_type": {"emoji_type": emoji}}

    def _reaction_delete(self, request: web.Request, body: Any, raw: bytes, call: Call) -> JSON:
        with self._lock:
            reaction = self._reactions.pop(request.match_info["reaction_id"], None)
        if reaction is None:
            raise ApiError(400, 231003, "The reaction does not exist")
        return {"reaction_id": reaction["reaction_id"], "reaction_type": {"emoji_type": reaction["emoji_type"]}}

    def add_resource(self, message_id: str, key: str, data: bytes, kind: str = "image") -> str:
        """Makes ``data`` the resource ``key`` (an ``image_key`` or ``file_key``) of the user's message
        ``message_id``; ``kind`` is the ``type`` it must be fetched with (``image`` | ``file``)."""
        self.resources[key] = data
        self._resource_of[key] = (message_id, kind)
        return key

    async def _resource(self, request: web.Request) -> web.StreamResponse:
        """``GET /open-apis/im/v1/messages/{message_id}/resources/{file_key}?type=image|file``: the
        tenant token is required; ``type`` must be ``image`` for images and ``file`` for files,
        audio and video (else 234001 "Invalid request param."); a key not in that message is
        234003 "File not in msg."; the body is the file (``Content-Type`` as Feishu serves it)."""
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        key, message_id = request.match_info["key"], request.match_info["message_id"]
        call = Call(time.monotonic(), "resource", "GET", request.path, dict(request.query), None, token=token)
        with self._lock:
            expiry = self._tokens.get(token)
        data = self.resources.get(key)
        owner, kind = self._resource_of.get(key, (message_id, "image" if key.startswith("img_") else "file"))
        error: ApiError | None = None
        if expiry is None or expiry < time.time():
            error = ApiError(self.invalid_token_status, INVALID_TOKEN,
                             "Invalid access token for authorization. Please make a request with token attached.")
        elif request.query.get("type") not in ("image", "file") or request.query.get("type") != kind:
            error = ApiError(400, 234001, "Invalid request param.")
        elif data is None or owner != message_id:
            error = ApiError(400, 234003, "File not in msg.")
        call.code = error.code if error else 0
        self._record(call)
        if error is not None:
            return error.response()
        content_type = "image/png" if data.startswith(b"\x89PNG") else "image/jpeg" if data.startswith(b"\xff\xd8") \
            else "application/octet-stream"
        return web.Response(body=data, content_type=content_type)


async def _interactive(fake: FakeFeishu, events_url: str, encrypt: bool) -> None:
    """Reads lines from stdin, posts each as a DM event to the gateway, prints the bot's replies."""
    loop = asyncio.get_running_loop()
    shown = 0
    while True:
        line = await loop.run_in_executor(None, input, "you> ")
        status, _ = await fake.post_event(events_url, fake.text_event(line), encrypt=encrypt)
        if status != 200:
            print(f"[gateway answered HTTP {status}]")
            continue
        deadline = time.monotonic() + 120
        while len(fake.sent()) == shown and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # let every part of a long reply arrive
        for message in fake.sent()[shown:]:
            print(f"bot> {post_text(message['content'])}")
        shown = len(fake.sent())


def main() -> None:
    """``python -m tests.fakes.feishu --port 9100 --gateway http://127.0.0.1:8080``: serves the fake open
    API with the fixture app (app id ``cli_fake00000000001``, secret ``fake-app-secret-0001``, verification
    token ``fake-verification-token-0001``, encrypt key ``fake-encrypt-key-0001``) and chats with the
    gateway as a Feishu user in a DM."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--gateway", default="http://127.0.0.1:8080", help="the gateway's HTTP root")
    parser.add_argument("--encrypt", action="store_true", help="encrypt and sign events (set the encrypt key)")
    args = parser.parse_args()
    with FakeFeishu(port=args.port) as fake:
        print(f"fake Feishu open API on {fake.url}; posting events to {args.gateway}/feishu/events")
        with contextlib.suppress(EOFError, KeyboardInterrupt):
            asyncio.run(_interactive(fake, f"{args.gateway.rstrip('/')}/feishu/events", args.encrypt))


if __name__ == "__main__":
    main()
