"""A turn: inbound message(s) to the final reply (DESIGN §3.4). Runs on a worker thread.

Load the session (stored system prompt + transcript window), append the user message(s), run the
agent loop (each message written to the transcript as it happens), then finish the turn: the
reply goes to the outbox in the same transaction that marks the inbox row(s) done. A turn
resumed after a crash finds its user message already in the transcript and continues from there.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span
from sqlalchemy import Connection
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from agent.bridge import AsyncBridge
from agent.budget import Budget, Limits, initial_note
from agent.cache import AgentCache, AgentSpec
from agent.context import RunContext
from agent.loop import run_turn
from agent.model import ModelError, ModelReply, Usage
from agent.tracing import end_agent, invoke_agent
from gateway.bus.compression import Compressor, FitOnOverflow, Projection
from gateway.bus.context import user_meta
from gateway.bus.conversation import ConversationContext
from gateway.bus.error_texts import model_error_text
from gateway.core.errors import TurnInterrupted
from gateway.core.i18n import N_, _, using
from gateway.core.providers import DEFAULT_PROVIDER
from gateway.core.session_keys import is_dm_key
from gateway.core.types import CURRENT_MESSAGE, InboundMessage, OutboundAttachment, OutboundMessage
from gateway.core.window import WindowPolicy
from gateway.delivery.files import OutboxFiles, transcript_refs
from gateway.delivery.progress import PlanMessage, plan_key, resumed_state
from gateway.delivery.streaming import StreamHub, TurnStream
from gateway.media.contents import transcript_of
from gateway.media.render import has_images, refs_of
from gateway.media.service import NO_VISION_NOTE, note_line
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.telemetry import span as traced
from gateway.ops.usage import Calendar
from gateway.ops.usage_command import usage_reply
from gateway.ops.usage_limits import LIMITED, UsageLimits
from gateway.sessions.commands import LANE_COMMANDS, CommandContext, CommandHandler, Commands
from gateway.sessions.resets import ResetPolicy
from gateway.store.sql import (
    LaneNext,
    NewMessage,
    NewSessions,
    OpenSession,
    OutboxItem,
    PendingInbound,
    Store,
    StoredMessage,
    UsageEntry,
)
from gateway.tools.approvals import ApprovalPolicy, ChatApprover
from gateway.tools.approvals_store import Approvals

if TYPE_CHECKING:
    from gateway.media.service import MediaService
    from gateway.media.transcribe import TranscriptionSpend
    from gateway.memory.service import Candidates, MemoryService
    from gateway.sessions.chat_settings import ChatSetup

log = logging.getLogger("gateway.bus.turns")

CANCEL_POLL_S = 1.0
"""How often a running turn asks the database whether another instance cancelled it."""

MAX_TURN_ATTEMPTS = 3
"""Runs of one turn that may fail with an unexpected error (not a database outage) before it is
answered with ``GAVE_UP_TEXT`` and the lane moves on (counted per instance)."""

GAVE_UP_TEXT = N_("⚠️ Sorry, something went wrong while answering this message, and it was not processed. " \
               "Please try again, perhaps in other words.")

TRANSIENT = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)
"""Database faults that pass: a turn failing with one is retried without limit (nothing is lost)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ready:
    """What ``TurnRunner.prefetch`` read for a lane's turn with its rows: the session (``opened``)
    and the memory candidates for the message of inbox row ``inbox_id`` (``None``: read at recall)."""

    inbox_id: int
    opened: OpenSession
    memory: Candidates | None = None


def _name_files(unwritten: list[NewMessage], files: Sequence[OutboundAttachment]) -> None:
    """Adds the reply's files to the meta of the turn's final assistant message (not yet written:
    it is written with the reply), so the web chat and the admin transcript show them."""
    for index in range(len(unwritten) - 1, -1, -1):
        entry = unwritten[index]
        if entry.role == "assistant" and not entry.fields.get("tool_calls"):
            meta = {**(entry.fields.get("meta") or {}), "attachments": transcript_refs(files)}
            unwritten[index] = dataclasses.replace(entry, fields={**entry.fields, "meta": meta})
            return


def reply_key_for(last: PendingInbound) -> str:
    """The idempotency key of the reply to ``last`` (``in<inbox id>-<origin>:0``). Unique beyond
    this database (a platform that dedupes by our key, like Feishu's uuid, must never confuse a
    reply with one from before a database reset): bound to the platform message."""
    message = last.message
    origin = hashlib.sha256(f"{message.platform}:{message.address.tenant}:{message.message_id}".encode())
    return f"in{last.inbox_id}-{origin.hexdigest()[:12]}:0"


