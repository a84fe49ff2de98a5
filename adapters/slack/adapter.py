"""Slack adapter: slack-bolt glue (Events API over HTTP or Socket Mode), send, typing indicator.

Acknowledgement rule (DESIGN §3.1): Bolt runs with ``process_before_response=True``, so the HTTP
response (or the Socket Mode ack) is sent only after the listener has handed the message to the
inbox; a failed inbox write answers 500 (Socket Mode: no ack) and Slack delivers the event again.
The listener does nothing else, so the ack stays well inside Slack's 3 seconds. Bolt does not
dedupe redeliveries (``X-Slack-Retry-Num``); the inbox does, on ``"<channel>:<ts>"``.

Before Bolt sees an HTTP request, ``signature_problem`` checks the Slack signature and the
5-minute window and logs which check failed (never the secret or the signature); Bolt then
checks again and answers ``url_verification`` itself. Every event type Slack may send has a
listener, because Bolt answers 404 to unhandled events and Slack counts that as a failure.

Slash commands arrive the same two ways (a signed form POST to the same URL, a ``slash_commands``
Socket Mode frame) and follow the same rule: stored as the command message they stand for
(``adapters.slack.commands``), then acked; their answers go out ephemerally (``_send_ephemeral``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient
from yarl import URL

from adapters.slack import history
from adapters.slack.commands import EphemeralTarget, SlashCommands, command_to_inbound, ephemeral_target
from adapters.slack.files import UploadFailed, attachment_problem, upload_bytes
from adapters.slack.format import MAX_CHUNK_CHARS, format_reply
from adapters.slack.inbound import (
    ACTION_PREFIX,
    BotIdentity,
    Ignored,
    action_to_inbound,
    command_blocks,
    to_inbound,
    users_to_resolve,
)
from adapters.slack.streams import NativeStreams
from adapters.slack.wire import envelope_problem, event_id_of, interaction_problem, slash_command_problem
from adapters.wire import UnreadableBody, header_bytes, load_json
from gateway.core.errors import ContextUnavailable, CredentialRejected, DownloadFailed
from gateway.core.ports import BeforePart, ChatLeft, Fetch, FileReader, InboundSink, PartSent
from gateway.core.types import (
    Attachment,
    ChatAddress,
    ContextMessage,
    DeliveryResult,
    InboundMessage,
    OutboundAttachment,
    OutboundMessage,
    ThreadHistory,
)

log = logging.getLogger("adapters.slack")

EVENTS_PATH = "/slack/events"
SIGNATURE_WINDOW_S = 300  # Slack request signing: reject timestamps more than 5 minutes away
RETRYABLE_ERRORS = {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
SECTION_TEXT_LIMIT = 3000
"""Slack Block Kit: a section block's text holds at most 3,000 characters. A message with command
buttons shows its text in a section (Slack then shows the blocks, ``text`` is only the notification),
so its text parts are cut at this length instead of ``MAX_CHUNK_CHARS``."""
BLOCKS_REFUSED = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_blocks_too_long"})
"""chat.postMessage errors for ``blocks`` Slack will not show: nothing was posted."""
LEFT_EVENTS = frozenset({"channel_left", "group_left"})
"""Slack events telling the app its bot user left (was removed from) a channel or private channel."""
MAX_SUGGESTED_PROMPTS = 4  # Slack: assistant.threads.setSuggestedPrompts takes at most 4 prompts
THINKING_STATUS = "is thinking…"
STATUS_RENEW_S = 60.0  # Slack drops a thread status after 2 minutes without a message
RESPONSE_URL_TIMEOUT_S = 10.0
NAME_TTL_S = 3600.0
NAME_LOOKUP_TIMEOUT_S = 1.5  # users.info runs inside Slack's 3-second ack budget
_MAX_REMEMBERED = 5000
_TIMESTAMP = re.compile(rb"[0-9]{1,15}")


def signature_problem(body: bytes, headers: Mapping[str, str], signing_secret: str,
                      now: float | None = None) -> str | None:
    """Why a request fails Slack's signature check, or ``None`` when it passes.

    Slack request signing: ``X-Slack-Signature`` = ``v0=`` + hex HMAC-SHA256(signing secret,
    ``"v0:{X-Slack-Request-Timestamp}:{raw body}"``); the timestamp must be within 300 s of now.
    Everything is compared as the bytes that arrived (a body or header that is not UTF-8 is a
    mismatch, never an error). The returned text names the failed check and never contains the
    secret or the signature.
    """
    timestamp = header_bytes(headers.get("X-Slack-Request-Timestamp"))
    signature = header_bytes(headers.get("X-Slack-Signature"))
    if not timestamp:
        return "missing X-Slack-Request-Timestamp header"
    if not signature:
        return "missing X-Slack-Signature header"
    if not _TIMESTAMP.fullmatch(timestamp):
        return "malformed X-Slack-Request-Timestamp header"
    age = (time.time() if now is None else now) - int(timestamp)
    if abs(age) > SIGNATURE_WINDOW_S:
        return f"timestamp outside the 5-minute window ({age:+.0f} s)"
    digest = hmac.new(signing_secret.encode(), b"v0:" + timestamp + b":" + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(b"v0=" + digest.encode(), signature):
        return "signature mismatch (body altered after signing, or another signing secret)"
    return None


BUTTON = re.compile(f"^{ACTION_PREFIX}\\d+$")
"""The ``action_id`` of the gateway's own buttons (``adapters.slack.inbound.command_buttons``)."""

