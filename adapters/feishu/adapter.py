"""Feishu/Lark adapter: lark-oapi glue (webhook or long connection), tenant token, send, typing.

Threads and loops (PLATFORMS.md §0.1-0.3):
- lark-oapi's async calls fetch the tenant token with *sync* ``requests`` inside ``acreate`` unless
  the client is built with ``enable_set_token(True)`` and every call carries a ``RequestOption`` with
  a token. ``TenantToken`` fetches that token itself, asynchronously, so the main loop never blocks;
  lark's process-global ``TokenManager`` cache is never used.
- the long-connection client (``lark.ws.Client``) runs on a module-level loop bound at import and
  ``start()`` blocks forever: ``adapters.feishu.long_connection`` gives it a dedicated thread with
  its own loop and connects it itself (bounded attempts, backing-off retries); events are handed to
  the main loop with ``run_coroutine_threadsafe`` and acknowledged only after the inbox write.

Acknowledgement (DESIGN §3.1; Feishu event subscription: answer HTTP 200 within 3 s, else re-pushed
after 15 s, 5 min, 1 h, 6 h): the webhook answers 200 right after the inbox write, never after model
work. A bad verification token or signature, or a body that cannot be authenticated -> 401,
nothing stored; an authentic event that cannot be understood -> logged once and answered 200 (never
a redelivery loop); an inbox write failure -> 500 so Feishu pushes the event again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import io
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import lark_oapi as lark
from aiohttp import web
from lark_oapi.api.contact.v3 import GetUserRequest
from lark_oapi.api.im.v1 import (
    CreateFileRequest,
    CreateFileRequestBody,
    CreateImageRequest,
    CreateImageRequestBody,
    CreateMessageReactionRequest,
    CreateMessageReactionRequestBody,
    CreateMessageRequest,
    CreateMessageRequestBody,
    DeleteMessageReactionRequest,
    Emoji,
    GetMessageRequest,
    ListMessageRequest,
    PatchMessageRequest,
    PatchMessageRequestBody,
    ReplyMessageRequest,
    ReplyMessageRequestBody,
)
from lark_oapi.core.utils import AESCipher

from adapters.feishu import history
from adapters.feishu.cards import action_to_inbound, card_parts, plain_card_part
from adapters.feishu.files import as_image, attachment_problem, file_type
from adapters.feishu.format import (
    POST_LIMIT_BYTES,
    Part,
    format_plain,
    format_reply,
    plain_text_part,
    post_plain_text,
)
from adapters.feishu.inbound import Ignored, to_inbound
from adapters.feishu.long_connection import LongConnection
from adapters.feishu.token import TenantToken
from adapters.feishu.wire import event_id_of, event_problem
from adapters.wire import UnreadableBody, header_bytes, load_json
from gateway.core.errors import (
    ContextUnavailable,
    CredentialRejected,
    DownloadFailed,
    FileTooBig,
    NotDownloadable,
)
from gateway.core.ports import BeforePart, ChatLeft, FileReader, InboundSink, PartSent
from gateway.core.types import (
    Attachment,
    ChatAddress,
    ContextMessage,
    DeliveryResult,
    InboundMessage,
    OutboundAttachment,
    OutboundMessage,
    Sender,
    ThreadHistory,
)

log = logging.getLogger("adapters.feishu")

WEBHOOK_PATH = "/feishu/events"
BOT_REMOVED_EVENT = "im.chat.member.bot.deleted_v1"
"""Feishu: the bot was removed from a group (``event.chat_id``)."""
TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
APP_SECRET_INVALID = 10014
"""Feishu auth/v3 tenant_access_token/internal: ``{"code": 10014, "msg": "app secret invalid"}``."""
BOT_INFO_PATH = "/open-apis/bot/v3/info"
RESOURCE_PATH = "/open-apis/im/v1/messages/{message_id}/resources/{key}"
RESOURCE_LIMIT = 100_000_000
"""Feishu "Get resources in a message": files up to 100 MB."""
TOKEN_INVALID_CODES = frozenset({99991663, 99991661})
"""Feishu: tenant_access_token invalid/expired (99991663) or missing (99991661), with HTTP 400 or 200."""
RATE_LIMIT_CODES = frozenset({99991400, 230020, 11232})
"""Feishu: app frequency limit (99991400, HTTP 429), per-chat limit (230020), message-service limit (11232)."""
RATE_LIMIT_MIN_WAIT_S = 1.0
"""The least wait after a rate limit (also without ``x-ogw-ratelimit-reset``): the header counts whole
seconds, so ``0`` means the window turns within one."""
SCOPE_MISSING_CODES = frozenset({99991672, 99991679})
"""Feishu: the app (or token) lacks a required permission scope."""
NO_PERMISSION = 230027
"""Feishu im/v1: "Lack of necessary permissions" (e.g. reading a chat the bot may not read)."""
NAME_LOOKUP_TIMEOUT_S = 1.0
"""Longest wait for a sender's name before the event is stored anyway (the 3 s ack budget)."""
NAME_CACHE_S = 3600.0
"""How long a looked-up name (or the contact API's refusal) is remembered."""
WS_STORE_TIMEOUT_S = 10.0
"""How long a long-connection event waits for the inbox write before it is nacked (re-pushed)."""
RECALLED_CODE = 230011
"""Feishu: the message was recalled (a preview card the user or an admin took back)."""
FORMAT_REFUSED_CODES = frozenset({230001, 230099})
"""Feishu refused a message's content: 230001 "invalid message content" (a post's invalid ``href``,
a malformed element), 230099 "Failed to create card content" (card markdown, e.g. ErrCode 11310 too
many tables). Nothing was sent; the part goes once more without formatting."""
IMAGE_ROW_BYTES = 200
"""Room an image element takes in a ``post`` beside its caption."""


