"""Telegram adapter: python-telegram-bot glue (long polling or webhook), send, typing.

Acknowledgement rule (DESIGN §3.1): with long polling, confirming ``offset = update_id + 1`` is
the ack, so an update's offset is confirmed only after the gateway stored it in the inbox. We
drive ``getUpdates`` ourselves instead of PTB's ``Updater``, which confirms the next offset before
handlers have run. Pending updates are never dropped at start-up.

Updates are read as the JSON they arrive as (the webhook's body, the items of ``getUpdates``'
``result``), checked by ``adapters.telegram.wire.update_problem`` and translated from the dict by
``adapters.telegram.inbound``; python-telegram-bot builds no ``Update`` objects. The SDK still does
the HTTP, the Bot API's error types and everything sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import random
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from telegram import (
    Bot,
    BotCommand,
    BotCommandScope,
    BotCommandScopeAllGroupChats,
    BotCommandScopeAllPrivateChats,
    BotCommandScopeChat,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputFile,
    MessageEntity,
    ReplyParameters,
)
from telegram._utils.defaultvalue import DEFAULT_NONE
from telegram._utils.types import ODVInput
from telegram.error import (
    BadRequest,
    ChatMigrated,
    EndPointNotFound,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.warnings import PTBUserWarning

from adapters.telegram.files import (
    CAPTION_LIMIT,
    DOCUMENT_MAX_BYTES,
    as_photo,
    attachment_problem,
)
from adapters.telegram.format import Chunk, chunk_text, format_reply
from adapters.telegram.inbound import CLOUD_DOWNLOAD_LIMIT, BotIdentity, Ignored, callback_to_inbound, to_inbound
from adapters.telegram.request import AiohttpRequest
from adapters.telegram.wire import update_id_of, update_problem
from adapters.wire import UnreadableBody, header_bytes, load_json
from gateway.core.errors import CredentialRejected, DownloadFailed, FileTooBig
from gateway.core.ports import BeforePart, ChatLeft, FileReader, InboundSink, PartSent
from gateway.core.types import (
    Attachment,
    ChatAddress,
    DeliveryResult,
    InboundMessage,
    OutboundAttachment,
    OutboundMessage,
)

log = logging.getLogger("adapters.telegram")
# ``TelegramAdapter._api`` calls Bot.do_api_request for methods PTB also names (sendMessage,
# getUpdates), on purpose: it skips building PTB objects from the answer. PTB warns about that on
# every call.
warnings.filterwarnings("ignore", r"Please use 'Bot\.\w+' instead of 'Bot\.do_api_request", PTBUserWarning,
                        re.escape(__name__))

WEBHOOK_PATH = "/telegram/webhook"
DOWNLOAD_READ_TIMEOUT_S = 60.0
FILE_READ_TIMEOUT_S = 60.0
"""Seconds to wait for Telegram's answer to an upload (it stores the file before answering)."""
PHOTO_REFUSALS = ("PHOTO_INVALID_DIMENSIONS", "PHOTO_SAVE_FILE_INVALID", "IMAGE_PROCESS_FAILED")
"""What sendPhoto answers (400, nothing sent) for a picture Telegram will not make a photo of: its
dimensions, its size, or data it cannot decode (a damaged file whose header looked right); the
file then goes with sendDocument."""
ALLOWED_UPDATES = ["message", "edited_message", "callback_query", "my_chat_member"]
WORKING_REACTION = "👀"
"""A lightweight "working on it" where Telegram refuses the typing action (setMessageReaction
accepts only its fixed emoji list; 👀 is on it)."""
_MAX_REMEMBERED = 10_000
GONE_STATUSES = frozenset({"left", "kicked"})
"""ChatMember statuses of a bot no longer in the chat (Bot API ``my_chat_member``)."""
PRIVACY_WARNING = (
    "telegram privacy mode is on for @%s (getMe: can_read_all_group_messages is false): in groups "
    "Telegram delivers only /commands and replies to the bot, so plain messages that @mention it may "
    "never arrive. Turn it off with @BotFather /setprivacy (then remove and re-add the bot to each "
    "group) or make the bot a group admin"
)
GROUP_CONTEXT_PRIVACY_WARNING = (
    "telegram privacy mode is on for @%s: group context (sessions.group_context_messages) stays empty, "
    "because Telegram does not deliver group messages that are not addressed to the bot. Turn privacy "
    "mode off with @BotFather /setprivacy (then remove and re-add the bot to each group)"
)


