"""``Inbound``: the adapters' sink. Every message an adapter accepted comes through ``receive``.

One message, in order (DESIGN §3.2):

1. every stored string is cleaned (``storable_inbound``) and pasted secrets are redacted, so the
   inbox never holds either;
2. one call on the DB pool (``_admit``): who sent it (``Directory.identify``), its session key,
   whether the bot is part of that conversation, the access decision, and, for an ordinary
   message, the inbox row (a unique key drops the platforms' retries);
3. control commands (``/stop``, ``/status``, ``/approve``, ``/deny``, ``/language``) and pairing codes are
   answered at once, outside the lane, their reply queued in the same transaction as their row;
4. the lane is kicked: a worker thread runs the turn (``gateway.bus``).

``receive`` returns only once the row is committed: an adapter acknowledges the platform after it
returns, and not at all when it raises (the platform retries).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from agent.redact import Redactor
from gateway.bus.lanes import Claimed, SessionBus
from gateway.bus.turns import TurnRunner
from gateway.core.config import GatewayConfig
from gateway.core.i18n import N_, _, choose, in_locale, using
from gateway.core.session_keys import is_dm_key, session_key_for
from gateway.core.types import InboundMessage, OutboundMessage
from gateway.inbound.access import decide, is_admin, may_run_guarded_tools
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.telemetry import span as traced
from gateway.sessions.commands import CONTROL_COMMANDS, CommandContext, control_reply
from gateway.sessions.directory import Directory, Identity
from gateway.sessions.group_context import GroupContextStore
from gateway.sessions.language import language_reply
from gateway.store.db import write_tx
from gateway.store.group_commit import GroupCommit, submit_via
from gateway.store.sql import Store, retry_locked
from gateway.store.text import storable_inbound
from gateway.tools.approvals import decide_reply
from gateway.tools.approvals_store import Approvals

log = logging.getLogger("gateway")
T = TypeVar("T")

Admitted = tuple[InboundMessage, Identity, str, str, "bool | None", bool, "Claimed | None"]
"""What ``Inbound._admit`` returns: ``(message, identity, session key, decision, stored, interrupts,
claimed)``; ``claimed``: the message's lane was free (new, or its last turn ended) and was claimed in
the same transaction (``SessionBus.claim_free_in``)."""

PAIRING_TEXT = N_(
    "Hello! I don't know you yet. Ask an admin to approve you with this code: {code}\n"
    "(They send /approve_user {code} to me, or run: gateway pairing approve {code})"
)


class Inbound:
    """Receives messages from the adapters into the inbox and kicks their lanes.

    Args:
        run_db: runs a blocking store call on the main loop's DB pool.
        model_name: the chat model's name now (``/status`` shows it).
        wake_delivery: called on the main loop when a reply was queued here.
        write_now: runs a call that makes one write transaction on the main loop when that never
            waits, else writes nothing (``Gateway.write_now``); ``None``: always the DB pool.
        submit_db: queues a call for the DB pool, returning its future (``Gateway.submit_db``);
            ``None``: a task running ``run_db``.
        busy_policy: the busy policy of a message's chat, ``(message, conn)`` (blocking, on the DB
            pool; per-chat settings, ``gateway.sessions.chat_settings``; ``conn``: read in that
            transaction, or ``None``); ``None``: ``bus.busy_policy`` everywhere.
        prime_settings: reads the chat settings of several messages together in a transaction,
            ``(messages, conn)``, ahead of ``busy_policy`` for each (``ChatSetup.prime``; a batch's
            admit); ``None``: each read on its own.

    Counters ``received``, ``duplicates`` and ``dropped`` count messages stored, refused as
    already stored, and not for the bot (unaddressed, or denied by the access rules).
    """

    def __init__(self, *, config: GatewayConfig, store: Store, directory: Directory, approvals: Approvals,
                 runner: TurnRunner, bus: SessionBus, metrics: GatewayMetrics, redact: Redactor,
                 run_db: Callable[..., Awaitable[Any]], model_name: Callable[[], str],
                 wake_delivery: Callable[[], None], group_context: GroupContextStore | None = None,
                 busy_policy: Callable[[InboundMessage, Connection | None], str] | None = None,
                 write_now: Callable[..., tuple[bool, Any]] | None = None,
                 submit_db: Callable[..., asyncio.Future[Any]] | None = None,
                 prime_settings: Callable[[list[InboundMessage], Connection], None] | None = None) -> None:
        self.busy_policy = busy_policy
        self.prime_settings = prime_settings
        # messages addressed to the bot arriving while one is written are admitted together
        submit = submit_db or submit_via(run_db)
        self._admits: GroupCommit[InboundMessage, Admitted] = GroupCommit(self._admit, self._admit_many,
                                                                          submit_db=submit, now=write_now)
        self.group_context = group_context
        self.config = config
        self.store = store
        self.directory = directory
        self.approvals = approvals
        self.runner = runner
        self.bus = bus
        self.metrics = metrics
        self.redact = redact
        self.run_db = run_db
        self.model_name = model_name
        self.wake_delivery = wake_delivery
        self.received = 0
        self.duplicates = 0
        self.dropped = 0

    def trusted(self, message: InboundMessage) -> bool:
        """May the sender run tools that need approval and approve them (blocking: a DB read in
        open access)? See ``gateway.inbound.access.may_run_guarded_tools``."""
        access = self.config.access
        return access.mode != "open" or is_admin(message, access) or may_run_guarded_tools(
            message, self.directory.identify(message).approved, access)

    async def receive(self, message: InboundMessage) -> bool:
        """Stores ``message`` in the inbox (dedupe) and schedules its lane.

        Returns ``False`` for a duplicate, an unaddressed message in a conversation the bot is not
        part of, or a sender the access rules deny. Raises if the database write failed (the
        adapter must not acknowledge the platform then).
        """
        with traced(f"receive {message.platform}", attributes={"gateway.platform": message.platform}) as span:
            stored = await self._receive(message)
            span.set_attribute("gateway.stored", stored)
            return stored

    def _admit(self, message: InboundMessage) -> Admitted:
        """The database part of receiving, in one call on the DB pool (one thread hop for an
        ordinary message): ``(message, identity, session key, decision, stored, interrupts)``.
        ``message`` has its ``locale`` chosen (the user's ``/language``, the platform's hint,
        ``i18n.default``) and is stored so; ``decision`` is the access decision, or ``unaddressed``
        for a thread message not for us; ``stored`` is whether an allowed non-control message went
        into the inbox (``None``: not stored here); ``interrupts`` whether it was stored under the
        busy policy ``interrupt`` (it cancels a running turn)."""
        if message.addressed:
            try:
                return self._admit_at_once(message)
            except IntegrityError:
                pass  # a redelivery, or a sender another instance created meanwhile: step by step below
        identity = self.directory.identify(message)
        message, key = self._keyed(message, identity)
        if not message.addressed and not self.store.lane_exists(key):
            self._keep_as_context(message)  # a thread the bot is not part of: group context at most
            return message, identity, key, "unaddressed", None, False, None
        decision = decide(message, identity.approved, self.config.access)
        if decision != "allow" or message.command in CONTROL_COMMANDS:
            return message, identity, key, decision, None, False, None
        cancel = self._cancel(message)
        return message, identity, key, decision, self.store.insert_inbound(message, key, cancel=cancel,
                                                                           user_id=identity.user_id), \
            cancel is not None, None

    @retry_locked
    def _admit_at_once(self, message: InboundMessage) -> Admitted:
        """``_admit`` for a message addressed to the bot in one write transaction: the sender's
        identity read (or created on first contact) and the inbox row written together. Raises
        ``IntegrityError`` (everything rolled back) for a duplicate or a sender created concurrently
        elsewhere; ``_admit`` then takes the steps one by one."""
        with write_tx(self.store.engine) as conn:
            return self._admit_in(conn, message)

    @retry_locked
    def _admit_many(self, messages: list[InboundMessage]) -> list[Admitted]:
        """``_admit_at_once`` for several messages addressed to the bot in one write transaction, in
        order (``GroupCommit``). Raises ``IntegrityError`` (everything rolled back) when any of them
        would; they are then admitted one by one."""
        with write_tx(self.store.engine) as conn:
            return self._admit_set(conn, messages)

    def _admit_set(self, conn: Connection, messages: list[InboundMessage]) -> list[Admitted]:
        """``_admit_in`` of each of ``messages`` in ``conn``, step by step for the lot rather than
        message by message: their senders read and created together (``Directory.identify_many_in``),
        their chats' settings read together (``prime_settings``), their inbox rows written together
        (``Store.insert_inbound_many_in``), then each session key's lane claimed once, for the first
        message of it (a later one found it held before, as it does here), the lot together
        (``SessionBus.claim_free_many_in``). On PostgreSQL 32 new chats cost 8 statements for the
        lot, claims and new sessions included, instead of 8 a chat (``bench.admit``). Under the busy
        policy ``interrupt`` (a message that may cancel the turn of one admitted before it) message
        by message, as ``_admit_in``."""
        identities = self.directory.identify_many_in(conn, messages)
        if self.prime_settings is not None:  # the chats' settings in one read, for _cancel below
            self.prime_settings(messages, conn)
        admitted: list[Admitted] = []
        for message, identity in zip(messages, identities, strict=True):
            message, key = self._keyed(message, identity)
            decision = decide(message, identity.approved, self.config.access)
            if decision != "allow" or message.command in CONTROL_COMMANDS:
                admitted.append((message, identity, key, decision, None, False, None))
                continue
            if self._cancel(message, conn) is not None:  # the chat's settings, read in this transaction
                return self._admit_each_in_key_order(conn, messages, identities)
            admitted.append((message, identity, key, decision, True, False, None))
        stored = [entry for entry in admitted if entry[4]]
        self.store.insert_inbound_many_in(conn, [(message, key, identity.user_id)
                                                 for message, identity, key, *_ in stored])
        keys = list(dict.fromkeys(entry[2] for entry in stored))  # each lane once, for its first message
        claimed = self.bus.claim_free_many_in(conn, keys)
        for index, entry in enumerate(admitted):
            if entry[4] and entry[2] in claimed:
                admitted[index] = (*entry[:6], claimed.pop(entry[2]))
        return admitted

    def _admit_each_in_key_order(self, conn: Connection, messages: list[InboundMessage],
                                 identities: list[Identity]) -> list[Admitted]:
        """``_admit_in`` of each message (in ``messages``' order in the result), run grouped by
        session key with the keys sorted, one key's messages in their order: each admit locks its
        lane (a claim, or a busy lane's generation moved on), and two instances' batches naming the
        same chats in another order would each hold a lane the other waits for (PostgreSQL:
        deadlock detected, a second lost and the batch redone). Sorted, every transaction that locks
        several lanes takes them in key order (``prepared.lock_lanes_in_key_order``)."""
        keys = [self._keyed(m, i)[1] for m, i in zip(messages, identities, strict=True)]
        admitted: dict[int, Admitted] = {}
        for n in sorted(range(len(messages)), key=keys.__getitem__):  # stable: a key's messages keep their order
            admitted[n] = self._admit_in(conn, messages[n], identities[n])
        return [admitted[n] for n in range(len(messages))]

    def _admit_in(self, conn: Connection, message: InboundMessage, identity: Identity | None = None) -> Admitted:
        """One message's admit in ``conn`` (``identity``: its sender, already read in ``conn``)."""
        if identity is None:
            identity = self.directory.identify_in(conn, message)
        message, key = self._keyed(message, identity)
        decision = decide(message, identity.approved, self.config.access)
        if decision != "allow" or message.command in CONTROL_COMMANDS:
            return message, identity, key, decision, None, False, None
        cancel = self._cancel(message, conn)  # the chat's settings, read in this transaction
        self.store.insert_inbound_in(conn, message, key, cancel=cancel, user_id=identity.user_id)
        # A free lane (a new chat's, or one whose last turn ended) is claimed here too: its turn
        # starts without a claim of its own.
        claimed = self.bus.claim_free_in(conn, key)
        return message, identity, key, decision, True, cancel is not None, claimed

    def _keyed(self, message: InboundMessage, identity: Identity) -> tuple[InboundMessage, str]:
        """``message`` with its locale chosen, and its session key."""
        message = dataclasses.replace(message, locale=choose(identity.language, message.language,
                                                             self.config.i18n.default))
        return message, session_key_for(message, identity.user_id, self.config.sessions.group_scope)

    def _cancel(self, message: InboundMessage, conn: Connection | None = None) -> str | None:
        """``cancel`` for the inbox write: ``if_busy`` under the chat's busy policy ``interrupt``
        (``conn``: the chat's settings are read in that transaction)."""
        policy = self.busy_policy(message, conn) if self.busy_policy is not None else self.config.bus.busy_policy
        return "if_busy" if policy == "interrupt" else None

    def _keep_as_context(self, message: InboundMessage) -> None:
        """Keeps a group message not addressed to the bot as its chat's group context, when that chat
        has group context on and the access rules would let its sender talk to the bot (allowlist:
        a listed chat, a listed user or an admin). Blocking (DB pool)."""
        sessions = self.config.sessions
        keep = sessions.group_context_for(message.platform, message.address.chat_id)
        if self.group_context is None or message.chat_type == "dm" or keep <= 0:
            return
        if decide(message, False, self.config.access) != "allow":
            return
        self.group_context.record(message, keep=keep, max_age_s=sessions.group_context_hours * 3600)

    async def _receive(self, message: InboundMessage) -> bool:
        message = storable_inbound(message)  # every string, not only the text: ids, names, tenant
        redacted = self.redact(message.text)  # a pasted secret is never stored, not even in the inbox
        if redacted != message.text:
            message = dataclasses.replace(message, text=redacted)
        if any(a.name and self.redact(a.name) != a.name for a in message.attachments):  # a file's name too
            message = dataclasses.replace(message, attachments=tuple(
                dataclasses.replace(a, name=self.redact(a.name)) if a.name else a for a in message.attachments))
        if message.quoted is not None and message.quoted.text:  # what it quotes is stored with it too
            quoted = self.redact(message.quoted.text)
            if quoted != message.quoted.text:
                message = dataclasses.replace(message, quoted=dataclasses.replace(message.quoted, text=quoted))
        if message.context_only:  # never a turn: at most kept as the chat's group context
            if self.config.sessions.group_context_for(message.platform, message.address.chat_id) > 0:
                await self.run_db(self._keep_as_context, message)
            self._drop(message)
            return False
        # Addressed: one write transaction, on the loop itself when that never waits (write_now), or
        # together with those that arrive while one is written (GroupCommit)
        if message.addressed:
            admitted = await self._admits.write(message)
        else:
            admitted = await self.run_db(self._admit, message)
        message, identity, key, decision, stored, interrupts, claimed = admitted
        if decision == "unaddressed":
            self._drop(message)
            return False  # a thread message not for us: the bot is not part of that thread
        if decision == "deny":
            log.info("message from %s in %s not allowed (access.mode = allowlist)",
                     message.sender.user_id, message.address.chat_id)
            self._drop(message)
            return False
        if decision == "pair":
            code = await self.run_db(self.directory.new_code, identity.user_id, "pairing")
            with using(message.locale):
                text = _(PAIRING_TEXT, code=code)
            stored = await self._answer_now(message, key, identity.user_id, text)
        elif message.command in CONTROL_COMMANDS:
            stored = await self._control(message, key, identity.user_id)
        elif stored and interrupts:  # stored by _admit
            self.runner.note_generation(key, await self.run_db(self.store.lane_generation, key))
        if stored:
            self.received += 1
            self.metrics.inbound.labels(message.platform).inc()
            self.bus.kick(key, claimed)
        else:
            self.duplicates += 1
            self.metrics.duplicates.labels(message.platform).inc()
        return bool(stored)

    def _drop(self, message: InboundMessage) -> None:
        self.dropped += 1
        self.metrics.dropped.labels(message.platform).inc()

    async def _control(self, message: InboundMessage, key: str, user_id: str) -> bool:
        """``/stop``: cancels the running turn (it stops at its next step and sends nothing) and
        answers at once, without waiting for the lane. ``/status`` answers at once too (it only
        reads), so it shows the plan of a turn still running. ``/approve ID`` / ``/deny ID`` decide a
        pending approval (the waiting turn reads it from the database) and never cancel."""
        assert message.command is not None
        access, locale = self.config.access, message.locale
        if message.command == "status":  # read-only: answered at once, a running turn's plan included
            ctx = CommandContext(message, key, user_id, is_dm_key(key), is_admin(message, access), self.model_name())
            commands = self.runner.commands
            text = await self.run_db(in_locale(locale, commands.run), ctx) if commands is not None else None
            if text is None:
                with using(locale):
                    text = _("No status here.")
            return await self._answer_now(message, key, user_id, text)
        if message.command in ("approve", "deny"):
            command = message.command
            text = await self.run_db(in_locale(locale, lambda: decide_reply(
                self.approvals, command, message.text, user_id, is_admin(message, access), self.trusted(message))))
            return await self._answer_now(message, key, user_id, text)
        if message.command == "language":  # a database write: answered at once, in the language chosen
            if await self.run_db(self.store.received, message):
                return False  # a redelivery: applied once (it would undo a later choice; found by a review)
            text = await self.run_db(language_reply, self.directory, message, user_id, self.config.i18n.default)
            return await self._answer_now(message, key, user_id, text)
        was_running = await self.run_db(self.store.lane_busy, key)
        with using(locale):
            text = control_reply(message.command, was_running)
        stored = await self._answer_now(message, key, user_id, text, cancel="always")
        if stored:
            self.runner.note_generation(key, await self.run_db(self.store.lane_generation, key))
        return stored

    async def _answer_now(self, message: InboundMessage, key: str, user_id: str, text: str,
                          cancel: str | None = None) -> bool:
        """Stores ``message`` as handled and queues ``text`` as its reply, outside the lane."""
        digest = hashlib.sha256(f"{message.platform}:{message.address.tenant}:{message.message_id}".encode())
        reply = OutboundMessage(message.address, text, idempotency_key=f"ctl:{digest.hexdigest()[:40]}",
                                reply_to_id=message.reply_to_id)
        stored = await self.run_db(functools.partial(self.store.insert_inbound, message, key, cancel=cancel,
                                                     control_reply=reply, user_id=user_id))
        if stored:
            self.wake_delivery()
        return stored