class FeishuApiError(Exception):
    """A Feishu open API call failed: ``code`` (Feishu's), ``status`` (HTTP), ``msg`` (never secrets)."""

    def __init__(self, what: str, code: int | None, msg: str, status: int | None = None) -> None:
        super().__init__(f"{what} failed: code {code}, HTTP {status}: {msg}")
        self.what, self.code, self.msg, self.status = what, code, msg, status


def _uuid(message: OutboundMessage, index: int, kind: str = "p") -> str:
    """Feishu ``uuid`` for part ``index`` of a reply (≤ 50 chars; Feishu keeps one message per uuid per
    hour). The idempotency key alone repeats after a database reset, so the chat and the replied-to
    message are hashed in: a reset can then never swallow a reply in another conversation. ``kind``
    ``t``: the part sent again as plain text after Feishu refused its formatting."""
    digest = hashlib.sha256(
        f"{message.address.chat_id}|{message.reply_to_id}|{message.idempotency_key}".encode()).hexdigest()[:12]
    return f"{message.idempotency_key[:32]}-{digest}:{kind}{index}"


def _plain(part: Part) -> Part:
    """``part`` without the formatting Feishu refused: a ``post`` as a ``text`` message, a card with
    its markdown as plain text."""
    if part.msg_type == "interactive":
        return plain_card_part(part)
    return plain_text_part(post_plain_text(part.content))


def _with_image(caption: Part, image: Part) -> Part:
    """A ``post`` showing the uploaded image above its caption (the caption's own post part)."""
    post = json.loads(caption.content)
    post["zh_cn"]["content"].insert(0, [{"tag": "img", "image_key": json.loads(image.content)["image_key"]}])
    return Part("post", json.dumps(post, ensure_ascii=False))


def _header(headers: dict[str, str] | None, name: str) -> str | None:
    for key, value in (headers or {}).items():
        if key.lower() == name:
            return value
    return None