@dataclass(frozen=True)
class CommandMenu:
    """The native command menus, per audience (Telegram Bot API setMyCommands with a
    BotCommandScope; clients show the most specific scope that has commands).

    Attributes:
        private: ``(name, description)`` pairs for every private chat (BotCommandScopeAllPrivateChats).
        groups: pairs for group and supergroup chats (BotCommandScopeAllGroupChats).
        admins: pairs for the private chats of ``admin_chat_ids`` (BotCommandScopeChat; Telegram
            answers "chat not found" until that user has written to the bot, so such a menu is set
            at the next start after their first message).
        admin_chat_ids: Telegram user ids (= their private chat ids) of the gateway's admins.

        languages: the same menus per language, by two-letter ISO 639-1 code (setMyCommands
            ``language_code``: a client whose language is ``zh`` shows the ``zh`` menu of a scope,
            others the menu without a language); their own ``admin_chat_ids`` are not used.

    Names must be unique per menu, 1-32 characters of ``a-z``, ``0-9`` and ``_``, at most 100 per
    menu; descriptions 1-256 characters (otherwise Telegram refuses the whole menu with 400).
    """

    private: Sequence[tuple[str, str]] = (("help", "What this bot can do"), ("stop", "Stop the running turn"))
    groups: Sequence[tuple[str, str]] = (("help", "What this bot can do"), ("stop", "Stop the running turn"))
    admins: Sequence[tuple[str, str]] = ()
    admin_chat_ids: Sequence[int] = field(default_factory=tuple)
    languages: Mapping[str, CommandMenu] = field(default_factory=dict)


