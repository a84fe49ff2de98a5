"""Telegram adapter: python-telegram-bot glue (long polling or webhook), send, typing.

Acknowledgement rule (DESIGN §3.1): with long polling, confirming ``offset = update_id + 1`` is
the ack, so an update's offset is confirmed only after the gateway stored it in the inbox. We
drive ``getUpdates`` ourselves instead of PTB's ``Updater``, which confirms the next offset before
handlers have run. Pending updates are never dropped at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import random
import warnings

from aiohttp import web
from telegram import Bot, BotCommand, MessageEntity, ReplyParameters, Update
from telegram.error import BadRequest, ChatMigrated, Forbidden, InvalidToken, NetworkError, RetryAfter, TelegramError
from telegram.request import HTTPXRequest

from adapters.telegram.format import Chunk, chunk_text, format_reply
from adapters.telegram.inbound import BotIdentity, Ignored, to_inbound
from gateway.ports import BeforePart, InboundSink, PartSent
from gateway.types import ChatAddress, DeliveryResult, OutboundMessage

log = logging.getLogger("adapters.telegram")

WEBHOOK_PATH = "/telegram/webhook"
ALLOWED_UPDATES = ["message", "edited_message", "callback_query"]
COMMANDS = [("help", "What this bot can do"), ("new", "Start a fresh conversation"), ("stop", "Stop the running turn"),
            ("schedule", "Schedule a report: /schedule \"0 9 * * 1-5\" Zone what to report"),
            ("jobs", "Your scheduled reports"), ("run", "Fire a scheduled report now: /run ID"),
            ("unschedule", "Remove a scheduled report: /unschedule ID")]


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
    """

    platform = "telegram"
    idempotent_send = False  # Bot API sendMessage has no idempotency key

    def __init__(self, *, token: str, base_url: str = "https://api.telegram.org", mode: str = "polling",
                 webhook_secret: str | None = None, webhook_url: str | None = None, poll_timeout_s: int = 30) -> None:
        root = base_url.rstrip("/")
        self.bot = Bot(
            token,
            base_url=f"{root}/bot",
            base_file_url=f"{root}/file/bot",
            request=HTTPXRequest(connection_pool_size=64, pool_timeout=10.0, read_timeout=15.0),
            get_updates_request=HTTPXRequest(connection_pool_size=2),
        )
        self.mode = mode
        self._webhook_secret = webhook_secret
        self._webhook_url = webhook_url
        self._poll_timeout = poll_timeout_s
        self._sink: InboundSink | None = None
        self._identity: BotIdentity | None = None
        self._poller: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        bot_id = token.partition(":")[0]
        self.receiver_lease: str | None = f"receiver:telegram:{bot_id}" if mode == "polling" else None

    # -- lifecycle ---------------------------------------------------------------------------
    def routes(self) -> list[web.RouteDef]:
        return [web.post(WEBHOOK_PATH, self._handle_webhook)] if self.mode == "webhook" else []

    async def start(self, sink: InboundSink) -> None:
        """Reads the bot identity (``getMe``) and registers the command menu; in webhook mode
        registers the webhook when ``webhook_url`` is set. Polling begins in ``start_receiving``.

        Raises:
            telegram.error.InvalidToken: the token is wrong (start-up must stop).
        """
        self._sink = sink
        await self.bot.initialize()
        me = self.bot.bot
        self._identity = BotIdentity(me.id, me.username or "")
        log.info("telegram bot @%s (%s) starting in %s mode", me.username, me.id, self.mode)
        try:
            await self.bot.set_my_commands([BotCommand(name, text) for name, text in COMMANDS])
        except TelegramError as exc:
            log.warning("telegram setMyCommands failed: %s", exc)
        if self.mode == "webhook" and self._webhook_url:
            await self.bot.set_webhook(self._webhook_url, secret_token=self._webhook_secret,
                                       allowed_updates=ALLOWED_UPDATES, drop_pending_updates=False)

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

    # -- inbound -----------------------------------------------------------------------------
    async def _poll(self) -> None:
        offset: int | None = None
        failures = 0
        while not self._stopping.is_set():
            try:
                updates = await self.bot.get_updates(offset=offset, timeout=self._poll_timeout,
                                                     allowed_updates=ALLOWED_UPDATES)
                failures = 0
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
                delay = min(30.0, 0.5 * 2 ** min(failures, 6)) * (0.5 + random.random() / 2)
                log.warning("telegram getUpdates failed (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                continue
            for update in updates:
                try:
                    await self._dispatch(update)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # Not stored: leave the offset unconfirmed so Telegram sends it again.
                    log.exception("could not store telegram update %s; will retry", update.update_id)
                    await asyncio.sleep(1.0)
                    break
                offset = update.update_id + 1  # confirmed by the next getUpdates call

    async def _dispatch(self, update: Update) -> None:
        assert self._identity is not None and self._sink is not None
        if update.callback_query is not None:
            try:
                await self.bot.answer_callback_query(update.callback_query.id)
            except TelegramError as exc:
                log.warning("answerCallbackQuery failed: %s", exc)
            return
        result = to_inbound(update, self._identity)
        if isinstance(result, Ignored):
            log.debug("telegram update %s ignored: %s", update.update_id, result.reason)
            return
        await self._sink(result)

    async def _handle_webhook(self, request: web.Request) -> web.Response:
        secret = request.headers.get("X-Telegram-Bot-Api-Secret-Token", "")
        if not self._webhook_secret or not hmac.compare_digest(secret.encode(), self._webhook_secret.encode()):
            return web.json_response({"ok": False, "error": "unauthorized"}, status=401)
        try:
            data = json.loads(await request.read())
            update = Update.de_json(data, self.bot)
        except Exception as exc:
            log.warning("malformed telegram webhook payload ignored: %s", exc)
            return web.json_response({"ok": True})
        try:
            await self._dispatch(update)
        except Exception:
            log.exception("could not store telegram update %s; asking Telegram to retry", update.update_id)
            return web.json_response({"ok": False}, status=500)
        return web.json_response({"ok": True})

    # -- outbound ----------------------------------------------------------------------------
    async def send(self, message: OutboundMessage, on_part: PartSent | None = None,
                   before_part: BeforePart | None = None) -> DeliveryResult:
        """Sends the reply as one or more sendMessage calls (text + entities, ≤ 4096 UTF-16 units
        each), quoting ``reply_to_id`` on the first. Parts already sent (``resume_from``) are
        skipped, so a retried delivery never repeats a part."""
        if message.format == "markdown":
            chunks = format_reply(message.text)
        else:
            chunks = [c for c in chunk_text(message.text, []) if c.text.strip()]
        ids: list[str] = []
        for index, chunk in enumerate(chunks):
            if index < message.resume_from:
                continue
            quote = message.reply_to_id if index == 0 else None
            if before_part is not None:
                await before_part(index)
            try:
                sent_id = await self._send_chunk(message.address, chunk, quote)
            except RetryAfter as exc:
                return DeliveryResult(False, tuple(ids), retryable=True, retry_after=_retry_after(exc),
                                      error="telegram flood control")
            except ChatMigrated as exc:
                return DeliveryResult(False, tuple(ids), error=f"chat migrated to {exc.new_chat_id}")
            except Forbidden as exc:
                return DeliveryResult(False, tuple(ids), error=f"forbidden: {exc.message}")
            except BadRequest as exc:
                return DeliveryResult(False, tuple(ids), error=f"bad request: {exc.message}")
            except (NetworkError, TelegramError) as exc:
                return DeliveryResult(False, tuple(ids), retryable=True, error=f"network: {exc}")
            ids.append(sent_id)
            if on_part is not None and index < len(chunks) - 1:
                await on_part(sent_id)  # recorded before the next part: a crash never repeats it
        return DeliveryResult(True, tuple(ids))

    async def _send_chunk(self, address: ChatAddress, chunk: Chunk, quote: str | None) -> str:
        kwargs: dict[str, object] = {"chat_id": int(address.chat_id), "text": chunk.text}
        if address.thread_id:
            kwargs["message_thread_id"] = int(address.thread_id)
        if quote:
            kwargs["reply_parameters"] = ReplyParameters(int(quote), allow_sending_without_reply=True)
        entities = [MessageEntity(e.type, e.offset, e.length, url=e.url, language=e.language) for e in chunk.entities]
        try:
            sent = await self.bot.send_message(entities=entities or None, **kwargs)  # type: ignore[arg-type]
        except BadRequest as exc:
            if not entities or "can't parse entities" not in exc.message.lower():
                raise
            log.warning("telegram rejected entities (%s); resending as plain text", exc.message)
            sent = await self.bot.send_message(**kwargs)  # type: ignore[arg-type]
        return str(sent.message_id)

    async def send_typing(self, address: ChatAddress) -> None:
        try:
            await self.bot.send_chat_action(
                int(address.chat_id), "typing",
                message_thread_id=int(address.thread_id) if address.thread_id else None,
            )
        except TelegramError as exc:
            log.debug("sendChatAction failed: %s", exc)


def _seconds(value: object) -> float:
    """Seconds from PTB's ``retry_after`` (int now, ``timedelta`` in PTB's next major version)."""
    seconds = getattr(value, "total_seconds", None)
    return float(seconds()) if callable(seconds) else float(value)  # type: ignore[arg-type]


def _retry_after(exc: RetryAfter) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PTB deprecation notice about the attribute's future type
        return _seconds(exc.retry_after)