HANDLED_BODIES = frozenset({"event_callback", "url_verification"})
"""Events API envelope types the gateway answers through Bolt; any other authentic one
(``app_rate_limited``, a type Slack adds later) is acknowledged and logged."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Body:
    """What ``_read_body`` found in an authentic body: ``unreadable`` (why it cannot be used),
    ``unhandled`` (what it is, when it is readable but nothing the gateway listens to), and its
    ``event_id`` when it has one; all ``None``: Bolt takes it."""

    unreadable: str | None = None
    unhandled: str | None = None
    event_id: str | None = None


def _interaction_unhandled(data: dict[str, Any]) -> str | None:
    """Why a well-typed interaction is none of the gateway's (``None``: a press of one of its
    buttons). Only those reach Bolt: its built-in matchers index other payloads' fields without
    checking them (a ``view_submission`` without ``view.type`` raised ``KeyError`` there: HTTP 500,
    which Slack retries)."""
    kind = data.get("type")
    if kind != "block_actions":
        return f"interaction {kind}"
    if not any(isinstance(a, dict) and BUTTON.match(str(a.get("action_id", ""))) for a in data.get("actions") or ()):
        return "block_actions on no button of the gateway"
    return None


def _read_body(raw: bytes, content_type: str) -> _Body:
    """Reads an authentic Events API or interactivity body (see ``_Body``). JSON bodies are
    events; form bodies (interactivity, slash commands) must be UTF-8 and their ``payload`` field
    a well-typed interaction."""
    if content_type == "application/x-www-form-urlencoded":
        try:
            fields = parse_qs(raw.decode("utf-8"), errors="strict")
        except (UnicodeDecodeError, ValueError):
            return _Body("form body is not UTF-8")
        if "payload" not in fields:
            if "ssl_check" in fields:
                return _Body()  # Slack's certificate probe: Bolt answers it
            if "command" not in fields:
                return _Body("form body is neither an interaction nor a slash command")
            return _Body(slash_command_problem({k: v[0] for k, v in fields.items()}))
        try:
            payload = load_json(fields["payload"][0])
        except UnreadableBody as exc:
            return _Body(f"payload: {exc}")
        problem = interaction_problem(payload)
        return _Body(problem) if problem is not None else _Body(unhandled=_interaction_unhandled(payload))
    try:
        data = load_json(raw)
    except UnreadableBody as exc:
        return _Body(str(exc))
    if not isinstance(data, dict):
        return _Body("body is not a JSON object")
    if isinstance(data.get("type"), str) and data["type"] not in HANDLED_BODIES:
        return _Body(unhandled=f"{data['type']} body")
    return _Body(envelope_problem(data), event_id=event_id_of(data))


CREDENTIAL_ERRORS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired",
                               "not_allowed_token_type"})
"""Slack Web API ``error`` codes that mean the token itself is refused (docs.slack.dev: auth.test)."""


def _rejected(exc: SlackApiError, setting: str) -> CredentialRejected | None:
    """``CredentialRejected`` naming ``setting`` when Slack refused the token, else ``None``."""
    error = str(exc.response.get("error") or "")
    return CredentialRejected("slack", (setting,), error) if error in CREDENTIAL_ERRORS else None


def _header(headers: Mapping[str, Any] | None, name: str) -> str | None:
    for key, value in (headers or {}).items():
        if key.lower() == name.lower():
            return str(value[0] if isinstance(value, list | tuple) else value)
    return None


def _failure(exc: SlackApiError, sent: list[str]) -> DeliveryResult:
    """Maps a Web API error to a delivery result: 429/``ratelimited`` and 5xx are retryable (with
    ``Retry-After`` seconds when given); any other error code is permanent."""
    status = getattr(exc.response, "status_code", 0) or 0
    code = str(exc.response.get("error") or f"http {status}") if exc.response is not None else "unknown"
    if status == 429 or code == "ratelimited":
        raw = _header(getattr(exc.response, "headers", None), "Retry-After")
        try:
            retry_after = float(raw) if raw is not None else 1.0
        except ValueError:
            retry_after = 1.0
        return DeliveryResult(False, tuple(sent), retryable=True, retry_after=retry_after, error="slack ratelimited")
    if status >= 500 or code in RETRYABLE_ERRORS:
        return DeliveryResult(False, tuple(sent), retryable=True, error=f"slack error: {code}")
    return DeliveryResult(False, tuple(sent), error=f"slack error: {code}")


class _FileGone(Exception):
    """An attachment's bytes are no longer in the blob store (a permanent failure)."""


class _UnusedTokenNotice(logging.Filter):
    """Drops Bolt's start-up warnings that its ``token`` is unused: ``AsyncApp`` reads
    ``$SLACK_BOT_TOKEN`` by itself and takes the passed client's token, while the adapter passes its
    own client (pointed at ``api_url``) and its own ``authorize`` (which hands Bolt that token)."""

    NOTICES = ("`token` will be unused", "`token` (or SLACK_BOT_TOKEN env variable) will be ignored")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(notice in message for notice in self.NOTICES)


class _CheckedSocketModeHandler(AsyncSocketModeHandler):
    """Bolt's Socket Mode handler behind the checks the HTTP path makes: a frame whose payload has
    the wrong JSON types (which Bolt's middleware would fail on, leaving the frame unacknowledged
    and redelivered) is acknowledged, logged once at WARNING and dropped; an interaction that is not
    the gateway's (a modal's submission, another app's button: ``_interaction_unhandled``) is
    acknowledged and dropped, as over HTTP (Bolt answered it 404 and left it unacknowledged, and
    Slack showed the user an error; found by a review)."""

    async def handle(self, client: Any, req: SocketModeRequest) -> None:
        check = {"events_api": envelope_problem, "interactive": interaction_problem,
                 "slash_commands": slash_command_problem}.get(req.type)
        payload = req.payload if isinstance(req.payload, dict) else None
        problem = None if check is None else "payload is not an object" if payload is None else check(payload)
        if problem is None and req.type == "interactive" and payload is not None \
                and (unhandled := _interaction_unhandled(payload)) is not None:
            log.debug("slack interaction not the gateway's (%s); acknowledged", unhandled)
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))
            return
        if problem is None:
            await super().handle(client, req)
            return
        log.warning("slack event %s unreadable (%s); acknowledged and dropped", event_id_of(payload) or "?", problem)
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))