class TelegramAdapter:
    """One Telegram bot.

    Args:
        token: the bot token (secret; never logged).
        base_url: Bot API root, e.g. ``https://api.telegram.org`` or a loopback fake.
        mode: ``polling`` or ``webhook``.
        webhook_secret: required in webhook mode; checked against
            ``X-Telegram-Bot-Api-Secret-Token`` (Telegram Bot API: setWebhook ``secret_token``).
        webhook_url: when set, registered with ``setWebhook`` at start.
        poll_timeout_s: long-poll ``timeout`` of ``getUpdates``.
        menu: the native command menus per audience (``CommandMenu``; default: help and stop).
        group_context: hand group messages not addressed to the bot to the sink as
            ``context_only`` (some chat keeps group context); otherwise they are ignored here.
        max_download_bytes: the largest file ``getFile`` serves (cloud Bot API: 20 MB; a local
            Bot API server: 2,000 MB).
        local_mode: ``base_url`` is a local Bot API server run with ``--local`` (PTB reads files
            from the path ``getFile`` returns).
        max_upload_bytes: largest file the bot may send (Bot API: 50 MB; 2,000 MB through a local
            Bot API server).
        working_reaction: the emoji that marks the user's message while a turn runs in a chat that
            refuses the typing action (one of Telegram's reaction emoji; ``""``: none).
    """

    platform = "telegram"
    idempotent_send = False  # Bot API sendMessage has no idempotency key

    def __init__(self, *, token: str, base_url: str = "https://api.telegram.org", mode: str = "polling",
                 webhook_secret: str | None = None, webhook_url: str | None = None, poll_timeout_s: int = 30,
                 menu: CommandMenu | None = None, group_context: bool = False,
                 max_download_bytes: int = CLOUD_DOWNLOAD_LIMIT, local_mode: bool = False,
                 max_upload_bytes: int = DOCUMENT_MAX_BYTES, working_reaction: str = WORKING_REACTION) -> None:
        root = base_url.rstrip("/")
        self._group_context = group_context
        self.max_download_bytes = max_download_bytes
        self._updates_request = AiohttpRequest(connection_limit=2)
        self.bot = Bot(
            token,
            base_url=f"{root}/bot",
            base_file_url=f"{root}/file/bot",
            request=AiohttpRequest(connection_limit=32, read_timeout=15.0),
            get_updates_request=self._updates_request,
            local_mode=local_mode,
        )
        self.mode = mode
        self._files: FileReader | None = None
        self._max_file_bytes = max_upload_bytes
        self._webhook_secret = webhook_secret
        self._webhook_url = webhook_url
        self._poll_timeout = poll_timeout_s
        self._menu = menu or CommandMenu()
        self._sink: InboundSink | None = None
        self._chat_left: ChatLeft | None = None
        self._identity: BotIdentity | None = None
        self._poller: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._working_reaction = working_reaction
        self._no_typing: set[str] = set()
        """Chats where Telegram refused sendChatAction: ``send_typing`` reacts there instead."""
        self._newest: dict[ChatAddress, int] = {}
        self._reacted: dict[ChatAddress, int] = {}
        bot_id = token.partition(":")[0]
        self.receiver_lease: str | None = f"receiver:telegram:{bot_id}" if mode == "polling" else None

    # -- lifecycle ---------------------------------------------------------------------------
    def routes(self) -> list[web.RouteDef]:
        return [web.post(WEBHOOK_PATH, self._handle_webhook)] if self.mode == "webhook" else []

    async def start(self, sink: InboundSink) -> None:
        """Reads the bot identity (``getMe``; warns when privacy mode hides plain group messages)
        and registers the command menus; in webhook mode registers the webhook when
        ``webhook_url`` is set. Polling begins in ``start_receiving``.

        Raises:
            CredentialRejected: Telegram refused the token (Bot API: 401 Unauthorized for a
                well-formed but invalid token, 404 Not Found for a malformed one; start-up must stop).
        """
        self._sink = sink
        try:
            await self.bot.initialize()
        except InvalidToken as exc:  # its message quotes the whole token: never shown, only chained
            raise CredentialRejected("telegram", ("token_env",), _rejection(exc)) from exc
        me = self.bot.bot
        self._identity = BotIdentity(me.id, me.username or "")
        log.info("telegram bot @%s (%s) starting in %s mode", me.username, me.id, self.mode)
        if not me.can_read_all_group_messages:
            log.warning(PRIVACY_WARNING, me.username)
            if self._group_context:
                log.warning(GROUP_CONTEXT_PRIVACY_WARNING, me.username)
        await self._set_menus()
        if self.mode == "webhook" and self._webhook_url:
            await self.bot.set_webhook(self._webhook_url, secret_token=self._webhook_secret,
                                       allowed_updates=ALLOWED_UPDATES, drop_pending_updates=False)

    async def _set_menus(self) -> None:
        """One setMyCommands per audience of ``CommandMenu`` and language (the menus without a
        ``language_code`` and each of ``languages``), sent together; a refused menu is logged and the
        others are still set (the commands work typed either way)."""
        base = self._menu
        scopes: list[tuple[BotCommandScope, Sequence[tuple[str, str]], str | None, str]] = []
        for code, menu in [(None, base), *base.languages.items()]:
            where = f" ({code})" if code else ""
            scopes += [(BotCommandScopeAllPrivateChats(), menu.private, code, f"private chats{where}"),
                       (BotCommandScopeAllGroupChats(), menu.groups, code, f"group chats{where}")]
            if menu.admins:
                scopes += [(BotCommandScopeChat(chat_id), menu.admins, code, f"admin chat {chat_id}{where}")
                           for chat_id in base.admin_chat_ids]

        async def set_menu(scope: BotCommandScope, commands: Sequence[tuple[str, str]], code: str | None,
                           what: str) -> None:
            try:
                await self.bot.set_my_commands([BotCommand(name, text) for name, text in commands], scope=scope,
                                               language_code=code)
            except BadRequest as exc:
                if "chat not found" in exc.message.lower():
                    log.info("telegram command menu for %s not set yet: the admin has not written to the bot", what)
                else:
                    log.warning("telegram setMyCommands for %s refused: %s", what, exc.message)
            except TelegramError as exc:
                log.warning("telegram setMyCommands for %s failed: %s", what, exc)

        await asyncio.gather(*(set_menu(*entry) for entry in scopes))  # one round trip, not one per menu

    async def start_receiving(self) -> None:
        """Starts long polling (polling mode; pending updates are kept, never dropped)."""
        if self.mode != "polling" or self._poller is not None:
            return
        await self.bot.delete_webhook(drop_pending_updates=False)
        self._stopping.clear()
        self._poller = asyncio.create_task(self._poll(), name="telegram-poll")

    async def stop_receiving(self) -> None:
        self._stopping.set()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._poller
            self._poller = None

    async def stop(self) -> None:
        await self.stop_receiving()
        await self.bot.shutdown()

    async def check(self) -> str:
        async with self.bot:
            me = await self.bot.get_me()
        return f"bot @{me.username} (id {me.id})"

    def bind_chat_left(self, callback: ChatLeft) -> None:
        """``callback`` learns of each group the bot was removed from (``my_chat_member``)."""
        self._chat_left = callback

    # -- inbound -----------------------------------------------------------------------------
    async def _poll(self) -> None:
        """The long-polling loop (Bot API ``getUpdates`` with ``offset``, ``timeout`` =
        ``poll_timeout_s`` and ``allowed_updates``), until ``stop_receiving``.

        The answer is read as JSON (``_api``): each update is checked (``update_problem``) and
        translated from its dict, never built into python-telegram-bot objects. An update that
        fails the check is logged once at WARNING, acknowledged and dropped; an update that could
        not be stored ends the batch without its offset confirmed, and the next poll, a second
        later, gets it again. ``RetryAfter`` waits as told; ``InvalidToken`` (the token was
        revoked) stops polling with an ERROR; other failures (``Conflict`` with another poller,
        network errors, a result that is not a list) are retried after ``_back_off``."""
        offset: int | None = None
        failures = 0
        # what Bot.get_updates does: the request's read timeout plus the long poll's own
        read_timeout = (self._updates_request.read_timeout or 0) + self._poll_timeout
        while not self._stopping.is_set():
            try:
                # the parameters in the order Bot.get_updates puts them on the wire
                batch = await self._api("getUpdates", {"timeout": self._poll_timeout, "offset": offset,
                                                       "allowed_updates": ALLOWED_UPDATES}, read_timeout=read_timeout)
            except asyncio.CancelledError:
                raise
            except RetryAfter as exc:
                await asyncio.sleep(_retry_after(exc))
                continue
            except InvalidToken:
                log.error("telegram rejected the bot token; polling stopped")
                return
            except TelegramError as exc:
                failures += 1
                await self._back_off(failures, str(exc))
                continue
            if not isinstance(batch, list):
                failures += 1
                await self._back_off(failures, f"its result is a {type(batch).__name__}, not a list")
                continue
            failures = 0
            for update in batch:
                problem = update_problem(update)
                if problem is not None:
                    update_id = update_id_of(update)
                    log.warning("telegram update %s unreadable (%s); acknowledged and dropped", update_id, problem)
                    if update_id is not None:
                        offset = update_id + 1
                    continue
                try:
                    await self._dispatch(update)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # Not stored: leave the offset unconfirmed so Telegram sends it again.
                    log.exception("could not store telegram update %s; will retry", update["update_id"])
                    await asyncio.sleep(1.0)
                    break
                offset = update["update_id"] + 1  # confirmed by the next getUpdates call

    @staticmethod
    async def _back_off(failures: int, reason: str) -> None:
        """Logs a failed ``getUpdates`` and sleeps 0.5 s × 2^``failures`` (at most 30 s) times a
        random 0.5-1: 0.5-1 s after the first failure in a row."""
        delay = min(30.0, 0.5 * 2 ** min(failures, 6)) * (0.5 + random.random() / 2)
        log.warning("telegram getUpdates failed (%s); retrying in %.1f s", reason, delay)
        await asyncio.sleep(delay)

    async def _dispatch(self, update: dict[str, Any]) -> None:
        """Normalizes one update (a Bot API ``Update`` as decoded JSON, already checked by
        ``adapters.telegram.wire.update_problem``) and hands it to the inbox: a message or a button
        press (answered with ``answerCallbackQuery`` first, so the client stops its spinner), or
        the bot's own membership change (``my_chat_member``: leaving a group is told to
        ``bind_chat_left``'s callback). An update the translation still cannot read is logged once
        at WARNING and dropped: asking for it again would fail the same way. Raises only when
        storing failed."""
        assert self._identity is not None and self._sink is not None
        member = update.get("my_chat_member")
        if member is not None:  # the bot's own membership changed (Bot API: ChatMemberUpdated)
            now, chat = member["new_chat_member"], member["chat"]
            gone = now["status"] in GONE_STATUSES and now["user"]["id"] == self._identity.id
            if gone and chat["type"] != "private" and self._chat_left is not None:
                await self._chat_left(ChatAddress("telegram", str(self._identity.id), str(chat["id"])))
            return
        query = update.get("callback_query")
        try:
            if query is not None:
                try:
                    await self.bot.answer_callback_query(query["id"])
                except TelegramError as exc:
                    log.warning("answerCallbackQuery failed: %s", exc)
                result = callback_to_inbound(update, self._identity)
            else:
                result = to_inbound(update, self._identity, ambient=self._group_context)
        except Exception as exc:
            log.warning("telegram update %s could not be read (%s); acknowledged and dropped", update_id_of(update),
                        type(exc).__name__)
            return
        if isinstance(result, Ignored):
            migrated = (update.get("message") or {}).get("migrate_to_chat_id")
            if migrated is not None:  # Bot API Message.migrate_to_chat_id: the group became a supergroup
                log.warning("telegram group %s became supergroup %s: replies follow it, but its conversation, "
                            "settings and any configuration naming the old id (access lists, chats, job targets) "
                            "do not; update them", update["message"]["chat"]["id"], migrated)
            log.debug("telegram update %s ignored: %s", update["update_id"], result.reason)
            return
        await self._sink(result)
        if not result.context_only and query is None:  # the message a reaction would mark
            self._newest[result.address] = update["message"]["message_id"]
            while len(self._newest) > _MAX_REMEMBERED:
                del self._newest[next(iter(self._newest))]

    async def _handle_webhook(self, request: web.Request) -> web.Response:
        """Telegram webhook: the secret (setWebhook ``secret_token``) is compared on the header's raw
        bytes before the body is read; a wrong or missing one gets 401 and nothing is parsed. An
        authentic update that cannot be understood is answered 200 (Telegram would send it again
        and again) and logged once; only a failed inbox write answers 500."""
        secret = header_bytes(request.headers.get("X-Telegram-Bot-Api-Secret-Token"))
        if not self._webhook_secret or not hmac.compare_digest(secret, self._webhook_secret.encode()):
            # which check failed, never the token (as the Slack and Feishu adapters log theirs)
            refused = "no webhook secret configured" if not self._webhook_secret else \
                "no secret token header" if not secret else "wrong secret token"
            log.warning("telegram webhook rejected with 401: %s", refused)
            return web.json_response({"ok": False, "error": "unauthorized"}, status=401)
        try:
            data = load_json(await request.read())
        except UnreadableBody as exc:
            log.warning("telegram webhook body unreadable (%s); acknowledged and dropped", exc)
            return _acknowledged()
        problem = update_problem(data)
        if problem is not None:
            log.warning("telegram update %s unreadable (%s); acknowledged and dropped", update_id_of(data), problem)
            return _acknowledged()
        try:
            await self._dispatch(data)
        except Exception:
            log.exception("could not store telegram update %s; asking Telegram to retry", data["update_id"])
            return web.json_response({"ok": False}, status=500)
        return _acknowledged()

    # -- outbound ----------------------------------------------------------------------------
    def bind_files(self, reader: FileReader) -> None:
        """Where the bytes of outbound files come from (the gateway's blob store)."""
        self._files = reader

    def attachment_problem(self, attachment: OutboundAttachment) -> str | None:
        """See ``FileSendingAdapter``; ``adapters.telegram.files`` has the rules."""
        return attachment_problem(attachment, self._max_file_bytes)

    def _parts(self, message: OutboundMessage) -> list[Chunk | tuple[OutboundAttachment, Chunk | None]]:
        """The reply's parts in order: text chunks, then per attachment its caption (as text parts
        first when it does not fit a caption's 1024 units) and the file with the caption."""
        if message.format == "markdown":
            parts: list[Chunk | tuple[OutboundAttachment, Chunk | None]] = list(format_reply(message.text))
        else:
            parts = [c for c in chunk_text(message.text, []) if c.text.strip()]
        for attachment in message.attachments:
            caption = format_reply(attachment.caption, CAPTION_LIMIT) if attachment.caption.strip() else []
            if len(caption) > 1:
                parts += format_reply(attachment.caption)
                caption = []
            parts.append((attachment, caption[0] if caption else None))
        return parts

    async def send(self, message: OutboundMessage, on_part: PartSent | None = None,
                   before_part: BeforePart | None = None) -> DeliveryResult:
        """Sends the reply as one or more sendMessage calls (text + entities, ≤ 4096 UTF-16 units
        each), quoting ``reply_to_id`` on the first, then each attachment as a multipart
        ``sendPhoto`` (a picture within the photo rules, ``adapters.telegram.files``) or
        ``sendDocument`` with its caption. Parts already sent (``resume_from``) are skipped, so a
        retried delivery never repeats a part. With ``edit_id`` (a streamed preview), part 1 is an
        editMessageText of that message instead of a new message."""
        parts = self._parts(message)
        ids: list[str] = []
        address = message.address
        index = 0
        while index < len(parts):
            part = parts[index]
            if index < message.resume_from:
                index += 1
                continue
            quote = message.reply_to_id if index == 0 and address == message.address else None
            markup = _keyboard(message.buttons) if index == len(parts) - 1 else None
            data = None
            if isinstance(part, tuple):
                data = await self._files.read(part[0].sha256) if self._files is not None else None
                if data is None:
                    return DeliveryResult(False, tuple(ids), error=f"file {part[0].name} is no longer stored")
            if before_part is not None:
                await before_part(index)
            try:
                if isinstance(part, tuple):
                    assert data is not None
                    sent_id = await self._send_file(address, part[0], data, part[1], quote, markup)
                elif index == 0 and message.edit_id and address == message.address:
                    sent_id = await self._edit_chunk(address, message.edit_id, part, quote)
                else:
                    sent_id = await self._send_chunk(address, part, quote, markup)
            except RetryAfter as exc:
                return DeliveryResult(False, tuple(ids), retryable=True, retry_after=_retry_after(exc),
                                      error="telegram flood control")
            except ChatMigrated as exc:
                if address != message.address:  # migrated twice: give up
                    return DeliveryResult(False, tuple(ids), error=f"chat migrated to {exc.new_chat_id}")
                # Bot API: a group upgraded to a supergroup answers 400 with parameters.migrate_to_chat_id;
                # the same part goes to the supergroup (nothing was sent to the old id).
                log.warning("telegram chat %s became supergroup %s; this reply goes there (update chat ids "
                            "in the configuration: access lists, chats, job targets)", address.chat_id,
                            exc.new_chat_id)
                address = dataclasses.replace(address, chat_id=str(exc.new_chat_id))
                continue
            except Forbidden as exc:
                return DeliveryResult(False, tuple(ids), error=f"forbidden: {exc.message}")
            except BadRequest as exc:
                return DeliveryResult(False, tuple(ids), error=f"bad request: {exc.message}")
            except (NetworkError, TelegramError) as exc:
                # HTTP 413 (an upload over the Bot API's limit) fails the same way every time.
                too_big = "entity too large" in str(exc).lower()
                return DeliveryResult(False, tuple(ids), retryable=not too_big, error=f"network: {exc}")
            ids.append(sent_id)
            if on_part is not None and index < len(parts) - 1:
                await on_part(sent_id)  # recorded before the next part: a crash never repeats it
            index += 1
        await self._clear_reaction(message.address)  # the answer is there: no more "working on it"
        return DeliveryResult(True, tuple(ids))

    async def _send_file(self, address: ChatAddress, attachment: OutboundAttachment, data: bytes,
                         caption: Chunk | None, quote: str | None, markup: InlineKeyboardMarkup | None) -> str:
        """One multipart upload: ``sendPhoto`` when the picture keeps Telegram's photo rules, else
        ``sendDocument``; a photo Telegram still refuses (``PHOTO_REFUSALS``: nothing was sent) goes
        again as a document. Caption entities
        Telegram refuses (``_entities_refused``) are dropped and the upload made once more."""
        kwargs: dict[str, object] = {"chat_id": int(address.chat_id), "read_timeout": FILE_READ_TIMEOUT_S}
        if caption is not None:
            kwargs["caption"] = caption.text
            if caption.entities:
                kwargs["caption_entities"] = [MessageEntity(e.type, e.offset, e.length, url=e.url, language=e.language)
                                              for e in caption.entities]
        if markup is not None:
            kwargs["reply_markup"] = markup
        if address.thread_id:
            kwargs["message_thread_id"] = int(address.thread_id)
        if quote:
            kwargs["reply_parameters"] = ReplyParameters(int(quote), allow_sending_without_reply=True)
        async def upload(photo: bool) -> str:
            method, field = (self.bot.send_photo, "photo") if photo else (self.bot.send_document, "document")
            try:
                sent = await method(**{field: InputFile(data, filename=attachment.name)}, **kwargs)  # type: ignore[arg-type]
            except BadRequest as exc:
                if "caption_entities" not in kwargs or not _entities_refused(exc):
                    raise
                log.warning("telegram rejected the caption's entities (%s); sending it as plain text", exc.message)
                del kwargs["caption_entities"]
                sent = await method(**{field: InputFile(data, filename=attachment.name)}, **kwargs)  # type: ignore[arg-type]
            return str(sent.message_id)

        if as_photo(attachment):
            try:
                return await upload(photo=True)
            except BadRequest as exc:
                if not any(code in exc.message.upper() for code in PHOTO_REFUSALS):
                    raise
                log.warning("telegram refused %s as a photo (%s); sending it as a document", attachment.name,
                            exc.message)
        return await upload(photo=False)

    async def _api(self, method: str, params: dict[str, object], *,
                   read_timeout: ODVInput[float] = DEFAULT_NONE) -> Any:
        """One Bot API call (``method`` as Telegram names it, e.g. ``sendMessage``) through
        ``Bot.do_api_request``, returning the raw ``result`` JSON (a ``dict`` for a message, ``True``
        for an inline one, a ``list`` of update dicts for ``getUpdates``): building PTB's objects
        (≈130 µs of CPU for a ``Message``, 100-230 µs for an ``Update``) is skipped. ``read_timeout``:
        seconds to wait for the answer (default: the request's own; ``None``: no limit). The path
        is that of ``bot.send_message`` and friends:
        ``params`` (``TelegramObject`` values serialised by ``to_dict``, ``None`` values dropped, in
        the order given) go through the same request seam and raise the same exceptions
        (``RetryAfter``, ``BadRequest``, ``Forbidden``, ``ChatMigrated``, ``InvalidToken``,
        ``TimedOut``, ``NetworkError``)."""
        try:
            return await self.bot.do_api_request(method, api_kwargs=params, read_timeout=read_timeout)
        except EndPointNotFound as exc:
            # do_api_request's name for a 401/404 once the bot is initialized (it takes a 404 for an
            # unknown method): the named methods raise the InvalidToken it chains, and so do we.
            if isinstance(exc.__cause__, InvalidToken):
                raise exc.__cause__ from None
            raise

    async def _send_chunk(self, address: ChatAddress, chunk: Chunk, quote: str | None,
                          markup: InlineKeyboardMarkup | None = None) -> str:
        """One sendMessage of ``chunk`` (text + entities) quoting ``quote``; returns the new message's
        id. When Telegram refuses the entities (``_entities_refused``: nothing was sent), the text is
        sent once more as plain text. Raises PTB's ``TelegramError`` subclasses (see ``_api``)."""
        entities = [e.to_api() for e in chunk.entities]  # dicts: PTB MessageEntity objects cost ~13 µs each
        # the parameters in the order bot.send_message puts them on the wire
        params: dict[str, object] = {"chat_id": int(address.chat_id), "text": chunk.text, "entities": entities or None,
                                     "message_thread_id": int(address.thread_id) if address.thread_id else None,
                                     "reply_markup": markup}
        if quote:
            params["reply_parameters"] = ReplyParameters(int(quote), allow_sending_without_reply=True)
        try:
            sent = await self._api("sendMessage", params)
        except BadRequest as exc:
            if not entities or not _entities_refused(exc):
                raise
            log.warning("telegram rejected entities (%s); resending as plain text", exc.message)
            sent = await self._api("sendMessage", {**params, "entities": None})
        return str(sent["message_id"])

    async def _edit_chunk(self, address: ChatAddress, message_id: str, chunk: Chunk, quote: str | None,
                          replace_gone: bool = True) -> str:
        """Edits the preview into ``chunk`` (editMessageText); returns the id of the message that now
        shows it. "message is not modified" is success. A preview that no longer exists (deleted
        by a user: 400 "message to edit not found") is replaced by a new message when
        ``replace_gone`` (the reply's delivery), else that ``BadRequest`` is raised (a preview's
        edits: each would post the text so far again). Raises PTB's ``TelegramError`` subclasses."""
        entities = [e.to_api() for e in chunk.entities]
        # the parameters in the order bot.edit_message_text puts them on the wire
        params: dict[str, object] = {"text": chunk.text, "chat_id": int(address.chat_id), "message_id": int(message_id),
                                     "entities": entities or None}
        try:
            try:
                await self._api("editMessageText", params)
            except BadRequest as exc:
                if not entities or not _entities_refused(exc):
                    raise
                log.warning("telegram rejected entities (%s); editing as plain text", exc.message)
                await self._api("editMessageText", {**params, "entities": None})
        except BadRequest as exc:
            text = exc.message.lower()
            if "message is not modified" in text:
                return message_id
            if "message to edit not found" in text and replace_gone:
                log.warning("telegram preview %s is gone; sending the reply as a new message", message_id)
                return await self._send_chunk(address, chunk, quote)
            raise
        return message_id

    async def edit(self, address: ChatAddress, message_id: str, text: str) -> DeliveryResult:
        """Replaces the text of the bot's message with plain ``text`` (Bot API editMessageText;
        ≤ 4096 UTF-16 units, longer text is cut). "message is not modified" counts as success; a
        message that is gone (deleted by the user) is a failure, never posted again."""
        chunks = [c for c in chunk_text(text, []) if c.text.strip()] or [Chunk(" ", ())]
        try:
            await self._edit_chunk(address, message_id, chunks[0], None, replace_gone=False)
        except RetryAfter as exc:
            return DeliveryResult(False, retryable=True, retry_after=_retry_after(exc), error="telegram flood control")
        except BadRequest as exc:
            return DeliveryResult(False, error=f"bad request: {exc.message}")
        except TelegramError as exc:
            return DeliveryResult(False, retryable=True, error=f"network: {exc}")
        return DeliveryResult(True, (message_id,))

    # -- files -------------------------------------------------------------------------------
    def download_limit(self, attachment: Attachment) -> int | None:
        """Bot API ``getFile``: at most 20 MB on the cloud API (``max_download_bytes``)."""
        return self.max_download_bytes

    async def download(self, message: InboundMessage, attachment: Attachment, max_bytes: int) -> tuple[bytes, str]:
        """``getFile`` then ``GET {base_url}/file/bot<token>/<file_path>`` (the file path is valid
        for an hour, so it is asked for at download time). The size the update declared is
        checked first; ``getFile`` answers 400 "Bad Request: file is too big" above the limit.

        Raises:
            FileTooBig: above ``max_bytes`` or the Bot API's limit. DownloadFailed: anything else.
        """
        limit = min(max_bytes, self.max_download_bytes)
        who = "Telegram bots" if self.max_download_bytes <= max_bytes else "this gateway"
        if attachment.size is not None and attachment.size > limit:
            raise FileTooBig(attachment.size, limit, who)
        try:
            file = await self.bot.get_file(attachment.file_id)
            if file.file_size is not None and file.file_size > limit:
                raise FileTooBig(file.file_size, limit, who)
            data = bytes(await file.download_as_bytearray(read_timeout=DOWNLOAD_READ_TIMEOUT_S))
        except BadRequest as exc:
            if "too big" in exc.message.lower():
                raise FileTooBig(attachment.size, self.max_download_bytes, "Telegram bots") from None
            raise DownloadFailed(f"Telegram did not hand over the file ({exc.message})") from None
        except (NetworkError, TelegramError) as exc:
            raise DownloadFailed(f"Telegram did not hand over the file ({type(exc).__name__})",
                                 retryable=True) from None
        if len(data) > limit:
            raise FileTooBig(len(data), limit, who)
        return data, attachment.mime_type or "application/octet-stream"

    async def send_typing(self, address: ChatAddress) -> None:
        """Shows "typing…" (sendChatAction, ≤ 5 s, repeated by the caller). In a chat where
        Telegram refuses the chat action (400/403: e.g. a group whose permissions do not let the
        bot appear typing, a channel), a ``WORKING_REACTION`` on the user's newest message stands
        in for it once (setMessageReaction) and is taken away when the reply is sent. Best effort:
        errors are logged at DEBUG."""
        if address.chat_id not in self._no_typing:
            try:
                await self.bot.send_chat_action(
                    int(address.chat_id), "typing",
                    message_thread_id=int(address.thread_id) if address.thread_id else None,
                )
                return
            except (BadRequest, Forbidden) as exc:
                log.info("telegram chat %s refuses the typing action (%s); a reaction shows work instead",
                         address.chat_id, exc.message)
                self._no_typing.add(address.chat_id)
            except TelegramError as exc:
                log.debug("sendChatAction failed: %s", exc)
                return
        newest = self._newest.get(address)
        if not self._working_reaction or newest is None or self._reacted.get(address) == newest:
            return
        try:
            await self.bot.set_message_reaction(int(address.chat_id), newest, reaction=self._working_reaction)
            self._reacted[address] = newest
        except TelegramError as exc:
            log.debug("setMessageReaction failed: %s", exc)

    async def _clear_reaction(self, address: ChatAddress) -> None:
        """Takes the ``WORKING_REACTION`` of ``send_typing`` away (setMessageReaction with none)."""
        marked = self._reacted.pop(address, None)
        if marked is None:
            return
        try:
            await self.bot.set_message_reaction(int(address.chat_id), marked, reaction=[])
        except TelegramError as exc:
            log.debug("setMessageReaction (clear) failed: %s", exc)