class TurnRunner:
    """Runs turns against one store with the agent the cache holds for ``spec``.

    Args:
        agents: the agent cache (model client + mounted tools by signature).
        spec: which agent chat turns use (model, endpoint, key, toolset).
        limits: the run boundaries of each turn's task.
        system_prompt: stored on each new session at creation and reused byte for byte; a
            callable builds it when a session is created (the skill catalogue as it is then).
        history_window: most transcript messages loaded per turn (after the latest summary's cut).
        streams: opens a streamed preview for turns on streaming platforms (``None``: no streaming).
        commands: the session commands (``/new``, ``/link``...), answered in the lane without the model.
        job_commands: answers scheduling commands (``/schedule``, ``/jobs``...) the same way.
        window: the model's context window and when to compress (``gateway.bus.compression``);
            summaries are made on the turn's worker thread before its first model call.
        approvals: pending approvals (``None``: no call ever needs approval).
        policy: which calls need approval.
        redact: removes configured secrets from user text and tool results before the model
            (and the transcript) sees them.
        memory: long-term memory: recalled into the newest user message's meta before the turn,
            written back after it (``None``: no memory).
        trusted: ``(message, user id) -> bool``: may the turn's requester approve their own calls
            of tools that need approval (open access: admins and approved users only; otherwise an
            admin decides). Asked on the worker thread.
        conversation: adds what each user message replies to, its thread's earlier messages and the
            group's recent ones to that message's meta before the turn (``None``: none).
        media: the files of messages (``gateway.media``): downloaded and stored before the user
            message is written, images sent as content parts (``None``: files described by the
            platform's announcement only).
        files: the files ``send_file`` recorded (``gateway.delivery.files``): a turn's reply
            carries those of its turn (``None``: replies carry no files).
        chats: per-chat settings (``gateway.sessions.chat_settings``): a new session's system
            prompt and settings come from its chat's settings, and each turn runs the agent its
            session was created with (``None``: every session gets ``system_prompt`` and ``spec``).
        usage: the limits checked before a turn's model call and ``/usage`` (``None``: neither;
            each model call's usage is recorded either way, with days in UTC).
        wake: tells delivery that rows were queued for ``claim_due`` (thread-safe): approval
            prompts, and a turn's replies not handed to ``deliver``.
        deliver: takes the reply a turn queued already claimed (``Store.finish_turn``'s ``claim``,
            with ``claim`` = ``(instance id, delivery.claim_s)``) to send it at once (thread-safe);
            ``None``: every reply is queued *pending* and ``wake`` is called.
    """

    def __init__(self, *, store: Store, agents: AgentCache, spec: AgentSpec, bridge: AsyncBridge | None,
                 limits: Limits, history_window: int, system_prompt: str | Callable[[], str],
                 streams: StreamHub | None = None,
                 commands: Commands | None = None, is_admin: Callable[[InboundMessage], bool] = lambda m: False,
                 reset: ResetPolicy | None = None, job_commands: CommandHandler | None = None,
                 window: WindowPolicy | None = None, metrics: GatewayMetrics | None = None,
                 approvals: Approvals | None = None, policy: ApprovalPolicy | None = None,
                 redact: Callable[[str], str] = lambda text: text, wake: Callable[[], None] = lambda: None,
                 memory: MemoryService | None = None,
                 trusted: Callable[[InboundMessage, str], bool] = lambda message, user_id: True,
                 conversation: ConversationContext | None = None, media: MediaService | None = None,
                 files: OutboxFiles | None = None, chats: ChatSetup | None = None,
                 usage: UsageLimits | None = None,
                 deliver: Callable[[list[OutboxItem]], None] | None = None,
                 claim: tuple[str, float] = ("", 30.0), max_crashes: int = 3) -> None:
        self.deliver = deliver
        self.max_crashes = max_crashes
        self._last_tries = threading.Lock()
        """Held by the turn making its last try after crashes (``bus.max_turn_crashes`` - 1 counted):
        one at a time, so a crash during it is that turn's own (``instance_store._count_crashes``)."""
        self.claim = claim
        self.chats = chats
        self.usage = usage
        self.calendar = usage.calendar if usage is not None else Calendar()
        self.memory = memory
        self.conversation = conversation
        self.media = media
        self.files = files
        self.trusted = trusted
        self.job_commands = job_commands
        self.store = store
        self.metrics = metrics
        self.agents = agents
        self.spec = spec
        self.bridge = bridge
        self.limits = limits
        self.history_window = history_window
        self.system_prompt = system_prompt
        self.streams = streams
        self.commands = commands
        self.is_admin = is_admin
        self.reset = reset
        self.compressor = Compressor(store, window or WindowPolicy(), history_window)
        self._compressors: dict[int, Compressor] = {}  # by context window: sessions on other routes
        self.approvals = approvals
        self.policy = policy or ApprovalPolicy()
        self.redact = redact
        self.wake = wake
        self._generations: dict[str, int] = {}
        self._generations_lock = threading.Lock()
        self._failures: dict[int, int] = {}  # inbox id -> failed runs here (cleared when it finishes)
        self.stopping = threading.Event()
        """Set by a graceful stop: running turns end at their next step boundary with
        ``TurnInterrupted`` (rows kept pending) instead of starting another model call."""

    def _compressor_for(self, window_tokens: int | None) -> Compressor:
        """The compressor of a session whose route has ``window_tokens`` (``None``: the default route's)."""
        if window_tokens is None or window_tokens == self.compressor.policy.context_window_tokens:
            return self.compressor
        with self._generations_lock:
            if window_tokens not in self._compressors:
                policy = dataclasses.replace(self.compressor.policy, context_window_tokens=window_tokens)
                self._compressors[window_tokens] = Compressor(self.store, policy, self.history_window)
            return self._compressors[window_tokens]

    def prompt(self) -> str:
        """The system prompt a new session gets now (stored with it, then never rebuilt)."""
        return self.system_prompt() if callable(self.system_prompt) else self.system_prompt

    def run(self, batch: Sequence[PendingInbound], generation: int, then: LaneNext | None = None,
            ready: Ready | None = None) -> str:
        """Runs one turn answering ``batch`` (one message, or several merged) to completion and
        returns its outcome (``done``, ``failed``, ``cancelled``). ``then``: the lane's next rows are
        read (or its lease given up) in the turn's last transaction (``Store.finish_turn``).
        ``ready``: what ``prefetch`` read for this lane with its rows.

        ``generation`` is the lane generation the turn started under: once the lane's generation
        moves on (``/stop``, an interrupting message) the turn stops at its next step and sends
        nothing. Raises only on database faults; the inbox rows then stay pending and are retried.

        Raises:
            TurnInterrupted: the gateway is stopping (``stopping``) and the turn reached a step
                boundary before its final answer: the step's messages are in the transcript, the
                rows stay pending, and the next start resumes the turn from there.
        """
        last = batch[-1]
        with invoke_agent("assistant", model=self.spec.model, turn_id=f"in{last.inbox_id}") as span, \
                using(last.message.locale):  # the gateway's own texts in the sender's language
            crashes = max(p.crashes for p in batch)
            if crashes >= self.max_crashes:
                log.error("turn in%s was running each time the gateway died, %d times (bus.max_turn_crashes); "
                          "answering it with an error instead of running it again", last.inbox_id, crashes)
                return self._give_up(batch, generation, then, reason="crashed")
            try:
                if crashes >= self.max_crashes - 1:
                    outcome = self._last_try(batch, generation, span, then, ready)
                else:
                    outcome = self._run(batch, generation, span, then, ready)
            except (*TRANSIENT, TurnInterrupted):
                raise  # the database is away, or we stop: the rows stay pending and are retried
            except Exception as exc:
                if self._attempt_failed(last.inbox_id) < MAX_TURN_ATTEMPTS:
                    raise
                log.error("turn in%s failed %d times; answering it with an error so the conversation moves on",
                          last.inbox_id, MAX_TURN_ATTEMPTS, exc_info=exc)
                return self._give_up(batch, generation, then)
            self._attempt_done(last.inbox_id)
            return outcome

    def _last_try(self, batch: Sequence[PendingInbound], generation: int, span: Any, then: LaneNext | None,
                  ready: Ready | None) -> str:
        """Runs a turn whose rows were counted at ``max_crashes`` - 1 crashes: alone among such turns
        (``_last_tries``), its rows marked ``last_try`` while it runs, so a crash during it counts for
        it (``gateway.ops.instance_store._count_crashes``). The mark is cleared however the try ends
        short of a crash (done, failed, interrupted by a stop, a database fault): a mark left behind
        would count the next crash for a turn that only waited (found by a review)."""
        ids = [p.inbox_id for p in batch]
        with self._last_tries:
            log.warning("turn in%s was running each time the gateway died, %d times; trying it once more, alone "
                        "among such turns", batch[-1].inbox_id, max(p.crashes for p in batch))
            self.store.mark_last_try(ids)
            try:
                return self._run(batch, generation, span, then, ready)
            finally:
                try:
                    self.store.mark_last_try(ids, marked=False)
                except Exception:  # the database is away: InstanceStore.release and take clear it too
                    log.warning("could not clear the last-try mark of in%s", batch[-1].inbox_id, exc_info=True)

    def _hand_over(self, claimed: Sequence[OutboxItem], replies: Sequence[OutboundMessage]) -> None:
        """After a turn queued ``replies``: the ones queued claimed go to ``deliver`` (sent at once),
        and delivery is woken for the others (``claim_due`` hands them out)."""
        if claimed and self.deliver is not None:
            self.deliver(list(claimed))
        if len(claimed) < len(replies):
            self.wake()

    def _attempt_failed(self, inbox_id: int) -> int:
        with self._generations_lock:
            self._failures[inbox_id] = self._failures.get(inbox_id, 0) + 1
            return self._failures[inbox_id]

    def _attempt_done(self, inbox_id: int) -> None:
        if self._failures:
            with self._generations_lock:
                self._failures.pop(inbox_id, None)

    def _give_up(self, batch: Sequence[PendingInbound], generation: int, then: LaneNext | None = None,
                 reason: str = "gave_up") -> str:
        """Finishes a turn that failed ``MAX_TURN_ATTEMPTS`` times (a bug, or input nothing can
        process), or that the process died running ``max_crashes`` times (``reason`` ``crashed``),
        as ``failed`` with an apology, so the messages behind it in the lane run."""
        last = batch[-1]
        message = last.message
        reply = OutboundMessage(message.address, _(GAVE_UP_TEXT), idempotency_key=reply_key_for(last),
                                reply_to_id=message.reply_to_id)
        self.store.finish_turn([p.inbox_id for p in batch], "failed", [reply], session_key=last.session_key,
                               generation=generation,
                               stream_key=[reply.idempotency_key, plan_key(reply.idempotency_key)], then=then)
        self._hand_over([], [reply])
        self._attempt_done(last.inbox_id)
        if self.metrics is not None:
            self.metrics.turns.labels("failed", reason).inc()
        return "failed"

    def _new_session_setup(self, message: InboundMessage) -> tuple[Callable[[], str],
                                                                   Callable[[], dict[str, Any] | None]]:
        """What a session created for ``message``'s chat now gets: its system prompt and settings
        (callables: the chat's settings are read only when a session is created)."""
        chats = self.chats
        made = functools.cache(lambda: chats.new_session(message) if chats is not None else None)

        def build_prompt() -> str:
            setup = made()
            return setup.system_prompt if setup is not None else self.prompt()

        def build_settings() -> dict[str, Any] | None:
            setup = made()
            return setup.settings if setup is not None else None

        return build_prompt, build_settings

    def prefetch(self, conn: Connection, batch: list[PendingInbound],
                 fresh: bool | NewSessions = False) -> Ready | None:
        """What the turn of ``batch`` reads before it starts, read in the transaction that hands the
        lane its rows (``gateway.store.sql.Prefetch``; ``fresh``: the lane was created there): its
        session (created when the lane has none) and its memory candidates, instead of transactions
        of their own. ``None`` (the turn reads
        them itself) for a command, under usage limits (a refused turn opens no session), and when
        building a new session's prompt failed (the turn then fails the ordinary way). Database
        errors are raised (the claim is retried)."""
        last = batch[-1]
        message = last.message
        if message.command is not None or (self.usage is not None and self.usage.any):
            return None
        key = last.session_key
        build_prompt, build_settings = self._new_session_setup(message)  # used only for a new session
        try:
            opened = self.store.open_session_in(conn, key, build_prompt, self.history_window,
                                                last.user_id if is_dm_key(key) else None, build_settings, fresh)
        except SQLAlchemyError:
            raise
        except Exception:  # building the prompt failed before anything was written
            log.warning("a new session's setup failed ahead of its turn; the turn tries again", exc_info=True)
            return None
        memory = None
        # On SQLite a failed read leaves the transaction usable; on PostgreSQL it would spoil the
        # claim, so there the turn reads its memory itself.
        if self.memory is not None and not message.attachments and conn.dialect.name == "sqlite":
            memory = self.memory.candidates(conn, key=key, query=self.redact(message.text))
        return Ready(last.inbox_id, opened, memory)

    def _run(self, batch: Sequence[PendingInbound], generation: int, span: Span, then: LaneNext | None,
             ready: Ready | None) -> str:
        last = batch[-1]
        message = last.message
        key = last.session_key
        turn_id = f"in{last.inbox_id}"
        inbox_ids = [p.inbox_id for p in batch]

        reply_key = reply_key_for(last)

        unwritten: list[NewMessage] = []
        plan: list[PlanMessage] = []  # the turn's progress message, once opened
        streams: list[TurnStream] = []  # the reply's preview, once opened
        # Files come only from tool calls (send_file): a turn that made none, in this run or in an
        # earlier run of it (resumed), has none, and the read is skipped.
        called: list[bool] = [False]
        found: dict[str | None, list[OutboundAttachment]] = {}

        def files_for(session_id: str | None) -> list[OutboundAttachment]:
            if not called[0]:
                return []
            if session_id not in found:
                found[session_id] = self._files_for(session_id, turn_id)
            return found[session_id]

        def finish(status: str, text: str | None, session_id: str | None, stop_reason: str = "none",
                   before_send: Callable[[], None] | None = None) -> str:
            files = files_for(session_id) if text is not None else []
            if files:  # the files send_file recorded go with the reply; the transcript names them
                _name_files(unwritten, files)
            replies = [] if text is None else [
                OutboundMessage(message.address, text, idempotency_key=reply_key, reply_to_id=message.reply_to_id,
                                attachments=tuple(files))
            ]
            shown = plan[0].final() if plan and text is not None else None
            replies = [shown, *replies] if shown is not None else replies  # the plan's last state first
            with traced("finish_turn", attributes={"gateway.replies": len(replies)}):
                claimed = self.store.finish_turn(
                    inbox_ids, status, replies, session_id=session_id, session_key=key, generation=generation,
                    messages=list(unwritten), merged_status=status if status in ("cancelled", LIMITED) else "merged",
                    stream_key=[reply_key, *(p.key for p in plan)], claim=self.claim if self.deliver else None,
                    # a turn that stores memory before its reply keeps the lane until that is done (the
                    # next message, here or on another instance, must find the entry): the bus then
                    # reads the next rows itself
                    then=then if before_send is None else None, streamed=any(s.row_taken for s in streams))
            if before_send is not None:  # after the transcript is written, before the reply can arrive
                before_send()
            self._hand_over(claimed, replies)
            span.set_attributes({"gateway.turn.outcome": status, "gateway.stop_reason": stop_reason})
            if self.metrics is not None:
                self.metrics.turns.labels(status, stop_reason).inc()
            return status

        chat_key = f"{message.address.platform}:{message.address.tenant}:{message.address.chat_id}"
        if self.usage is not None and len(batch) == 1 and message.command == "usage":
            return finish("done", usage_reply(self.usage, user_id=last.user_id, chat_key=chat_key,
                                              is_admin=self.is_admin(message)), None, "command")
        if self.commands is not None and len(batch) == 1 and message.command in LANE_COMMANDS:
            direct = self.commands.run(CommandContext(message, key, last.user_id, is_dm_key(key),
                                                      self.is_admin(message), self.spec.model))
            if direct is not None:
                return finish("done", direct, None, "command")
        if self.job_commands is not None and len(batch) == 1 and message.command is not None:
            direct = self.job_commands(message)
            if direct is not None:
                return finish("done", direct, None, "command")

        if self.usage is not None and self.usage.any:  # before anything costs: no model call over a limit
            refusal = self.usage.check(inbox_id=last.inbox_id, user_id=last.user_id, chat_key=chat_key)
            if refusal is not None:
                say = self.usage.tell(refusal, last.inbox_id)  # once per period, not once per message
                log.info("turn %s refused by limits.%s (%s)", turn_id, refusal.limit, "told" if say else "silent")
                return finish(LIMITED, refusal.text if say else None, None, "limit")

        owner = last.user_id if is_dm_key(key) else None
        chats = self.chats
        build_prompt, build_settings = self._new_session_setup(message)

        with traced("load_session") as load:
            if ready is not None:  # read with the lane's rows, in their transaction
                opened = ready.opened
            else:
                opened = self.store.open_session(key, build_prompt, self.history_window, owner, build_settings)
            load.set_attribute("gateway.messages_loaded", len(opened.window))
        notice = ""
        # A turn resumed after a restart (its rows already in the transcript) finishes where it began:
        # in a new session its user message would be written again and its tool steps run again.
        begun = {f"in{p.inbox_id}" for p in batch}
        if self.reset is not None and not any(m.turn_id in begun for m in opened.window) \
                and self.reset.expired(opened.last_used_at):
            self.store.new_session(key, build_prompt(), owner, build_settings())
            opened = self.store.open_session(key, build_prompt, self.history_window, owner)
            notice = _("({why}: this is a new conversation; the last one is in /sessions.)",
                       why=self.reset.describe()) + "\n\n"
        spec = chats.spec(opened.settings) if chats is not None else self.spec  # the session's, for its life
        compressor = self._compressor_for(chats.window_tokens(opened.settings) if chats is not None else None)
        session_id, system_prompt, window = opened.session_id, opened.system_prompt, list(opened.window)
        called[0] = any(m.turn_id == turn_id and (m.role == "tool" or m.tool_calls) for m in window)
        fresh = not window and opened.summary is None  # nothing before this turn: a thread never seen
        span.set_attribute("gen_ai.conversation.id", session_id)
        # User messages are written with the turn's first step (or its end), not before: until then
        # the inbox row is still pending, so a crash loses nothing and a rerun writes them once.
        present = {(m.turn_id, m.role) for m in window}
        notes: list[str] = []  # what the user is told about their files (too big, unreadable ...)
        usable = False
        read = 0  # files whose contents were read (transcribed, extracted) in this run
        for pending in batch:
            pending_turn = f"in{pending.inbox_id}"
            if (pending_turn, "user") not in present:
                meta = user_meta(pending.message, time.time(), budget=initial_note(self.limits))
                spent: tuple[UsageEntry, ...] = ()  # the message's transcriptions: written with it, once
                if self.conversation is not None:  # stored with it: fetched once, replayed byte for byte
                    meta = self.conversation.annotate(meta, pending.message, window=window, fresh=fresh)
                    fresh = False  # a merged batch's later messages: their thread is in this one's meta
                if self.media is not None and pending.message.attachments:
                    with traced("take_in_media", attributes={"gateway.attachments": len(pending.message.attachments)}):
                        intake = self.media.take_in(pending.message, session_id=session_id,
                                                    owner_user_id=pending.user_id, turn_id=pending_turn)
                    meta["attachments"] = [ref.to_dict() for ref in intake.refs]
                    notes += intake.notes
                    if intake.images and not self.media.sees_images(spec.model):
                        notes.append(_(NO_VISION_NOTE))  # llm.vision off, or the endpoint refused images before
                    usable = usable or intake.usable
                    read += intake.read
                    if intake.spend:
                        meta["transcriptions"] = [paid.to_dict() for paid in intake.spend]
                        meta["cost_usd"] = round(sum(paid.cost_usd for paid in intake.spend), 8)
                        spent = tuple(self.transcription_entry(paid, pending) for paid in intake.spend)
                else:
                    usable = True
                text = self.redact(pending.message.text)  # a pasted secret never reaches the model
                if self.memory is not None and pending is last:  # stored with it: replays render the same bytes
                    spoken = " ".join(w for ref in refs_of(meta) if (w := transcript_of(ref)))  # a voice note's words
                    meta = self.memory.annotate(meta, key=key, query=text or spoken, window=window,
                                                read=ready.memory if ready is not None else None)
                unwritten.append(NewMessage(pending_turn, "user", text,
                                            {"meta": meta, "platform_message_id": pending.message.message_id},
                                            spent))
                window.append(StoredMessage(0, pending_turn, "user", text, None, None, None, meta,
                                            pending.message.message_id))
            else:
                usable = True  # resumed: the stored message was usable when it was taken in
                stored = next((m for m in window if m.turn_id == pending_turn and m.role == "user"), None)
                notes += [note_line(ref) for ref in refs_of(stored.meta if stored else None) if ref.note]
        if read:  # a transcription is a paid call: stored now (with its usage rows), a run after a crash reuses it
            self.store.append_messages(session_id, list(unwritten))
            unwritten.clear()
        heard = self._heard(batch, window) if self.media is not None and self.media.config.show_transcript else ""
        if not usable:  # nothing but files that could not be used: say why, no model call
            told = "\n".join(dict.fromkeys(notes))
            unwritten.append(NewMessage(turn_id, "assistant", told, {"meta": {"stop_reason": "media"}}))
            return finish("done", notice + told, session_id, "media")

        children: list[UsageEntry] = []  # sub-agents' model calls, not yet stored
        children_lock = threading.Lock()

        def child_usage(usage: Usage, meta: dict[str, Any]) -> None:
            entry = self.usage_entry(usage, meta, user_id=last.user_id, chat_key=chat_key, session_key=key,
                                     platform=message.platform)
            with children_lock:
                children.append(entry)

        def record(msg: dict[str, Any], usage: Usage | None, meta: dict[str, Any] | None) -> None:
            fields = {"tool_calls": msg.get("tool_calls"), "tool_call_id": msg.get("tool_call_id"), "meta": meta}
            entries = []
            if usage is not None:
                fields.update(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens)
                entries.append(self.usage_entry(usage, meta, user_id=last.user_id, chat_key=chat_key,
                                                session_key=key, platform=message.platform))
            with children_lock:  # sub-agents' calls so far are stored with this message
                entries += children
                children.clear()
            unwritten.append(NewMessage(turn_id, msg["role"], msg.get("content"), fields, tuple(entries)))
            if msg.get("tool_calls") or msg["role"] == "tool":
                called[0] = True
                # Durable before any tool runs: a resumed turn must see which calls were made.
                self.store.append_messages(session_id, list(unwritten))
                unwritten.clear()
            # A final answer is written together with the outbox row (one transaction).

        checked = [time.monotonic()]

        def should_stop() -> bool:
            if self.stopping.is_set() or self.cancelled(key, generation):
                return True
            now = time.monotonic()
            if now - checked[0] < CANCEL_POLL_S:
                return False  # another instance's /stop is seen within CANCEL_POLL_S
            checked[0] = now
            return self.store.lane_generation(key) != generation

        agent = self.agents.get(spec)

        def summary_usage(reply: ModelReply) -> UsageEntry:
            price = self.limits.price_of(reply.model or spec.model, reply.provider)
            facts = {"provider": reply.provider, "model": reply.model,
                     "cost_usd": price.cost(reply.usage) if price is not None else 0.0}
            return self.usage_entry(reply.usage, facts, user_id=last.user_id, chat_key=chat_key, session_key=key,
                                    platform=message.platform)

        # Fitted before the first model call (a summary, when one is due, is made and stored here;
        # its failure only means the plain window is sent).
        projection = compressor.project(session_id=session_id, system_prompt=system_prompt,
                                        tools=agent.tools.schemas(), summary=opened.summary, window=window,
                                        model=agent.model, usage_of=summary_usage,
                                        images=self.media.policy(agent.model.model) if self.media else None)

        def with_images(fitted: Projection) -> Projection:
            """``fitted`` with its image placeholders read from the blob store (only those sent)."""
            if self.media is None or not has_images(fitted.history):
                return fitted
            with traced("read_images"):
                return dataclasses.replace(fitted, history=self.media.resolve(fitted.history))

        projection = with_images(projection)
        inner = self.media.model(agent.model) if self.media is not None else agent.model
        # A model that refuses the request as too long gets it compressed for its window, once per call.
        model = FitOnOverflow(inner, projection.history, projection.tokens,
                              lambda tokens: with_images(compressor.project(
                                  session_id=session_id, system_prompt=system_prompt, tools=agent.tools.schemas(),
                                  summary=opened.summary, window=window, model=agent.model, window_tokens=tokens,
                                  usage_of=summary_usage,
                                  images=self.media.policy(agent.model.model) if self.media else None)))
        stream = None
        if self.streams is not None:
            stream = self.streams.open(address=message.address, idempotency_key=reply_key,
                                       reply_to_id=message.reply_to_id, session_id=session_id, session_key=key,
                                       generation=generation)
            streams += [stream] if stream is not None else []
        state = resumed_state(window, turn_id)  # empty for a new turn
        progress = PlanMessage.open(self.streams, address=message.address, reply_key=reply_key,
                                    reply_to_id=message.reply_to_id, session_id=session_id, session_key=key,
                                    generation=generation)
        if progress is not None:
            plan.append(progress)
            state.on_plan = progress.show
        budget = Budget.wallet(self.limits)
        earlier = [m.id for m in window if m.turn_id == turn_id and m.role == "assistant"]
        if earlier:  # resumed after a restart: what its first run spent counts (a restart is no new budget)
            budget.spent_before(*self.store.calls_spent(turn_id, earlier))
        token = CURRENT_MESSAGE.set(message)
        approver = self._approver(last, turn_id)
        try:
            outcome = run_turn(system_prompt=system_prompt, history=projection.history, model=model,
                               tools=agent.tools, bridge=self.bridge, limits=self.limits, record=record, budget=budget,
                               should_stop=should_stop, on_text=stream.on_text if stream is not None else None,
                               context=RunContext(session_id=session_id, turn_id=turn_id, approver=approver,
                                                  awaiting=approver.awaiting if approver is not None else None,
                                                  redact=self.redact, state=state, on_child_usage=child_usage))
        except ModelError as exc:
            log.warning("turn %s failed: %s", turn_id, exc)
            return finish("failed", f"⚠️ {model_error_text(exc)}", session_id, "model_error")
        finally:
            CURRENT_MESSAGE.reset(token)
            if stream is not None:
                stream.close()
            if progress is not None:
                progress.close()
        end_agent(span, stop_reason=outcome.stop_reason, steps=outcome.steps,
                  input_tokens=sum(u.prompt_tokens for u in outcome.usage),
                  output_tokens=sum(u.completion_tokens for u in outcome.usage), cost_usd=outcome.cost_usd)
        if self.metrics is not None:
            for (tool, status), count in outcome.tool_results.items():
                self.metrics.tool_calls.labels(tool, status).inc(count)
        if outcome.stop_reason == "cancelled" and self.stopping.is_set() and not self.cancelled(key, generation) \
                and self.store.lane_generation(key) == generation:
            if unwritten:  # the finished step's messages (a checklist request): durable before we go
                self.store.append_messages(session_id, list(unwritten))
            log.info("turn %s stopped at a step boundary by the shutdown; resumed at the next start", turn_id)
            raise TurnInterrupted(turn_id)
        if outcome.stop_reason == "cancelled":
            log.info("turn %s cancelled at a step boundary", turn_id)
            return finish("cancelled", None, session_id, "cancelled")
        if outcome.stop_reason not in ("stop", "length"):
            log.info("turn %s stopped by %s after %d model calls ($%.4f)", turn_id, outcome.stop_reason,
                     outcome.steps, outcome.cost_usd)
        sends_files = bool(files_for(session_id))
        if getattr(model, "fell_back", False):
            notes.append(_(NO_VISION_NOTE))
        told = "".join(f"{line}\n" for line in dict.fromkeys(notes))
        answer = outcome.reply.strip() or ("" if sends_files else _("(no answer)"))  # files alone are an answer
        reply = notice + heard + (told + "\n" if told else "") + answer
        if self.memory is None:
            return finish("done", reply, session_id, outcome.stop_reason)
        memory, texts = self.memory, [self.redact(p.message.text) for p in batch]
        reply += memory.refusal_notice(texts)  # a "remember ..." too long to store: said with the reply

        def remember() -> None:
            memory.after_turn(key=key, session_id=session_id, turn_ids=[f"in{p.inbox_id}" for p in batch],
                              user_texts=texts)

        # What the user asked to remember is stored before the reply can reach them (their next
        # message, /memory or /forget sees it); the rest of the write-back follows the reply.
        asked = memory.stores_now(texts)
        status = finish("done", reply, session_id, outcome.stop_reason, before_send=remember if asked else None)
        if not asked:
            remember()
        return status

    def usage_entry(self, usage: Usage, meta: dict[str, Any] | None, *, user_id: str | None, chat_key: str,
                    session_key: str | None, platform: str) -> UsageEntry:
        """The ``usage`` row of one model call, from the step's usage and the facts ``run_turn``
        recorded beside it (``provider``, ``model``, ``cost_usd``), dated today in ``limits.timezone``."""
        facts = meta or {}
        return UsageEntry(user_id=user_id, chat_key=chat_key, session_key=session_key, platform=platform,
                          provider=facts.get("provider") or DEFAULT_PROVIDER,
                          model=facts.get("model") or self.spec.model,
                          day=self.calendar.day(), prompt_tokens=usage.prompt_tokens,
                          cached_tokens=usage.cached_tokens, completion_tokens=usage.completion_tokens,
                          cost_usd=float(facts.get("cost_usd") or 0.0))

    def transcription_entry(self, spend: TranscriptionSpend, pending: PendingInbound) -> UsageEntry:
        """The ``usage`` row of one transcription of ``pending``'s files: its sender, chat, platform
        and session key, dated today in ``limits.timezone``; tokens as the API reported them (0
        when it did not), ``cost_usd`` at the model's price per minute (``TranscriptionSpend``)."""
        address = pending.message.address
        return UsageEntry(user_id=pending.user_id, chat_key=f"{address.platform}:{address.tenant}:{address.chat_id}",
                          session_key=pending.session_key, platform=pending.message.platform,
                          provider=spend.provider, model=spend.model, day=self.calendar.day(),
                          prompt_tokens=spend.input_tokens, cached_tokens=0, completion_tokens=spend.output_tokens,
                          cost_usd=spend.cost_usd)

    def _files_for(self, session_id: str | None, turn_id: str) -> list[OutboundAttachment]:
        """The files ``send_file`` recorded during the turn (none without a session or file store)."""
        if self.files is None or session_id is None:
            return []
        return self.files.for_turn(session_id, turn_id)

    @staticmethod
    def _heard(batch: Sequence[PendingInbound], window: list[StoredMessage]) -> str:
        """``> 🎤 …`` lines quoting what was heard in the batch's voice notes (``media.show_transcript``),
        read from the stored messages (the same words on a run after a crash), or ``""``."""
        turns = {f"in{p.inbox_id}" for p in batch}
        lines = []
        for row in window:
            if row.role == "user" and row.turn_id in turns:
                for ref in refs_of(row.meta):
                    words = transcript_of(ref)
                    if words:
                        lines.append("> 🎤 " + "\n> ".join(words.splitlines()))
        return "\n>\n".join(lines) + "\n\n" if lines else ""

    def _approver(self, last: PendingInbound, turn_id: str) -> ChatApprover | None:
        if self.approvals is None:
            return None
        return ChatApprover(self.approvals, self.policy, last.message.address, last.session_key, turn_id,
                            last.user_id, wake=self.wake, redact=self.redact, reply_to_id=last.message.reply_to_id,
                            trusted=lambda: self.trusted(last.message, last.user_id),  # type: ignore[arg-type]
                            suspend=self.stopping.is_set)  # a restart keeps a waiting request open

    # -- in-process cancellation -------------------------------------------------------------
    def note_generation(self, key: str, generation: int) -> None:
        """Records a lane generation seen by this instance (``/stop`` or an interrupt received
        here), so the running turn stops at its next step without asking the database."""
        with self._generations_lock:
            if generation > self._generations.get(key, -1):
                self._generations[key] = generation

    def cancelled(self, key: str, generation: int) -> bool:
        with self._generations_lock:
            return self._generations.get(key, -1) > generation