class FeishuAdapter:
    """One Feishu/Lark self-built app (bot).

    Args:
        app_id, app_secret: the app's credentials (secret never logged).
        verification_token: checked against each pushed event's token (required in webhook mode).
        encrypt_key: the app's Encrypt Key; when set, encrypted bodies are decrypted and
            ``X-Lark-Signature`` is checked when present.
        mode: ``webhook`` (``POST /feishu/events`` on the gateway's server) or ``websocket``.
        domain: open API origin, ``https://open.feishu.cn`` / ``https://open.larksuite.com`` or a
            loopback fake (lark-oapi accepts ``http://`` only for 127.0.0.1/localhost).
        timeout_s: per-request timeout of API calls.
        typing_emoji: reaction put on the user's message while a turn runs and removed after the
            reply (Feishu has no typing API); ``None`` disables it.
        resolve_names: look up group senders' display names (contact/v3 users; needs a contact
            read scope, otherwise the sender stays its open_id).
        ws_connect_timeout_s, ws_backoff_initial_s, ws_backoff_max_s: long connection: the bound on
            one connect attempt and the retry delays after failed ones (``LongConnection``).
        group_context: hand group messages outside threads that do not mention the bot to the sink
            as ``context_only`` (some chat keeps group context); otherwise they are ignored here.

    Also a ``ContextReader``: ``read_message`` (``GET /open-apis/im/v1/messages/{id}``) and
    ``read_thread`` (the thread's message list), with the tenant token (``adapters.feishu.history``).

    Raises:
        ValueError: ``domain`` is not accepted by lark-oapi.
    """

    platform = "feishu"
    idempotent_send = True  # Feishu keeps one message per ``uuid`` for an hour: a resent part is dropped
    receiver_lease: str | None = None  # webhooks reach any instance; the long connection spreads events itself

    def __init__(self, *, app_id: str, app_secret: str, verification_token: str | None = None,
                 encrypt_key: str | None = None, mode: str = "webhook", domain: str = lark.FEISHU_DOMAIN,
                 timeout_s: float = 10.0, typing_emoji: str | None = "Typing", resolve_names: bool = True,
                 ws_connect_timeout_s: float = 10.0, ws_backoff_initial_s: float = 1.0,
                 ws_backoff_max_s: float = 60.0, group_context: bool = False) -> None:
        # lark-oapi prints to stdout through its own handler, past the gateway's secret redaction
        # (gateway.ops.logs): its records go through the root logger instead.
        logging.getLogger("Lark").handlers.clear()
        self.app_id = app_id
        self._app_secret = app_secret
        self._verification_token = verification_token or None
        self._encrypt_key = encrypt_key or None
        self.mode = mode
        self.domain = domain.rstrip("/")
        self.client = (lark.Client.builder().app_id(app_id).app_secret(app_secret).domain(self.domain)
                       .timeout(timeout_s).enable_set_token(True).log_level(lark.LogLevel.WARNING).build())
        self.tokens = TenantToken(self._fetch_token)
        self.typing_emoji = typing_emoji
        self._files: FileReader | None = None
        self.bot_open_id = ""
        self.resolve_names = resolve_names
        self._group_context = group_context
        self._names: dict[str, tuple[str, float]] = {}  # open_id -> (name, monotonic expiry)
        self._names_refused_until = 0.0
        self._sink: InboundSink | None = None
        self._chat_left: ChatLeft | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_inbound: OrderedDict[ChatAddress, str] = OrderedDict()
        self._typing: dict[ChatAddress, list[tuple[str, str]]] = {}  # address -> [(message_id, reaction_id)]
        self._reacted: OrderedDict[str, None] = OrderedDict()  # message ids already given a reaction
        self._dm_chats: OrderedDict[str, bool] = OrderedDict()  # chat id -> is a p2p chat (seen inbound)
        self.long_connection = LongConnection(
            app_id=app_id, app_secret=app_secret, domain=self.domain, on_payload=self._on_long_connection_payload,
            connect_timeout_s=ws_connect_timeout_s, backoff_initial_s=ws_backoff_initial_s,
            backoff_max_s=ws_backoff_max_s) if mode == "websocket" else None

    # -- lifecycle ---------------------------------------------------------------------------
    def routes(self) -> list[web.RouteDef]:
        return [web.post(WEBHOOK_PATH, self._handle_webhook)] if self.mode == "webhook" else []

    def bind_chat_left(self, callback: ChatLeft) -> None:
        """``callback`` learns of each chat the bot was removed from (``im.chat.member.bot.deleted_v1``)."""
        self._chat_left = callback

    async def start(self, sink: InboundSink) -> None:
        """Fetches a tenant token and the bot's open_id (``GET /open-apis/bot/v3/info``, needed for
        mention detection). The long connection (websocket mode) opens in ``start_receiving``.

        Raises:
            CredentialRejected: Feishu refused the app id or secret (``tenant_access_token/internal``
                answered a non-zero code: 10014 app secret invalid, 10003 invalid param ...).
            FeishuApiError: any other API failure (start-up must stop).
        """
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        try:
            bot = await self.bot_info()
        except FeishuApiError as exc:
            if exc.what != "tenant token" or not exc.code:
                raise
            settings = ("app_secret_env",) if exc.code == APP_SECRET_INVALID else ("app_id_env", "app_secret_env")
            raise CredentialRejected("feishu", settings,
                                     f"tenant_access_token: code {exc.code}, {exc.msg or 'no message'}") from exc
        self.bot_open_id = str(bot.get("open_id") or "")
        log.info("feishu bot %s (%s) starting in %s mode", bot.get("app_name"), self.bot_open_id, self.mode)

    async def start_receiving(self) -> None:
        """Starts the long connection (websocket mode) on its own thread and returns without
        waiting for Feishu: attempts are bounded and retried with backoff there. Webhooks need
        nothing."""
        if self.long_connection is not None:
            self.long_connection.start()

    async def stop(self) -> None:
        await self.stop_receiving()

    async def stop_receiving(self) -> None:
        """Closes the long connection (if any), also mid-attempt, and joins its thread."""
        if self.long_connection is not None:
            await self.long_connection.stop()

    async def check(self) -> str:
        """Fetches a token and the bot info; returns e.g. ``bot Gateway (open_id ou_...)``."""
        bot = await self.bot_info()
        return f"bot {bot.get('app_name') or '?'} (open_id {bot.get('open_id')}) via {self.domain}"

    # -- tenant token and raw calls ----------------------------------------------------------
    async def _fetch_token(self) -> tuple[str, float]:
        """Feishu auth/v3 ``tenant_access_token/internal`` (self-built app), without lark's sync cache."""
        request = (lark.BaseRequest.builder().http_method(lark.HttpMethod.POST).uri(TOKEN_PATH)
                   .token_types(set()).body({"app_id": self.app_id, "app_secret": self._app_secret}).build())
        response = await self.client.arequest(request)
        data = self._json(response, "tenant token")
        token = data.get("tenant_access_token")
        if data.get("code") != 0 or not token:
            raise FeishuApiError("tenant token", data.get("code"), str(data.get("msg") or ""),
                                 response.raw.status_code)
        log.info("feishu tenant token fetched (expires in %s s)", data.get("expire"))
        return str(token), float(data.get("expire") or 7200)

    @staticmethod
    def _json(response: Any, what: str) -> dict[str, Any]:
        try:
            data = json.loads(response.raw.content)
        except (TypeError, ValueError):
            raise FeishuApiError(what, None, "response is not JSON", response.raw.status_code) from None
        return data if isinstance(data, dict) else {}

    async def _call(self, invoke: Callable[[lark.RequestOption], Awaitable[Any]]) -> Any:
        """Runs ``invoke(option)`` with a tenant token. On 99991663/99991661 (HTTP 400 or 200) the token
        is dropped, a new one fetched and the call retried once; any other outcome is returned as is."""
        response = None
        for attempt in range(2):
            token = await self.tokens.get()
            response = await invoke(lark.RequestOption.builder().tenant_access_token(token).build())
            code = getattr(response, "code", None)
            if code is None:
                code = self._json(response, "api call").get("code")
            if code not in TOKEN_INVALID_CODES or attempt == 1:
                break
            log.info("feishu rejected the tenant token (code %s); fetching a new one", code)
            self.tokens.invalidate(token)
        return response

    async def bot_info(self) -> dict[str, Any]:
        """``GET /open-apis/bot/v3/info`` -> ``{"open_id", "app_name", "activate_status", ...}``.

        Raises:
            FeishuApiError: non-zero code or an unreadable answer.
        """
        def invoke(option: lark.RequestOption) -> Awaitable[Any]:
            request = (lark.BaseRequest.builder().http_method(lark.HttpMethod.GET).uri(BOT_INFO_PATH)
                       .token_types({lark.AccessTokenType.TENANT}).build())
            return self.client.arequest(request, option)

        response = await self._call(invoke)
        data = self._json(response, "bot info")
        if data.get("code") != 0 or not isinstance(data.get("bot"), dict):
            raise FeishuApiError("bot info", data.get("code"), str(data.get("msg") or ""), response.raw.status_code)
        return data["bot"]

    # -- inbound -----------------------------------------------------------------------------
    async def _dispatch(self, body: dict[str, Any]) -> None:
        """Normalizes one decrypted event and stores it (raises if the inbox write failed)."""
        assert self._sink is not None
        # Authentic (token/signature checked) but not the documented shape: acknowledged, so Feishu
        # does not push it again, and dropped. Only a failed inbox write asks for a retry.
        problem = event_problem(body)
        if problem is not None:
            log.warning("feishu event %s malformed (%s); acknowledged and dropped", event_id_of(body), problem)
            return
        found = body.get("header")
        header: dict[str, Any] = found if isinstance(found, dict) else {}
        if header.get("event_type") == BOT_REMOVED_EVENT:  # the bot was removed from a chat
            found = body.get("event")
            event: dict[str, Any] = found if isinstance(found, dict) else {}
            if self._chat_left is not None and isinstance(event.get("chat_id"), str) and event["chat_id"]:
                tenant = str(header.get("tenant_key") or "")
                await self._chat_left(ChatAddress("feishu", tenant, event["chat_id"]))
            return
        try:
            press = action_to_inbound(body, self.bot_open_id)
            result = press if press is not None else to_inbound(body, self.bot_open_id, ambient=self._group_context)
        except Exception as exc:
            log.warning("feishu event %s could not be read (%s); acknowledged and dropped", event_id_of(body),
                        type(exc).__name__)
            return
        if press is not None:  # a command button on one of our cards: the presser's command
            await self._sink(press)
            return
        if isinstance(result, Ignored):
            header = body.get("header") or {}
            log.debug("feishu event %s ignored: %s", header.get("event_id"), result.reason)
            return
        if result.chat_type == "group" and not result.sender.display_name:
            name = await self._display_name(result.sender.user_id)
            if name:
                result = dataclasses.replace(result, sender=Sender(result.sender.user_id, name))
        stored = await self._sink(result)
        if stored:
            self._remember(result)

    async def _display_name(self, open_id: str) -> str:
        """The user's name (Feishu contact/v3 ``GET /users/{open_id}``), cached; ``""`` when unknown.

        Best effort and bounded: at most ``NAME_LOOKUP_TIMEOUT_S`` before the event is stored; a
        refusal (the app lacks a contact scope) stops lookups for ``NAME_CACHE_S``."""
        now = time.monotonic()
        cached = self._names.get(open_id)
        if cached is not None and cached[1] > now:
            return cached[0]
        if not self.resolve_names or not open_id or self._names_refused_until > now:
            return ""

        def invoke(option: lark.RequestOption) -> Awaitable[Any]:
            request = GetUserRequest.builder().user_id(open_id).user_id_type("open_id").build()
            return self.client.contact.v3.user.aget(request, option)

        try:
            response = await asyncio.wait_for(self._call(invoke), NAME_LOOKUP_TIMEOUT_S)
        except Exception as exc:
            log.debug("feishu name lookup failed: %s", type(exc).__name__)
            return ""
        if response.code != 0 or response.data is None or response.data.user is None:
            if response.code in SCOPE_MISSING_CODES:
                log.info("feishu contact API refused name lookups (code %s); senders stay open_ids", response.code)
                self._names_refused_until = now + NAME_CACHE_S
            name = ""  # e.g. 41050: this user is outside the app's contact range
        else:
            name = str(response.data.user.name or "")
        self._names[open_id] = (name, now + NAME_CACHE_S)
        if len(self._names) > 4096:
            self._names.pop(next(iter(self._names)))
        return name

    # -- context (gateway.core.ports.ContextReader) ------------------------------------------------
    async def read_message(self, message: InboundMessage) -> ContextMessage | None:
        """The message ``message`` replies to (``message.quoted``: the event's ``parent_id``), read
        with ``GET /open-apis/im/v1/messages/{message_id}``; ``None`` when Feishu no longer has it
        (recalled or deleted).

        Raises:
            ContextUnavailable: Feishu refused (a missing permission, rate limit, ...).
        """
        if message.quoted is None:
            return None
        quoted_id = message.quoted.message_id

        def invoke(option: lark.RequestOption) -> Awaitable[Any]:
            return self.client.im.v1.message.aget(GetMessageRequest.builder().message_id(quoted_id).build(), option)

        response = await self._read(invoke, "message")
        if response is None or response.data is None or not response.data.items:
            return None
        item = next((i for i in response.data.items if i.message_id == quoted_id), response.data.items[0])
        names = await self._names_of([history.sender_open_id(item)])
        return history.context_message(item, bot_open_id=self.bot_open_id, app_id=self.app_id, names=names)

    async def read_thread(self, message: InboundMessage, limit: int) -> ThreadHistory:
        """The messages of ``message``'s thread (a topic) posted before it, the newest ``limit``,
        oldest first (the thread's first message, when within them), with their senders' names.
        Reads the thread's message list newest first, ``PAGE_SIZE`` a page, at most ``MAX_PAGES``.

        Raises:
            ContextUnavailable: Feishu refused (a missing permission, rate limit, ...).
        """
        thread_id = message.address.thread_id
        if not thread_id or limit <= 0:
            return ThreadHistory()
        sent_ms = message.received_at * 1000
        items: list[Any] = []
        token: str | None = None
        more = False
        for _ in range(history.MAX_PAGES):
            def invoke(option: lark.RequestOption, token: str | None = token) -> Awaitable[Any]:
                builder = (ListMessageRequest.builder().container_id_type("thread").container_id(thread_id)
                           .sort_type("ByCreateTimeDesc").page_size(history.PAGE_SIZE))
                if token:
                    builder = builder.page_token(token)
                return self.client.im.v1.message.alist(builder.build(), option)

            response = await self._read(invoke, "thread")
            data = response.data if response is not None else None
            if data is None:
                break
            items += [i for i in data.items or () if i.message_id != message.message_id
                      and (not sent_ms or int(i.create_time or 0) <= sent_ms)]
            token = data.page_token or None
            more = bool(data.has_more) and token is not None
            if len(items) > limit or not more:
                break
        names = await self._names_of([history.sender_open_id(i) for i in items])
        found = [m for m in (history.context_message(i, bot_open_id=self.bot_open_id, app_id=self.app_id,
                                                     names=names) for i in items) if m is not None]
        kept = found[:limit][::-1]
        return ThreadHistory(tuple(kept), max(len(found) - limit, 0), more)

    async def _read(self, invoke: Callable[[lark.RequestOption], Awaitable[Any]], what: str) -> Any:
        """One read call with the tenant token; Feishu's refusals become ``ContextUnavailable``."""
        try:
            response = await self._call(invoke)
        except FeishuApiError as exc:
            raise ContextUnavailable(f"tenant token: code {exc.code}") from None
        except Exception as exc:
            raise ContextUnavailable(f"network: {type(exc).__name__}") from None
        if response.code == 0:
            return response
        if response.code in SCOPE_MISSING_CODES or response.code == NO_PERMISSION:
            raise ContextUnavailable(f"Feishu answered {response.code}: the app lacks a permission to read "
                                     f"{what} messages ({response.msg})")
        if response.code == RECALLED_CODE:
            return None
        raise ContextUnavailable(f"Feishu answered code {response.code}: {response.msg}")

    async def _names_of(self, open_ids: list[str]) -> dict[str, str]:
        """Display names of these users (``_display_name``, cached), looked up concurrently."""
        wanted = sorted({oid for oid in open_ids if oid})
        found = await asyncio.gather(*(self._display_name(oid) for oid in wanted))
        return {oid: name for oid, name in zip(wanted, found, strict=True) if name}

    def _remember(self, message: InboundMessage) -> None:
        """The newest stored message per chat: the typing reaction goes on it."""
        self._last_inbound[message.address] = message.message_id
        self._last_inbound.move_to_end(message.address)
        while len(self._last_inbound) > 4096:
            self._last_inbound.popitem(last=False)
        self._dm_chats[message.address.chat_id] = message.chat_type == "dm"
        self._dm_chats.move_to_end(message.address.chat_id)
        while len(self._dm_chats) > 4096:
            self._dm_chats.popitem(last=False)

    def _verify(self, request: web.Request, raw: bytes) -> tuple[int, dict[str, Any] | None, str]:
        """Checks and decodes one webhook body: ``(status, event, reason)``.

        ``(200, event, "")`` for an authentic, readable event; ``(200, None, reason)`` for a signed
        body that cannot be read (authentic: acknowledged, never retried); ``(401, None, reason)``
        for a forged or unverifiable one (a bad signature, or an unsigned body whose verification
        token cannot be read or is wrong). The signature is checked on the raw bytes of the body
        and headers before anything is parsed.

        Feishu event subscription: encrypted bodies are ``{"encrypt": base64(IV + AES-256-CBC)}`` with
        key SHA-256(encrypt key); ``X-Lark-Signature`` = hex SHA-256(timestamp + nonce + encrypt key +
        raw body); the verification token is ``header.token`` (schema 2.0) or ``token`` (challenge, 1.0).
        """
        signed = False
        signature = header_bytes(request.headers.get("X-Lark-Signature"))
        if self._encrypt_key and signature:
            timestamp = header_bytes(request.headers.get("X-Lark-Request-Timestamp"))
            nonce = header_bytes(request.headers.get("X-Lark-Request-Nonce"))
            expected = hashlib.sha256(timestamp + nonce + self._encrypt_key.encode() + raw).hexdigest().encode()
            if not hmac.compare_digest(expected, signature):
                return 401, None, "bad signature"
            if not _fresh(timestamp):
                return 401, None, "stale or malformed timestamp (a replayed request)"
            signed = True
        unreadable = 200 if signed else 401  # unsigned, only the token inside can vouch for it
        try:
            body = load_json(raw)
        except UnreadableBody as exc:
            return unreadable, None, str(exc)
        if not isinstance(body, dict):
            return unreadable, None, "body is not a JSON object"
        if "encrypt" in body:
            if not self._encrypt_key:
                return unreadable, None, "encrypted body but no encrypt key configured"
            try:
                body = load_json(AESCipher(self._encrypt_key).decrypt_str(str(body["encrypt"])))
            except UnreadableBody as exc:
                return unreadable, None, f"decrypted {exc}"
            except Exception:
                return unreadable, None, "undecryptable body"
            if not isinstance(body, dict):
                return unreadable, None, "decrypted body is not a JSON object"
        if self._verification_token:
            header = body.get("header")
            token = header.get("token") if isinstance(header, dict) else None if "header" in body else body.get("token")
            if not isinstance(token, str) or not hmac.compare_digest(
                    token.encode("utf-8", "surrogatepass"), self._verification_token.encode()):
                return 401, None, "bad verification token"
        if self._encrypt_key and not signed and body.get("type") != "url_verification":
            # Feishu signs every event once an encrypt key is set (lark-oapi answers the URL
            # challenge before any signature check: that one may come unsigned, token-checked)
            return 401, None, "no signature (an encrypt key is set, so Feishu signs every event)"
        return 200, body, ""

    async def _handle_webhook(self, request: web.Request) -> web.Response:
        raw = await request.read()
        status, checked, reason = self._verify(request, raw)
        if status != 200:
            log.warning("feishu webhook rejected (%s): %s, %d bytes", status, reason, len(raw))
            return web.json_response({"msg": reason}, status=status)
        if checked is None:
            log.warning("feishu event unreadable (%s, %d bytes); acknowledged and dropped", reason, len(raw))
            return web.json_response({"msg": "success"})
        if checked.get("type") == "url_verification":
            return web.json_response({"challenge": checked.get("challenge", "")})
        # A card callback's answer may carry a toast or a new card (lark-oapi
        # P2CardActionTriggerResponse); ``{}`` leaves the card as it is.
        header = checked.get("header") if isinstance(checked.get("header"), dict) else {}
        answer = {} if header.get("event_type") == "card.action.trigger" else {"msg": "success"}  # type: ignore[union-attr]
        try:
            await self._dispatch(checked)
        except Exception:
            log.exception("could not store feishu event %s; asking Feishu to push it again", event_id_of(checked))
            return web.json_response({"msg": "not stored"}, status=500)
        return web.json_response(answer)

    def _on_long_connection_payload(self, payload: bytes) -> None:
        """Runs on the long-connection thread: hands the event to the main loop and waits for the
        inbox write, so the frame is acked only once the message is stored."""
        assert self._loop is not None
        try:
            body = load_json(payload)
        except UnreadableBody as exc:
            log.warning("feishu long-connection payload unreadable (%s, %d bytes); dropped", exc, len(payload))
            return  # acked: pushing it again cannot make it readable
        if not isinstance(body, dict):
            return
        future = asyncio.run_coroutine_threadsafe(self._dispatch(body), self._loop)
        future.result(WS_STORE_TIMEOUT_S)

    # -- outbound ----------------------------------------------------------------------------
    def bind_files(self, reader: FileReader) -> None:
        """Where the bytes of outbound files come from (the gateway's blob store)."""
        self._files = reader

    def attachment_problem(self, attachment: OutboundAttachment) -> str | None:
        """See ``FileSendingAdapter``; ``adapters.feishu.files`` has the rules."""
        return attachment_problem(attachment)

    def _parts(self, message: OutboundMessage) -> list[Part | tuple[OutboundAttachment, Part | None]]:
        """Text parts, then per attachment the file with its caption: an image's caption in the
        same ``post`` as the image when it fits one post, else (and for other files) the caption
        as ``post`` parts right before the file."""
        if message.editable or message.edit_id or message.buttons:
            parts: list[Part | tuple[OutboundAttachment, Part | None]] = list(
                card_parts(message.text, message.format, message.buttons, self._button_context(message)))
        elif message.format == "markdown":
            parts = list(format_reply(message.text))
        else:
            parts = list(format_plain(message.text))
        for attachment in message.attachments:
            caption = format_reply(attachment.caption, POST_LIMIT_BYTES - IMAGE_ROW_BYTES) \
                if attachment.caption.strip() else []
            if len(caption) == 1 and as_image(attachment):
                parts.append((attachment, caption[0]))
                continue
            parts += caption if len(caption) <= 1 else format_reply(attachment.caption)
            parts.append((attachment, None))
        return parts

    async def send(self, message: OutboundMessage, on_part: PartSent | None = None,
                   before_part: BeforePart | None = None) -> DeliveryResult:
        """Sends the reply as ``post`` parts (``text`` for plain format), in order; as shared
        interactive cards (``adapters.feishu.cards``) when it will be edited (``editable``), edits a
        card (``edit_id``) or carries command ``buttons`` (on its last card). Then each attachment:
        uploaded (``POST /open-apis/im/v1/images`` with ``image_type=message``, or
        ``/open-apis/im/v1/files`` with its ``file_type``; ``adapters.feishu.files``), then sent as
        an ``image`` (a ``post`` with the image and its caption) or ``file`` message.

        Feishu open API im/v1 messages: a reply (``POST /messages/{reply_to_id}/reply``) when
        ``reply_to_id`` is set, with ``reply_in_thread`` when the address is a thread (every part then
        goes into the thread); otherwise ``POST /messages?receive_id_type=chat_id``. Each part carries
        ``uuid`` = idempotency key + part index, so Feishu drops a retried duplicate (an upload
        repeated after a crash only leaves an unused key behind); parts below ``resume_from`` are
        skipped. With ``edit_id`` (a streamed preview or plan card), part 1 is a
        ``PATCH /messages/{edit_id}`` of that card (repeating it is harmless); a card that was recalled
        (230011) is replaced by a new message. A part whose formatting Feishu refuses
        (``FORMAT_REFUSED_CODES``: nothing was sent) goes once more without it: a post as a ``text``
        message (its own ``uuid``, kind ``t``), a card with its markdown as plain text. Rate limits
        (HTTP 429, 99991400, 230020, 11232), 5xx and network errors are retryable (``retry_after``
        from ``x-ogw-ratelimit-reset``); other codes are not.
        """
        address = message.address
        parts = self._parts(message)
        ids: list[str] = []
        for index, entry in enumerate(parts):
            if index < message.resume_from:
                continue
            target = message.reply_to_id if index == 0 or address.thread_id else None
            try:
                if isinstance(entry, tuple):
                    uploaded = await self._upload(entry[0])
                    if isinstance(uploaded, DeliveryResult):
                        return dataclasses.replace(uploaded, platform_message_ids=tuple(ids))
                    part = uploaded if entry[1] is None else _with_image(entry[1], uploaded)
                else:
                    part = entry
                if before_part is not None:
                    await before_part(index)
                sender = self._sender(address, part, target, _uuid(message, index))
                patched = index == 0 and message.edit_id is not None and not isinstance(entry, tuple)
                if patched:
                    assert message.edit_id is not None
                    response = await self._call(self._patcher(message.edit_id, part.content))
                    if response.code == RECALLED_CODE:
                        log.warning("feishu card %s was recalled; sending the reply as a new message", message.edit_id)
                        patched = False
                        response = await self._call(sender)
                else:
                    response = await self._call(sender)
                if response.code in FORMAT_REFUSED_CODES and not isinstance(entry, tuple) \
                        and part.msg_type in ("post", "interactive"):
                    log.warning("feishu refused the formatting of part %d (code %s: %s); sending it as plain text",
                                index, response.code, response.msg)
                    plain = _plain(part)
                    if patched:
                        assert message.edit_id is not None
                        response = await self._call(self._patcher(message.edit_id, plain.content))
                    else:
                        response = await self._call(self._sender(address, plain, target, _uuid(message, index, "t")))
            except FeishuApiError as exc:  # token fetch failed
                return DeliveryResult(False, tuple(ids), retryable=exc.code is None or exc.status is None
                                      or exc.status >= 500, error=f"tenant token: code {exc.code}")
            except Exception as exc:
                return DeliveryResult(False, tuple(ids), retryable=True, error=f"network: {type(exc).__name__}")
            if response.code != 0 or (not patched and response.data is None):
                return self._failure(response, tuple(ids))
            ids.append(message.edit_id if patched and message.edit_id else str(response.data.message_id))
            if on_part is not None and index < len(parts) - 1:
                await on_part(ids[-1])  # recorded before the next part: a crash never repeats it
        await self._clear_typing(address)
        return DeliveryResult(True, tuple(ids))

    async def _upload(self, attachment: OutboundAttachment) -> Part | DeliveryResult:
        """Uploads the file (image API or file API) and returns the message part that shows it,
        or the failure (nothing was sent)."""
        data = await self._files.read(attachment.sha256) if self._files is not None else None
        if data is None:
            return DeliveryResult(False, error=f"file {attachment.name} is no longer stored")
        image = as_image(attachment)

        def invoke(option: lark.RequestOption) -> Awaitable[Any]:  # lark empties the request: one per attempt
            if image:
                image_body = CreateImageRequestBody.builder().image_type("message").image(io.BytesIO(data)).build()
                return self.client.im.v1.image.acreate(CreateImageRequest.builder().request_body(image_body)
                                                       .build(), option)
            file_body = (CreateFileRequestBody.builder().file_type(file_type(attachment))
                         .file_name(attachment.name).file(io.BytesIO(data)).build())
            return self.client.im.v1.file.acreate(CreateFileRequest.builder().request_body(file_body).build(),
                                                  option)

        response = await self._call(invoke)
        key = getattr(response.data, "image_key" if image else "file_key", None) if response.data else None
        if response.code != 0 or not key:
            return self._failure(response, ())
        if image:
            return Part("image", json.dumps({"image_key": key}))
        return Part("file", json.dumps({"file_key": key}))

    def _button_context(self, message: OutboundMessage) -> dict[str, Any]:
        """What a button press must bring back to be answered where the card is: the thread and
        whether the chat is a DM (remembered from inbound messages; else a card that quotes no
        message is taken to be in a DM, as only DM replies quote nothing)."""
        chat_id = message.address.chat_id
        is_dm = self._dm_chats.get(chat_id, message.reply_to_id is None)
        return {"chat_type": "dm" if is_dm else "group", "thread_id": message.address.thread_id or ""}

    def _patcher(self, message_id: str, content: str) -> Callable[[lark.RequestOption], Awaitable[Any]]:
        """A factory of the card update call (Feishu open API: ``PATCH /open-apis/im/v1/messages/{id}``,
        shared cards only, ≤ 5 QPS per message)."""
        def invoke(option: lark.RequestOption) -> Awaitable[Any]:
            body = PatchMessageRequestBody.builder().content(content).build()
            request = PatchMessageRequest.builder().message_id(message_id).request_body(body).build()
            return self.client.im.v1.message.apatch(request, option)

        return invoke

    async def edit(self, address: ChatAddress, message_id: str, text: str) -> DeliveryResult:
        """Shows plain ``text`` in the bot's card ``message_id`` (a streamed preview or the plan
        message, sent ``editable``) by a card PATCH; text beyond one card (30 KB) is cut. Never raises.

        Card update, not message edit: ``PUT /open-apis/im/v1/messages/{id}`` allows 20 edits per
        message, a shared card's PATCH has no such count (see ``adapters.feishu.cards``); its 5 QPS
        per message is kept by the gateway's edit interval (``agent.stream_edit_interval_s``)."""
        content = card_parts(text, "plain")[0].content
        try:
            response = await self._call(self._patcher(message_id, content))
        except FeishuApiError as exc:
            return DeliveryResult(False, retryable=True, error=f"tenant token: code {exc.code}")
        except Exception as exc:
            return DeliveryResult(False, retryable=True, error=f"network: {type(exc).__name__}")
        if response.code != 0:
            return self._failure(response, ())
        return DeliveryResult(True, (message_id,))

    def _sender(self, address: ChatAddress, part: Part, reply_to: str | None,
                uuid: str) -> Callable[[lark.RequestOption], Awaitable[Any]]:
        """A factory of the create/reply call (a fresh request per attempt: lark mutates requests)."""
        def invoke(option: lark.RequestOption) -> Awaitable[Any]:
            if reply_to:
                body = (ReplyMessageRequestBody.builder().content(part.content).msg_type(part.msg_type)
                        .reply_in_thread(bool(address.thread_id)).uuid(uuid).build())
                request = ReplyMessageRequest.builder().message_id(reply_to).request_body(body).build()
                return self.client.im.v1.message.areply(request, option)
            body = (CreateMessageRequestBody.builder().receive_id(address.chat_id).msg_type(part.msg_type)
                    .content(part.content).uuid(uuid).build())
            request = CreateMessageRequest.builder().receive_id_type("chat_id").request_body(body).build()
            return self.client.im.v1.message.acreate(request, option)

        return invoke

    @staticmethod
    def _failure(response: Any, ids: tuple[str, ...]) -> DeliveryResult:
        """A refused call as a delivery result. A rate limit is retryable after
        ``x-ogw-ratelimit-reset`` seconds (Feishu "Rate limits": the limit's recovery period in whole
        seconds), at least ``RATE_LIMIT_MIN_WAIT_S``: ``0`` means under a second is left, and a
        retry at once is refused again, in the same window, until the attempts are used up."""
        status = response.raw.status_code if response.raw is not None else None
        error = f"feishu code {response.code} (HTTP {status}): {response.msg}"
        if response.code in RATE_LIMIT_CODES or status == 429:
            reset = _header(response.raw.headers if response.raw is not None else None, "x-ogw-ratelimit-reset")
            try:
                retry_after = max(RATE_LIMIT_MIN_WAIT_S, float(reset)) if reset is not None else RATE_LIMIT_MIN_WAIT_S
            except ValueError:
                retry_after = RATE_LIMIT_MIN_WAIT_S
            return DeliveryResult(False, ids, retryable=True, retry_after=retry_after, error=error)
        retryable = status is None or status >= 500 or response.code in TOKEN_INVALID_CODES
        return DeliveryResult(False, ids, retryable=retryable, error=error)

    # -- files -------------------------------------------------------------------------------
    def download_limit(self, attachment: Attachment) -> int | None:
        """Feishu message resources: files up to 100 MB."""
        return RESOURCE_LIMIT

    async def download(self, message: InboundMessage, attachment: Attachment, max_bytes: int) -> tuple[bytes, str]:
        """``GET /open-apis/im/v1/messages/{message_id}/resources/{file_key}?type=image|file`` with the
        tenant token (the image API serves only images the bot uploaded itself, so users' images
        come from their message): ``type=image`` for images in image and post messages, ``file``
        for files, audio and video. An error answer is JSON ``{"code", "msg"}``.

        Raises:
            FileTooBig: above ``max_bytes``. DownloadFailed: Feishu refused it or did not answer.
            NotDownloadable: a sticker ("暂不支持获取表情包资源": the API serves none; not asked).
        """
        if attachment.kind == "sticker":
            raise NotDownloadable("Feishu does not hand stickers to bots")
        limit = min(max_bytes, RESOURCE_LIMIT)
        if attachment.size is not None and attachment.size > limit:
            raise FileTooBig(attachment.size, limit, "Feishu" if limit == RESOURCE_LIMIT else "this gateway")
        kind = "image" if attachment.kind in ("image", "sticker") else "file"
        path = RESOURCE_PATH.format(message_id=quote(message.message_id, safe=""),
                                    key=quote(attachment.file_id, safe=""))

        def invoke(option: lark.RequestOption) -> Awaitable[Any]:
            request = (lark.BaseRequest.builder().http_method(lark.HttpMethod.GET).uri(path)
                       .queries([("type", kind)]).token_types({lark.AccessTokenType.TENANT}).build())
            return self.client.arequest(request, option)

        try:
            response = await self._call(invoke)
        except Exception as exc:  # lark raises plain exceptions for network failures
            raise DownloadFailed(f"Feishu did not answer ({type(exc).__name__})", retryable=True) from None
        raw = response.raw
        content_type = str((raw.headers or {}).get("Content-Type") or (raw.headers or {}).get("content-type") or "")
        if raw.status_code != 200 or content_type.startswith("application/json"):
            data = self._json(response, "message resource")
            raise DownloadFailed(f"Feishu did not hand over the file ({data.get('code')}: {data.get('msg')})",
                                 retryable=raw.status_code >= 500)
        body = bytes(raw.content or b"")
        if len(body) > limit:
            raise FileTooBig(len(body), limit, "this gateway")
        return body, attachment.mime_type or content_type.split(";")[0] or "application/octet-stream"

    async def send_typing(self, address: ChatAddress) -> None:
        """Puts ``typing_emoji`` on the chat's newest stored message, once per message (Feishu open
        API im/v1 message reactions; there is no typing API). Errors are swallowed."""
        message_id = self._last_inbound.get(address)
        if not self.typing_emoji or message_id is None or message_id in self._reacted:
            return
        self._reacted[message_id] = None
        while len(self._reacted) > 4096:
            self._reacted.popitem(last=False)

        def invoke(option: lark.RequestOption) -> Awaitable[Any]:
            body = CreateMessageReactionRequestBody.builder().reaction_type(
                Emoji.builder().emoji_type(self.typing_emoji).build()).build()
            request = CreateMessageReactionRequest.builder().message_id(message_id).request_body(body).build()
            return self.client.im.v1.message_reaction.acreate(request, option)

        try:
            response = await self._call(invoke)
        except Exception as exc:
            log.debug("feishu typing reaction failed: %s", type(exc).__name__)
            return
        if response.code == 0 and response.data is not None:
            self._typing.setdefault(address, []).append((message_id, str(response.data.reaction_id)))
        else:
            log.debug("feishu typing reaction refused: code %s", response.code)

    async def _clear_typing(self, address: ChatAddress) -> None:
        """Removes the typing reactions put in ``address`` (best effort)."""
        for message_id, reaction_id in self._typing.pop(address, []):
            def invoke(option: lark.RequestOption, message_id: str = message_id,
                       reaction_id: str = reaction_id) -> Awaitable[Any]:
                request = DeleteMessageReactionRequest.builder().message_id(message_id).reaction_id(
                    reaction_id).build()
                return self.client.im.v1.message_reaction.adelete(request, option)

            try:
                await self._call(invoke)
            except Exception as exc:
                log.debug("feishu typing reaction removal failed: %s", type(exc).__name__)


SIGNED_MAX_AGE_S = 8 * 3600.0
"""How old a signed push's ``X-Lark-Request-Timestamp`` may be: Feishu re-pushes an event it got no
200 for after 15 s, 5 min, 1 h and 6 h (about 7.1 h in all), so older is a replay; within it the
inbox drops a repeated ``event_id``."""
SIGNED_MAX_AHEAD_S = 300.0


def _fresh(timestamp: bytes, now: float | None = None) -> bool:
    """Whether a signed request's timestamp (epoch seconds) is within the re-push window."""
    try:
        at = int(timestamp.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return False
    now = time.time() if now is None else now
    return now - SIGNED_MAX_AGE_S <= at <= now + SIGNED_MAX_AHEAD_S