_ACK_BODY = b'{"ok": true}'


def _acknowledged() -> web.Response:
    """The webhook's 200 ``{"ok": true}``, as ``web.json_response({"ok": True})`` would send it
    (``Content-Type: application/json; charset=utf-8``) without encoding it on every update."""
    return web.Response(body=_ACK_BODY, content_type="application/json", charset="utf-8")


def _keyboard(buttons: tuple[tuple[str, str], ...]) -> InlineKeyboardMarkup | None:
    """One row of inline buttons whose ``callback_data`` is the command text (≤ 64 bytes)."""
    row = [InlineKeyboardButton(label, callback_data=command) for label, command in buttons
           if len(command.encode()) <= 64]
    return InlineKeyboardMarkup([row]) if row else None


def _entities_refused(exc: BadRequest) -> bool:
    """Whether a 400 is about the entities sent, whatever the wording: "can't parse entities: ..."
    and TDLib's entity checks ("entity URL '...' is invalid: ...", "MessageEntityTextUrl.url must be
    encoded in UTF-8": td/telegram/MessageEntity.cpp ``get_message_entities``). PTB lowercases the
    description, so the match ignores case."""
    return "entit" in exc.message.lower()


def _seconds(value: object) -> float:
    """Seconds from PTB's ``retry_after`` (int now, ``timedelta`` in PTB's next major version)."""
    seconds = getattr(value, "total_seconds", None)
    return float(seconds()) if callable(seconds) else float(value)  # type: ignore[arg-type]


def _rejection(exc: InvalidToken) -> str:
    """``401 Unauthorized`` / ``404 Not Found`` from PTB's ``InvalidToken`` (raised for both; the
    Bot API's description is the message of the exception it chains)."""
    description = str(exc.__cause__ or "").strip()
    return {"unauthorized": "401 Unauthorized", "not found": "404 Not Found"}.get(
        description.lower(), "401 Unauthorized or 404 Not Found")


def _retry_after(exc: RetryAfter) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PTB deprecation notice about the attribute's future type
        return _seconds(exc.retry_after)