class SlackAdapter:
    """One Slack app in one workspace.

    Args:
        bot_token: ``xoxb-…`` bot token (secret; never logged).
        signing_secret: verifies Events API requests (required in ``events`` mode).
        app_token: ``xapp-…`` app-level token (required in ``socket`` mode).
        mode: ``events`` (HTTP at ``/slack/events``) or ``socket`` (Socket Mode WebSocket).
        api_url: Web API root, e.g. ``https://slack.com/api/`` or a loopback fake.
        allow_bots: take messages from other bots (never from this one).
        typing_reaction: emoji name added to the user's message while a turn runs (Slack has no
            typing API for bots; a reaction is the usual stand-in), ``""`` to disable.
        socket_ping_interval_s: Socket Mode: seconds between the SDK's pings and checks of the
            connection, so also the longest time a silently dropped socket goes unnoticed before
            the SDK reconnects (Bolt's default is 10; a ``disconnect`` frame reconnects at once).
        group_context: hand top-level channel messages that do not mention the bot to the sink as
            ``context_only`` (some chat keeps group context); otherwise they are ignored here.
        slash_commands: the slash command table (``adapters.slack.commands.SlashCommands``); a
            command is stored as the command message it stands for before it is acked, and every
            answer to it is ephemeral. ``None``: slash commands are answered "not a command here".
        assistant: the app has Slack's assistant surface (Agents & AI Apps): in a DM thread the
            "working" indicator is the thread status (``assistant.threads.setStatus``, "is
            thinking…") instead of a reaction, and ``assistant_thread_started`` gets the
            ``suggested_prompts``.
        suggested_prompts: at most 4 prompts offered when a user opens an assistant thread
            (``assistant.threads.setSuggestedPrompts``; each is the title and the message).
        native_streaming: stream previews in threads with ``chat.startStream`` /
            ``appendStream`` / ``stopStream`` (``adapters.slack.streams``) where the workspace has
            them; otherwise (and as the fallback) a preview is a post edited with ``chat.update``.

    Also a ``ContextReader``: ``read_message`` (a thread's parent) and ``read_thread`` read
    ``conversations.replies`` with the bot token (``adapters.slack.history``).
    """

    platform = "slack"
    idempotent_send = False  # chat.postMessage has no idempotency key: a part in doubt is not resent
    receiver_lease: str | None = None  # Events API and Socket Mode both spread events over every instance

    def __init__(self, *, bot_token: str, signing_secret: str | None = None, app_token: str | None = None,
                 mode: str = "events", api_url: str = "https://slack.com/api/", allow_bots: bool = False,
                 typing_reaction: str = "eyes", timeout_s: int = 15, socket_ping_interval_s: float = 5.0,
                 group_context: bool = False, slash_commands: SlashCommands | None = None,
                 assistant: bool = False, suggested_prompts: tuple[str, ...] = (),
                 native_streaming: bool = True) -> None:
        if mode == "events" and not signing_secret:
            raise ValueError("Slack events mode needs a signing secret")
        if mode == "socket" and not app_token:
            raise ValueError("Slack socket mode needs an app-level token")
        self.mode = mode
        self.client = AsyncWebClient(token=bot_token, base_url=api_url, timeout=timeout_s,
                                     logger=logging.getLogger("adapters.slack.sdk"))
        self._bot_token = bot_token
        api = URL(api_url)
        self._api_origin = (api.scheme, api.host, api.port)
        self._fetch: Fetch | None = None
        self._signing_secret = signing_secret or ""
        self._app_token = app_token
        self._allow_bots = allow_bots
        self._group_context = group_context
        self._typing_reaction = typing_reaction
        self._socket_ping_interval = socket_ping_interval_s
        self._sink: InboundSink | None = None
        self._chat_left: ChatLeft | None = None
        self._identity: BotIdentity | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._names: dict[str, tuple[str, float]] = {}
        self._locales: dict[str, tuple[str, float]] = {}
        """User id -> (``users.info`` ``locale``, e.g. ``zh-CN``; expiry): the language hint of their messages."""
        self._last_seen: OrderedDict[ChatAddress, str] = OrderedDict()  # newest user message ts per chat
        self._reacted: dict[ChatAddress, str] = {}
        self._files: FileReader | None = None
        self._slash = slash_commands
        self._assistant = assistant
        self._prompts = tuple(suggested_prompts)[:MAX_SUGGESTED_PROMPTS]
        self._statuses: dict[ChatAddress, float] = {}  # assistant threads whose status is set -> when
        self._background: set[asyncio.Task[None]] = set()
        self._streams = NativeStreams(self.client, native_streaming)
        self._recipients: OrderedDict[ChatAddress, str] = OrderedDict()  # who the newest message per chat came from
        self.app = self._build_app()

    # -- lifecycle ---------------------------------------------------------------------------
    async def _authorize(self) -> AuthorizeResult:
        """Bolt's authorization of each request, from the identity ``start`` read (``auth.test``).
        Bolt's own single-workspace authorization calls ``auth.test`` again on a process's first
        request and, when that call fails (a Slack 5xx, a 429), answers 200 with a "reinstall" text
        and runs no listener: the event was acknowledged and lost, over HTTP and Socket Mode alike
        (found by a review). ``start`` runs before any request is served (the readiness gate)."""
        identity = self._identity
        if identity is None:
            raise RuntimeError("slack request before start(): the readiness gate should have answered 503")
        return AuthorizeResult(enterprise_id=None, team_id=identity.team_id, bot_user_id=identity.user_id,
                               bot_id=identity.bot_id, bot_token=self.client.token)

    def _build_app(self) -> AsyncApp:
        bolt_log = logging.getLogger("adapters.slack.bolt")
        if not any(isinstance(f, _UnusedTokenNotice) for f in bolt_log.filters):
            bolt_log.addFilter(_UnusedTokenNotice())
        app = AsyncApp(client=self.client, signing_secret=self._signing_secret or "socket-mode-unused",
                       process_before_response=True, logger=bolt_log,
                       authorize=lambda **_: self._authorize(),  # Bolt passes what the names ask for
                       request_verification_enabled=self.mode == "events")

        async def on_message_event(body: dict[str, Any]) -> None:
            await self._receive(body)

        async def on_other_event(body: dict[str, Any]) -> None:
            found = body.get("event")
            event: dict[str, Any] = found if isinstance(found, dict) else {}
            left = event.get("type") in LEFT_EVENTS or (
                event.get("type") == "member_left_channel" and self._identity is not None
                and event.get("user") == self._identity.user_id)
            if left and self._chat_left is not None and isinstance(event.get("channel"), str):
                team = str(body.get("team_id") or (self._identity.team_id if self._identity else ""))
                await self._chat_left(ChatAddress("slack", team, event["channel"]))
                return
            log.debug("slack event %s ignored", event.get("type"))

        async def on_button(ack: Any, body: dict[str, Any]) -> None:
            await ack()  # Slack needs the ack within 3 s; the press is stored right after
            assert self._identity is not None and self._sink is not None
            try:
                result = action_to_inbound(body, self._identity)
            except Exception as exc:
                log.warning("slack interaction could not be read (%s); acknowledged and dropped", type(exc).__name__)
                return
            if isinstance(result, Ignored):
                log.debug("slack interaction ignored: %s", result.reason)
                return
            await self._sink(result)

        async def on_command(ack: Any, body: dict[str, Any]) -> None:
            await self._receive_command(ack, body)

        async def on_assistant_thread(body: dict[str, Any]) -> None:
            self._offer_prompts(body)

        app.command(re.compile(".*"))(on_command)
        app.event("assistant_thread_started")(on_assistant_thread)
        app.event("message")(on_message_event)
        app.event("app_mention")(on_message_event)
        app.action(BUTTON)(on_button)
        app.event(re.compile(".*"))(on_other_event)  # anything else subscribed: ack, never 404
        return app

    def routes(self) -> list[web.RouteDef]:
        return [web.post(EVENTS_PATH, self._handle_events)] if self.mode == "events" else []

    def bind_chat_left(self, callback: ChatLeft) -> None:
        """``callback`` learns of each channel the bot was removed from (``channel_left``,
        ``group_left``, or ``member_left_channel`` naming the bot user)."""
        self._chat_left = callback

    async def start(self, sink: InboundSink) -> None:
        """Reads the app identity (``auth.test``) and remembers ``sink``. Events API requests are
        served through ``routes()``; Socket Mode connects in ``start_receiving``.

        Raises:
            CredentialRejected: Slack refused the bot token (``invalid_auth``, ``token_revoked``...).
            slack_sdk.errors.SlackApiError: any other Web API error (start-up must stop).
        """
        self._sink = sink
        try:
            self._identity = await self._auth_test()
        except SlackApiError as exc:
            if (rejected := _rejected(exc, "bot_token_env")) is None:
                raise
            raise rejected from exc
        log.info("slack bot %s (bot %s) in team %s starting in %s mode", self._identity.user_id,
                 self._identity.bot_id, self._identity.team_id, self.mode)

    async def start_receiving(self) -> None:
        """Socket Mode: opens the WebSocket (``apps.connections.open`` with the app token). The SDK
        reconnects with a fresh URL on a ``disconnect`` frame (Slack: ``refresh_requested`` every
        few hours) and within ``socket_ping_interval_s`` of a dropped socket; an event whose ack
        was lost is redelivered by Slack and dropped by the inbox as a duplicate. Slack hands each
        event to one of the app's connections, so every instance may be connected.

        Raises:
            CredentialRejected: Slack refused the app-level token. The first
                ``apps.connections.open`` is ours (the SDK would retry a refused token forever); its
                URL is the SDK's first connection (the method is Tier 1: no call is wasted).
        """
        if self.mode != "socket" or self._socket is not None:
            return
        try:
            opened = await self.client.apps_connections_open(app_token=self._app_token)  # type: ignore[arg-type]
        except SlackApiError as exc:
            if (rejected := _rejected(exc, "app_token_env")) is None:
                raise
            raise rejected from exc
        self._socket = _CheckedSocketModeHandler(self.app, self._app_token, logger=log,
                                                 ping_interval=self._socket_ping_interval)
        self._socket.client.wss_uri = opened["url"]  # reconnects ask for new URLs themselves
        await self._socket.connect_async()

    async def stop_receiving(self) -> None:
        if self._socket is not None:
            await self._socket.close_async()
            self._socket = None

    async def stop(self) -> None:
        await self.stop_receiving()
        for task in list(self._background):
            task.cancel()

    async def check(self) -> str:
        """``gateway doctor``: ``auth.test`` with the bot token. Raises ``CredentialRejected`` when
        Slack refuses the token (as at start-up), ``SlackApiError`` for any other error."""
        try:
            auth = await self.client.auth_test()
        except SlackApiError as exc:
            if (rejected := _rejected(exc, "bot_token_env")) is None:
                raise
            raise rejected from exc
        return f"bot {auth.get('user')} ({auth.get('user_id')}, bot id {auth.get('bot_id')}) " \
               f"in workspace {auth.get('team')} ({auth.get('team_id')})"

    async def _auth_test(self) -> BotIdentity:
        auth = await self.client.auth_test()
        return BotIdentity(*(str(auth.get(key) or "") for key in ("user_id", "bot_id", "team_id")))

    # -- inbound -----------------------------------------------------------------------------
    async def _handle_events(self, request: web.Request) -> web.Response:
        """Events API and interactivity POSTs. The signature is checked on the raw bytes before
        anything is parsed (401 on failure, nothing stored); an authentic body that cannot be
        understood (not UTF-8 JSON, or fields of the wrong type) is logged once and answered 200
        with ``X-Slack-No-Retry: 1``, so Slack neither retries it nor counts a failure."""
        raw = await request.read()
        problem = signature_problem(raw, request.headers, self._signing_secret)
        if problem is not None:
            log.warning("slack request rejected with 401: %s", problem)
            return web.json_response({"error": "invalid request"}, status=401)
        body = _read_body(raw, request.content_type)
        if body.unreadable is not None:
            log.warning("slack event %s unreadable (%s, %d bytes); acknowledged and dropped", body.event_id or "?",
                        body.unreadable, len(raw))
            return web.Response(status=200, headers={"X-Slack-No-Retry": "1"})
        if body.unhandled is not None:
            level = logging.WARNING if body.unhandled.startswith("app_rate_limited") else logging.INFO
            log.log(level, "slack %s: nothing here handles it; acknowledged", body.unhandled)
            return web.Response(status=200, headers={"X-Slack-No-Retry": "1"})
        bolt_request = AsyncBoltRequest(body=raw.decode("utf-8"), query=request.query_string,
                                        headers={k: v for k, v in request.headers.items()})
        response = await self.app.async_dispatch(bolt_request)
        if response.status == 404:  # no listener matched it: an acknowledgement, not a failure Slack retries
            log.info("slack event %s matched no listener; acknowledged", body.event_id or "?")
            return web.Response(status=200, headers={"X-Slack-No-Retry": "1"})
        headers = response.first_headers_without_set_cookie()
        content_type = headers.pop("content-type", None) or (
            "application/json" if response.body.startswith("{") else "text/plain")
        return web.Response(status=response.status, body=response.body, headers=headers,
                            content_type=content_type.split(";")[0])

    async def _receive(self, body: dict[str, Any]) -> None:
        """The listener: normalize and hand to the inbox. Raises when storing failed, so Bolt
        answers 500 (no ack) and Slack redelivers."""
        if self._identity is None or self._sink is None:
            raise RuntimeError("slack adapter not started")
        try:
            result = to_inbound(body, self._identity, allow_bots=self._allow_bots, ambient=self._group_context)
            wanted = users_to_resolve(body, self._identity) if isinstance(result, InboundMessage) else set()
        except Exception as exc:  # authentic but not understood: asking again would fail the same way
            log.warning("slack event %s could not be read (%s); acknowledged and dropped", event_id_of(body) or "?",
                        type(exc).__name__)
            return
        if isinstance(result, Ignored):
            log.debug("slack event %s ignored: %s", body.get("event_id"), result.reason)
            return
        if wanted:
            names = await self._display_names(wanted)
            named = to_inbound(body, self._identity, names, allow_bots=self._allow_bots, ambient=self._group_context)
            result = named if isinstance(named, InboundMessage) else result
        locale = self._locales.get(result.sender.user_id)  # looked up with the author's name just now
        if locale is not None and locale[1] > time.monotonic():
            result = dataclasses.replace(result, language=locale[0])
        stored = await self._sink(result)
        if stored:
            self._remember(result.address, result.message_id.rsplit(":", 1)[-1], result.sender.user_id)

    async def _receive_command(self, ack: Any, body: dict[str, Any]) -> None:
        """A slash command (Events API form POST or Socket Mode ``slash_commands``): stored in the
        inbox as the command message it stands for, then acked (empty: the answer comes
        ephemerally through the outbox). A raised store leaves it unacked (HTTP 500), so Slack tells
        the user it failed and nothing is half done. A command the gateway does not have is
        acked with an ephemeral line saying so, nothing stored. The user's locale comes from
        ``users.info`` as for messages (within ``NAME_LOOKUP_TIMEOUT_S``, well inside Slack's 3 s)."""
        if self._identity is None or self._sink is None:
            raise RuntimeError("slack adapter not started")
        result = command_to_inbound(body, self._slash or SlashCommands(()), self._identity.team_id)
        if isinstance(result, str):
            log.info("slack slash command %s is not one of ours; answered so", result[:40])
            await ack(response_type="ephemeral", text=f"{result[:40]} is not a command of this assistant.")
            return
        await self._display_names({result.sender.user_id})  # its locale, as for messages (cached an hour)
        locale = self._locales.get(result.sender.user_id)
        if locale is not None and locale[1] > time.monotonic():
            result = dataclasses.replace(result, language=locale[0])
        await self._sink(result)
        self._last_seen.pop(result.address, None)  # no message to react to: no stale 👀 on an older one
        await ack()

    def _offer_prompts(self, body: dict[str, Any]) -> None:
        """``assistant_thread_started``: the suggested prompts, set in the background (the event's
        ack does not wait for the Web API call)."""
        found = body.get("event")
        event: dict[str, Any] = found if isinstance(found, dict) else {}
        opened = event.get("assistant_thread")
        thread: dict[str, Any] = opened if isinstance(opened, dict) else {}
        channel, thread_ts = thread.get("channel_id"), thread.get("thread_ts")
        if not self._prompts or not isinstance(channel, str) or not isinstance(thread_ts, str):
            return
        prompts = [{"title": p[:75], "message": p} for p in self._prompts]

        async def offer() -> None:
            try:
                await self.client.assistant_threads_setSuggestedPrompts(channel_id=channel, thread_ts=thread_ts,
                                                                        prompts=prompts)
            except (SlackApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.info("slack assistant.threads.setSuggestedPrompts failed: %s", type(exc).__name__)

        task = asyncio.get_running_loop().create_task(offer())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- context (gateway.core.ports.ContextReader) ------------------------------------------------
    async def read_message(self, message: InboundMessage) -> ContextMessage | None:
        """The parent of ``message``'s thread (``message.quoted``), read with ``conversations.replies``
        (its first message is the parent); ``None`` when Slack no longer has it.

        Raises:
            ContextUnavailable: Slack refused (``missing_scope`` naming the scope, ``ratelimited``...).
        """
        if self._identity is None or message.quoted is None:
            return None
        channel, _, ts = message.quoted.message_id.rpartition(":")
        answer = await self._replies(channel=channel, ts=ts, limit=1, inclusive=True, latest=ts)
        found = [m for m in answer.get("messages") or () if isinstance(m, dict) and str(m.get("ts")) == ts]
        if not found:
            return None
        names = await self._display_names(history.authors(found, self._identity))
        return history.context_message(found[0], channel, self._identity, names)

    async def read_thread(self, message: InboundMessage, limit: int) -> ThreadHistory:
        """The messages of ``message``'s thread posted before it: the parent and the newest replies,
        ``limit`` in all, oldest first, with their authors' names (``users.info``, cached). Reads
        ``conversations.replies`` page by page (``PAGE_LIMIT``, at most ``MAX_PAGES``).

        Raises:
            ContextUnavailable: Slack refused (``missing_scope`` naming the scope, ``thread_not_found``,
                ``ratelimited``...).
        """
        thread_ts = message.address.thread_id
        if self._identity is None or not thread_ts:
            return ThreadHistory()
        channel, before = message.address.chat_id, message.message_id.rpartition(":")[2]
        raw: list[dict[str, Any]] = []
        cursor: str | None = None
        more = False
        for page in range(history.MAX_PAGES):
            try:
                answer = await self._replies(channel=channel, ts=thread_ts, latest=before, inclusive=False,
                                             limit=history.PAGE_LIMIT, cursor=cursor)
            except ContextUnavailable as exc:
                if not page:
                    raise
                log.info("slack thread %s: page %d not read (%s); showing the pages read", thread_ts, page + 1, exc)
                more = True
                break
            raw += [m for m in answer.get("messages") or () if isinstance(m, dict)
                    and str(m.get("ts") or "") != before]
            cursor = str((answer.get("response_metadata") or {}).get("next_cursor") or "") or None
            more = bool(answer.get("has_more")) and cursor is not None
            if not more:
                break
        names = await self._display_names(history.authors(raw, self._identity))
        found = [m for m in (history.context_message(r, channel, self._identity, names) for r in raw) if m]
        kept, left_out = history.keep_newest(found, f"{channel}:{thread_ts}", limit)
        return ThreadHistory(tuple(kept), left_out, more)

    async def _replies(self, **params: Any) -> dict[str, Any]:
        """One ``conversations.replies`` call; Slack's refusals become ``ContextUnavailable``."""
        try:
            response = await self.client.conversations_replies(**params)
        except SlackApiError as exc:
            data = exc.response.data if exc.response is not None and isinstance(exc.response.data, dict) else {}
            code = str(data.get("error") or "unknown error")
            if code == "missing_scope":
                raise ContextUnavailable(f"Slack answered missing_scope: the bot token needs {data.get('needed')} "
                                         f"(it has {data.get('provided') or 'none'})") from None
            raise ContextUnavailable(f"Slack answered {code}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ContextUnavailable(f"network: {type(exc).__name__}") from None
        return response.data if isinstance(response.data, dict) else {}

    def _remember(self, address: ChatAddress, ts: str, user_id: str) -> None:
        for remembered, value in ((self._last_seen, ts), (self._recipients, user_id)):
            remembered[address] = value
            remembered.move_to_end(address)
            while len(remembered) > _MAX_REMEMBERED:
                remembered.popitem(last=False)

    async def _display_names(self, user_ids: set[str]) -> dict[str, str]:
        """Display names by user id (``users.info``, cached for an hour; unknown ids are left out).
        Lookups run in parallel and give up after ``NAME_LOOKUP_TIMEOUT_S``. Each lookup asks for
        the user's locale too (``include_locale``, Slack Web API users.info), kept in ``_locales``."""
        now = time.monotonic()
        names = {uid: cached[0] for uid in user_ids if (cached := self._names.get(uid)) and cached[1] > now}
        missing = [uid for uid in user_ids if uid not in names]

        async def lookup(uid: str) -> None:
            try:
                user = (await self.client.users_info(user=uid, include_locale=True)).get("user") or {}
            except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
                log.debug("users.info %s failed: %s", uid, type(exc).__name__)
                return
            if not isinstance(user, dict):  # not the documented object: nothing to learn from it
                log.warning("users.info %s: unexpected user of type %s", uid, type(user).__name__)
                return
            if isinstance(user.get("locale"), str) and user["locale"]:
                if len(self._locales) > _MAX_REMEMBERED:
                    self._locales.clear()
                self._locales[uid] = (str(user["locale"]), now + NAME_TTL_S)
            profile = user.get("profile")
            profile = profile if isinstance(profile, dict) else {}
            name = profile.get("display_name") or profile.get("real_name") or user.get("real_name") or user.get("name")
            if name:
                names[uid] = str(name)
                if len(self._names) > _MAX_REMEMBERED:
                    self._names.clear()
                self._names[uid] = (str(name), now + NAME_TTL_S)

        if missing:
            try:
                await asyncio.wait_for(asyncio.gather(*(lookup(uid) for uid in missing)), NAME_LOOKUP_TIMEOUT_S)
            except TimeoutError:
                log.warning("slack users.info too slow; %d mention(s) left as ids", len(missing))
        return names

    # -- outbound ----------------------------------------------------------------------------
    def bind_files(self, reader: FileReader) -> None:
        """Where the bytes of outbound files come from (the gateway's blob store)."""
        self._files = reader

    def attachment_problem(self, attachment: OutboundAttachment) -> str | None:
        """See ``FileSendingAdapter``; ``adapters.slack.files`` has the rules."""
        return attachment_problem(attachment)

    @staticmethod
    def _parts(message: OutboundMessage) -> list[str | tuple[OutboundAttachment, str | None]]:
        """Text chunks, then per attachment the file with its caption as the upload's comment (a
        caption longer than one chunk goes first as text parts). With command buttons, text chunks
        hold at most ``SECTION_TEXT_LIMIT`` characters: the last is shown in a section block."""
        limit = SECTION_TEXT_LIMIT if message.buttons else MAX_CHUNK_CHARS
        parts: list[str | tuple[OutboundAttachment, str | None]] = list(
            format_reply(message.text, message.format, limit))
        for attachment in message.attachments:
            caption = format_reply(attachment.caption) if attachment.caption.strip() else []
            if len(caption) > 1:
                parts += caption
                caption = []
            parts.append((attachment, caption[0] if caption else None))
        return parts

    async def send(self, message: OutboundMessage, on_part: PartSent | None = None,
                   before_part: BeforePart | None = None) -> DeliveryResult:
        """Posts the reply as one or more ``chat.postMessage`` calls (mrkdwn, ≤ 3,900 characters
        each, ≤ 3,000 with command buttons: ``_parts``; Slack Web API: chat.postMessage, text ≤ 40,000
        characters, ≤ 4,000 advised) in
        ``thread_ts`` when the address has a thread, then each attachment with files upload v2
        (``_send_file``) into the same thread. Parts already sent (``resume_from``) are
        skipped, and each part but the last is reported to ``on_part`` (its ``ts``; a file's id)
        before the next is sent, so a retried or resumed delivery never repeats a part;
        ``before_part`` runs right before the call that makes each part visible. With ``edit_id``
        (a streamed preview's ``ts``), part 1 is a ``chat.update`` of that message instead of a new
        post. A reply to a slash command (``reply_to_id`` names an ephemeral target) goes to its
        user alone: ``_send_ephemeral``; never a message that is or replaces a preview (``editable``,
        ``edit_id``: an ephemeral message cannot be edited), which only a model turn has (a slash
        command merged into one with ``bus.busy_policy = "merge"``)."""
        address = message.address
        target = None if message.editable or message.edit_id else ephemeral_target(message.reply_to_id)
        if target is not None:
            return await self._send_ephemeral(message, target, on_part, before_part)
        recipient = self._recipients.get(address)
        if message.editable and not message.edit_id and not message.resume_from and \
                self._streams.wanted(address, message.text, recipient):
            if before_part is not None:
                await before_part(0)
            try:
                streamed = await self._streams.start(address, message.text, recipient)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                return DeliveryResult(False, retryable=True, error=f"network: {type(exc).__name__}")
            if streamed is not None:
                return DeliveryResult(True, (streamed,))
        ids: list[str] = []
        parts = self._parts(message)
        one_text_part = sum(isinstance(p, str) for p in parts) == 1 and not message.buttons
        for index, part in enumerate(parts):
            if index < message.resume_from:
                continue
            try:
                if isinstance(part, tuple):
                    ids.append(await self._send_file(address, part[0], part[1], index, before_part))
                else:
                    kwargs: dict[str, Any] = {"channel": address.chat_id, "text": part, "mrkdwn": True}
                    if message.buttons and index == len(parts) - 1:
                        kwargs["blocks"] = command_blocks(part, message.buttons)
                    if address.thread_id:
                        kwargs["thread_ts"] = address.thread_id
                    if before_part is not None:
                        await before_part(index)
                    response: Any
                    if index == 0 and message.edit_id and one_text_part \
                            and await self._streams.finish(message.edit_id, message.text):
                        response = {"ts": message.edit_id}  # the stream ended as the reply
                    elif index == 0 and message.edit_id:
                        if self._streams.enabled and address.thread_id:  # a stream another process began
                            await self._streams.stop(message.edit_id, address)
                        response = await self._update_or_post(message.edit_id, kwargs)
                    else:
                        response = await self._post(kwargs)
                    ids.append(str(response.get("ts") or ""))
            except SlackApiError as exc:
                return _failure(exc, ids)
            except _FileGone as exc:
                return DeliveryResult(False, tuple(ids), error=str(exc))
            except (aiohttp.ClientError, TimeoutError, OSError, UploadFailed) as exc:
                return DeliveryResult(False, tuple(ids), retryable=True, error=f"network: {type(exc).__name__}")
            if on_part is not None and index < len(parts) - 1:
                await on_part(ids[-1])  # recorded before the next part: a crash never repeats it
        await self._clear_typing(address)
        return DeliveryResult(True, tuple(ids))

    async def _send_ephemeral(self, message: OutboundMessage, target: EphemeralTarget, on_part: PartSent | None,
                              before_part: BeforePart | None) -> DeliveryResult:
        """Each text part shown to ``target.user_id`` only: through the command's ``response_url``
        (``{"response_type": "ephemeral", "text"}``; works in any channel, also where the bot is no
        member) and, when that is gone (Slack: 5 uses within 30 minutes, then 404), with
        ``chat.postEphemeral`` (channel, user; the bot must be in the channel). Ephemeral
        messages cannot be edited or carry files: ``edit_id`` is ignored and files are not sent
        (a command's answer has none). Commands named in the text get their Slack names
        (``SlashCommands.rename``: ``/agent-new`` under a prefix). The ids recorded are ``response_url:<n>`` or the
        ``message_ts`` Slack returns."""
        address = message.address
        ids: list[str] = []
        text = self._slash.rename(message.text) if self._slash is not None else message.text
        parts = format_reply(text, message.format)
        url = target.response_url if target.response_url and self._response_url_allowed(target.response_url) else None
        if message.attachments:
            log.warning("slack ephemeral reply: %d file(s) not sent (ephemeral messages carry none)",
                        len(message.attachments))
        for index, part in enumerate(parts):
            if index < message.resume_from:
                continue
            if before_part is not None:
                await before_part(index)
            try:
                if url is not None and await self._respond(url, part):
                    ids.append(f"response_url:{index}")
                else:
                    url = None  # used up or expired: the rest through the Web API
                    kwargs: dict[str, Any] = {"channel": address.chat_id, "user": target.user_id, "text": part,
                                              "mrkdwn": True}
                    if address.thread_id:
                        kwargs["thread_ts"] = address.thread_id
                    response = await self.client.chat_postEphemeral(**kwargs)
                    ids.append(str(response.get("message_ts") or ""))
            except SlackApiError as exc:
                return _failure(exc, ids)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                return DeliveryResult(False, tuple(ids), retryable=True, error=f"network: {type(exc).__name__}")
            if on_part is not None and index < len(parts) - 1:
                await on_part(ids[-1])
        return DeliveryResult(True, tuple(ids))

    def _response_url_allowed(self, url: str) -> bool:
        """A ``response_url`` is POSTed to only on Slack (``https://hooks.slack.com``) or at the
        configured API origin (the test fake); anything else is never contacted."""
        parsed = URL(url)
        return (parsed.scheme, parsed.host, parsed.port) == self._api_origin or (
            parsed.scheme == "https" and (parsed.host or "").lower() == "hooks.slack.com")

    async def _respond(self, url: str, text: str) -> bool:
        """One ephemeral answer through a ``response_url``; ``False`` when Slack no longer takes the
        URL (HTTP 404 ``used_url``/``expired_url``, or any other 4xx), so the caller falls back.

        Raises:
            aiohttp.ClientError, TimeoutError: the network failed or Slack answered 5xx (retryable).
        """
        payload = {"response_type": "ephemeral", "text": text, "replace_original": False}
        timeout = aiohttp.ClientTimeout(total=RESPONSE_URL_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(url, json=payload) as resp:
            body = (await resp.text())[:80]
            if resp.status >= 500:
                raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
            if resp.status != 200:
                log.info("slack response_url answered %d (%s); using chat.postEphemeral", resp.status, body)
                return False
        return True

    async def _send_file(self, address: ChatAddress, attachment: OutboundAttachment, comment: str | None,
                         index: int, before_part: BeforePart | None) -> str:
        """One file through files upload v2 (Slack Web API): ``files.getUploadURLExternal``
        (name, length), the bytes POSTed to the returned URL, then ``files.completeUploadExternal``
        with ``channel_id`` (and ``thread_ts``: into the thread) and the caption as
        ``initial_comment``. Only the completion shares the file, so ``before_part`` runs right
        before it: a crash during the upload leaves nothing visible and the part is redone.
        Returns the file's id."""
        data = await self._files.read(attachment.sha256) if self._files is not None else None
        if data is None:
            raise _FileGone(f"file {attachment.name} is no longer stored")
        reserved = await self.client.files_getUploadURLExternal(filename=attachment.name, length=len(data))
        file_id, upload_url = str(reserved.get("file_id") or ""), str(reserved.get("upload_url") or "")
        await upload_bytes(upload_url, data)
        if before_part is not None:
            await before_part(index)
        extra: dict[str, Any] = {"thread_ts": address.thread_id} if address.thread_id else {}
        if comment:
            extra["initial_comment"] = comment
        await self.client.files_completeUploadExternal(files=[{"id": file_id, "title": attachment.name}],
                                                       channel_id=address.chat_id, **extra)
        return file_id

    async def _post(self, kwargs: dict[str, Any]) -> Any:
        """chat.postMessage; when Slack refuses the ``blocks`` (``BLOCKS_REFUSED``: nothing was
        posted), the text is posted once more without them (its commands are written in it)."""
        try:
            return await self.client.chat_postMessage(**kwargs)
        except SlackApiError as exc:
            if "blocks" not in kwargs or exc.response is None or exc.response.get("error") not in BLOCKS_REFUSED:
                raise
            log.warning("slack refused the blocks (%s: %s); posting the text alone", exc.response.get("error"),
                        (exc.response.get("response_metadata") or {}).get("messages"))
            return await self.client.chat_postMessage(**{k: v for k, v in kwargs.items() if k != "blocks"})

    async def _update_or_post(self, ts: str, kwargs: dict[str, Any]) -> Any:
        """chat.update of the preview ``ts``; a preview that is gone (deleted) is replaced by a post."""
        try:
            return await self.client.chat_update(channel=kwargs["channel"], ts=ts, text=kwargs["text"])
        except SlackApiError as exc:
            if exc.response is None or exc.response.get("error") != "message_not_found":
                raise
            log.warning("slack preview %s is gone; posting the reply as a new message", ts)
            return await self._post(kwargs)

    async def edit(self, address: ChatAddress, ts: str, text: str) -> DeliveryResult:
        """Replaces the text of the bot's message ``ts`` (Slack Web API: chat.update; ≤ ~1/s per
        message for streaming, Tier 3). Markdown is converted; only the first chunk is used. A
        preview this process streams natively gets only the new text appended
        (``chat.appendStream``, Tier 4); an edit that cannot be appended stops the stream first."""
        chunks = format_reply(text) or [" "]
        try:
            if self._streams.live(ts) and await self._streams.append(ts, text):
                return DeliveryResult(True, (ts,))  # Slack's own stream shows the new text
            try:
                await self.client.chat_update(channel=address.chat_id, ts=ts, text=chunks[0])
            except SlackApiError as exc:
                if not (exc.response is not None and exc.response.get("error") == "cant_update_message"
                        and self._streams.enabled and address.thread_id):
                    raise
                await self._streams.stop(ts, address)  # a stream this process did not start (a resumed turn)
                await self.client.chat_update(channel=address.chat_id, ts=ts, text=chunks[0])
        except SlackApiError as exc:
            return _failure(exc, [])
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return DeliveryResult(False, retryable=True, error=f"network: {type(exc).__name__}")
        return DeliveryResult(True, (ts,))

    # -- files -------------------------------------------------------------------------------
    def bind_fetch(self, fetch: Fetch) -> None:
        """Where file URLs are downloaded (the gateway's guarded fetcher)."""
        self._fetch = fetch

    def download_limit(self, attachment: Attachment) -> int | None:
        """Slack sets no download limit below the gateway's (uploads go up to 1 GB)."""
        return None

    def _token_host(self, url: URL) -> bool:
        """Hosts that may see the bot token: Slack's own (``files.slack.com``) and the API origin
        configured (``slack.api_url``)."""
        host = (url.host or "").lower()
        return (url.scheme, url.host, url.port) == self._api_origin or (
            url.scheme == "https" and (host == "slack.com" or host.endswith(".slack.com")))

    async def download(self, message: InboundMessage, attachment: Attachment, max_bytes: int) -> tuple[bytes, str]:
        """``GET url_private_download`` with ``Authorization: Bearer <bot token>`` (Slack
        "Downloading files"; needs the ``files:read`` scope). Without a valid token Slack answers
        200 with its HTML sign-in page: an HTML body is refused, never passed on as the file.

        Raises:
            FileTooBig: longer than ``max_bytes``. DownloadFailed: no URL, a URL off Slack, the
            sign-in page, an HTTP or network error.
        """
        if not attachment.url:
            raise DownloadFailed("Slack gave no download address for the file")
        if self._fetch is None:
            raise DownloadFailed("file downloads are not set up")
        url = URL(attachment.url)
        if not self._token_host(url):
            raise DownloadFailed("the file's address is not on Slack")
        data, content_type = await self._fetch(str(url), headers={"Authorization": f"Bearer {self._bot_token}"},
                                               max_bytes=max_bytes,
                                               trusted=(url.scheme, url.host, url.port) == self._api_origin)
        if content_type.startswith("text/html") and not (attachment.mime_type or "").startswith("text/html"):
            raise DownloadFailed("Slack sent its sign-in page instead of the file (the app needs the "
                                 "files:read scope; reinstall it after adding the scope)")
        return data, attachment.mime_type or content_type

    async def send_typing(self, address: ChatAddress) -> None:
        """Adds ``typing_reaction`` once to the newest user message of ``address`` seen by this
        process (Slack Web API: reactions.add); later calls for the same message do nothing.
        Best effort: errors are logged at debug level."""
        if self._assistant and address.thread_id and address.chat_id.startswith("D") \
                and await self._set_status(address):
            return
        ts = self._last_seen.get(address)
        if not self._typing_reaction or ts is None or self._reacted.get(address) == ts:
            return
        self._reacted[address] = ts
        try:
            await self.client.reactions_add(channel=address.chat_id, timestamp=ts, name=self._typing_reaction)
        except (SlackApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("slack reactions.add failed: %s", exc)

    async def _set_status(self, address: ChatAddress) -> bool:
        """The assistant thread's status "is thinking…" (Slack Web API: assistant.threads.setStatus,
        ``channel_id``, ``thread_ts``, ``status``; Slack drops it after 2 minutes without a message,
        so it is set again every ``STATUS_RENEW_S``). ``False`` when Slack refused (no assistant
        surface in this workspace, a missing scope): the caller uses the reaction instead."""
        now = time.monotonic()
        if now - self._statuses.get(address, -STATUS_RENEW_S) < STATUS_RENEW_S:
            return True
        assert address.thread_id is not None
        try:
            await self.client.assistant_threads_setStatus(channel_id=address.chat_id, thread_ts=address.thread_id,
                                                          status=THINKING_STATUS)
        except (SlackApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("slack assistant.threads.setStatus failed: %s", type(exc).__name__)
            return False
        self._statuses[address] = now
        return True

    async def _clear_typing(self, address: ChatAddress) -> None:
        if self._statuses.pop(address, None) is not None and address.thread_id:
            try:  # an empty status clears it (Slack also clears it when the reply is posted)
                await self.client.assistant_threads_setStatus(channel_id=address.chat_id,
                                                              thread_ts=address.thread_id, status="")
            except (SlackApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.debug("slack assistant.threads.setStatus (clear) failed: %s", type(exc).__name__)
        ts = self._reacted.pop(address, None)
        if ts is None:
            return
        try:
            await self.client.reactions_remove(channel=address.chat_id, timestamp=ts, name=self._typing_reaction)
        except (SlackApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("slack reactions.remove failed: %s", exc)
