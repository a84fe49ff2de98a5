"""SQLAlchemy tables: the durable state of the gateway (DESIGN §3-5).

Times are epoch seconds (float) so that lease and retry comparisons are plain numbers on both
SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import (
    DDL,
    JSON,
    BigInteger,
    Boolean,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
    event,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class SessionRow(Base):
    """One conversation. Its system prompt is built once and read back byte for byte (DESIGN §5)."""

    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), index=True)
    system_prompt: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    owner_user_id: Mapped[str | None] = mapped_column(String(32), index=True)
    """The user whose DM conversation this is; ``None`` for a group's session."""
    title: Mapped[str | None] = mapped_column(String(120))
    """The first user message, shortened (``/sessions``)."""
    settings: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """What the chat's settings chose when it was created and it keeps for its life (``route``,
    ``toolset``, ``persona``; ``gateway.sessions.chat_settings``); ``None``: the defaults."""


class LaneRow(Base):
    """The serial lane of a session key: which session is current and who holds the lease.

    At most one turn per key runs at a time across all instances: the lease is claimed with a
    conditional UPDATE (owner free or lease expired), renewed while the turn runs.
    """

    __tablename__ = "lanes"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    session_id: Mapped[str | None] = mapped_column(String(32))
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_until: Mapped[float] = mapped_column(Float, default=0.0)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    """Bumped by ``/stop`` and by an interrupting message: a turn started under an older
    generation stops at its next step, and replies queued under it are not sent."""


class MessageRow(Base):
    """The transcript: every message of a session, written as it happens."""

    __tablename__ = "messages"
    __table_args__ = (Index("ix_messages_session_id_id", "session_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(32))
    turn_id: Mapped[str | None] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str | None] = mapped_column(Text)
    tool_calls: Mapped[list[Any] | None] = mapped_column(JSON)
    tool_call_id: Mapped[str | None] = mapped_column(String(128))
    name: Mapped[str | None] = mapped_column(String(128))
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Facts rendered into the model-facing text deterministically (e.g. when a user wrote)."""
    platform_message_id: Mapped[str | None] = mapped_column(String(255))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class InboxRow(Base):
    """Every inbound message, once (DESIGN §3.2). The unique key drops platform retries."""

    __tablename__ = "inbox"
    __table_args__ = (
        UniqueConstraint("platform", "tenant", "platform_message_id", name="uq_inbox_platform_message"),
        Index("ix_inbox_key_status_id", "session_key", "status", "id"),
        Index("ix_inbox_status", "status"),
        Index("ix_inbox_user_received", "user_id", "received_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    platform: Mapped[str] = mapped_column(String(32))
    tenant: Mapped[str] = mapped_column(String(128))
    platform_message_id: Mapped[str] = mapped_column(String(255))
    session_key: Mapped[str] = mapped_column(String(255))
    user_id: Mapped[str | None] = mapped_column(String(32))
    """The sender's user (identity resolved at receipt)."""
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    """``pending`` -> ``done`` | ``failed`` | ``cancelled`` | ``merged`` (answered with a later one)."""
    received_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    crashes: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    """How often a process died (``kill -9``, out of memory, a native crash) while this row's turn
    ran: counted when the next process takes its instance id over (``gateway.ops.instance_store``);
    at ``bus.max_turn_crashes`` the turn is answered with an apology instead of being run again."""
    last_try: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """Set while the row's turn makes its last try (``bus.max_turn_crashes`` - 1 crashes counted),
    which runs alone among last tries: a crash then counts for it, not for the last tries waiting
    behind it. Cleared when the next process takes the instance id over."""


class OutboxRow(Base):
    """A reply waiting for delivery (DESIGN §3.5). ``idempotency_key`` = turn id + sequence."""

    __tablename__ = "outbox"
    __table_args__ = (
        Index("ix_outbox_status_next", "status", "next_attempt_at"),
        Index("ix_outbox_chat_status", "chat_key", "status", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    idempotency_key: Mapped[str] = mapped_column(String(128), unique=True)
    session_id: Mapped[str | None] = mapped_column(String(32))
    session_key: Mapped[str | None] = mapped_column(String(255))
    chat_key: Mapped[str] = mapped_column(String(255))
    """``platform:tenant:chat``: rows of one chat are delivered strictly in order."""
    generation: Mapped[int] = mapped_column(Integer, default=0)
    """The lane generation the reply was produced under (see ``LaneRow.generation``)."""
    address: Mapped[dict[str, Any]] = mapped_column(JSON)
    text: Mapped[str] = mapped_column(Text)
    reply_to_id: Mapped[str | None] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    """``pending`` -> ``claimed`` (``sending`` during a part's API call) -> ``sent`` | ``failed``
    (permanent error or attempts used up) | ``cancelled`` (its turn was stopped) | ``unconfirmed``
    (a part was in flight when its sender died; it is never sent again). A streamed reply's row
    is ``streaming`` while its turn runs (never claimed), then ``pending`` with the final text."""
    preview_id: Mapped[str | None] = mapped_column(String(255))
    buttons: Mapped[list[Any] | None] = mapped_column(JSON)
    """``[[label, command text], ...]`` (``OutboundMessage.buttons``)."""
    """Platform id of the streamed preview message: part 1 of the final reply is an edit of it.
    ``"?"`` while the preview's first send is in flight (unknown after a crash: no edit then)."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float, default=0.0)
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claim_until: Mapped[float] = mapped_column(Float, default=0.0)
    platform_message_ids: Mapped[list[Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    sent_at: Mapped[float | None] = mapped_column(Float)
    attachments: Mapped[list[Any] | None] = mapped_column(JSON)
    """Files sent after the text, in order (``OutboundAttachment.to_dict`` each; bytes in the blob store)."""


class OutboxFileRow(Base):
    """A file the agent sent with ``send_file`` (``gateway.delivery.send_file``): recorded when the
    tool runs (its bytes already in the blob store), attached to the turn's reply when the turn
    finishes. One row per tool call: a call run again after a crash finds its row."""

    __tablename__ = "outbox_files"
    __table_args__ = (UniqueConstraint("session_id", "turn_id", "call_id", name="uq_outbox_files_call"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(32))
    turn_id: Mapped[str] = mapped_column(String(64))
    call_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(255))
    mime_type: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    caption: Mapped[str] = mapped_column(Text, default="")
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class UserRow(Base):
    """A person, across platforms: owns identities and DM sessions (DESIGN §4)."""

    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    approved: Mapped[bool] = mapped_column(Boolean, default=False)
    """Let through by DM pairing (an admin approved a pairing code)."""
    created_at: Mapped[float] = mapped_column(Float)
    language: Mapped[str | None] = mapped_column(String(16))
    """The locale the user chose with ``/language`` (``en``, ``zh_CN``); ``None``: their platform's
    hint, then ``i18n.default``."""


class IdentityRow(Base):
    """One platform account of a user. Created on first contact; joined to another user only by
    ``/link CODE`` (never by guessing from names)."""

    __tablename__ = "identities"
    __table_args__ = (UniqueConstraint("platform", "tenant", "platform_user_id", name="uq_identity"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(String(32), index=True)
    platform: Mapped[str] = mapped_column(String(32))
    tenant: Mapped[str] = mapped_column(String(128))
    platform_user_id: Mapped[str] = mapped_column(String(128))
    display_name: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float)
    linked_at: Mapped[float | None] = mapped_column(Float)


class CodeRow(Base):
    """A one-time code: ``link`` (join identities, made by ``/link``) or ``pairing`` (an unknown
    user asks for access; an admin approves it). Short, expiring, single use."""

    __tablename__ = "codes"
    __table_args__ = (Index("ix_codes_user_kind", "user_id", "kind", "created_at"),)

    code: Mapped[str] = mapped_column(String(16), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    user_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    used_at: Mapped[float | None] = mapped_column(Float)


class ChatMemberRow(Base):
    """That a platform user has written to the bot from a chat (recorded once, when the first of
    their messages there is finished or handled; ``Store.finish_turn``). What the scheduler asks:
    may this user post reports into that chat, which account (tenant) a chat id belongs to, where a
    user's DM with the bot is. Inbox rows are deleted ``database.keep_settled_days`` after they
    settle; this record stays."""

    __tablename__ = "chat_members"
    __table_args__ = (
        Index("ix_chat_members_chat", "platform", "chat_id"),
        Index("ix_chat_members_user", "platform", "tenant", "user_id", "chat_type"),
    )

    platform: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    chat_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    """The sender's id on the platform (``Sender.user_id``), not the gateway's ``users.id``."""
    chat_type: Mapped[str] = mapped_column(String(16))
    """``dm`` | ``group`` (``InboundMessage.chat_type``)."""
    first_seen_at: Mapped[float] = mapped_column(Float)


class JobRow(Base):
    """A scheduled report (DESIGN §8): what to ask the agent, when (in which IANA zone), where to
    deliver the answer. This table is the source of truth; schedulers hold only the job's id."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    """Short, typeable id (``/run ID``)."""
    owner: Mapped[str] = mapped_column(String(255), index=True)
    """``platform:tenant:user_id`` of the creator, or ``cli`` for jobs added by an operator."""
    owner_name: Mapped[str] = mapped_column(String(255), default="")
    owner_dm: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """The owner's DM address (``ChatAddress`` dict), told about failed runs; ``None`` if unknown."""
    target: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Where reports go: ``ChatAddress`` dict (platform, tenant, chat_id, thread_id)."""
    schedule_kind: Mapped[str] = mapped_column(String(16))
    """``cron`` (crontab numbering) | ``interval`` (seconds) | ``once`` (local ISO time)."""
    schedule: Mapped[str] = mapped_column(String(255))
    timezone: Mapped[str] = mapped_column(String(64))
    """IANA zone the schedule is read in (required; never the host's zone)."""
    prompt: Mapped[str] = mapped_column(Text)
    toolset: Mapped[str] = mapped_column(String(64), default="default")
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    source: Mapped[str | None] = mapped_column(String(255), unique=True)
    """The chat message that created the job (``platform:tenant:message_id``): a redelivered
    command finds its job instead of creating a second one."""
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    """Changes only when the definition changes (schedulers reload the job then)."""
    last_fire_at: Mapped[float | None] = mapped_column(Float)
    """Scheduled time of the latest claimed run (epoch s, UTC)."""
    next_fire_at: Mapped[float | None] = mapped_column(Float)
    """Next scheduled time as last computed (epoch s, UTC); a restart within the misfire grace
    catches up a fire that was due while no instance ran."""


class JobRunRow(Base):
    """One fire of a job. Inserting it is the claim: unique on (job, scheduled time), so among
    several instances only the one whose insert succeeds runs that fire."""

    __tablename__ = "job_runs"
    __table_args__ = (
        UniqueConstraint("job_id", "scheduled_at", name="uq_job_runs_job_scheduled"),
        Index("ix_job_runs_status_claim", "status", "claim_until"),
        Index("ix_job_runs_outbox_id", "outbox_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(16))
    scheduled_at: Mapped[float] = mapped_column(Float)
    """The fire time (epoch s, UTC); for ``/run`` the command's own timestamp."""
    trigger: Mapped[str] = mapped_column(String(16), default="schedule")
    """``schedule`` | ``manual``."""
    status: Mapped[str] = mapped_column(String(16), default="running")
    """``running`` (claimed, agent working) -> ``delivering`` (answer in the outbox) -> ``sent`` |
    ``unconfirmed`` | ``failed``; or ``skipped`` (job removed or disabled before it ran)."""
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claim_until: Mapped[float] = mapped_column(Float, default=0.0)
    """A ``running`` claim not renewed by then is taken over by another instance."""
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    session_id: Mapped[str | None] = mapped_column(String(32))
    """The run's own agent session (a taken-over run resumes its transcript)."""
    outbox_id: Mapped[int | None] = mapped_column(Integer)
    """The outbox row carrying the answer; its settling settles the run."""
    platform_message_ids: Mapped[list[Any] | None] = mapped_column(JSON)
    """Set only from the platform's answer, when the outbox row is sent."""
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    notified_at: Mapped[float | None] = mapped_column(Float)
    """When the owner was told of this run's failure (set once)."""



class SummaryRow(Base):
    """A stored summary of a session's older turns (DESIGN §5): ``text`` condenses every message
    with ``id <= covers_to_id`` (and the summary before it). Only the newest one per session is
    read; older ones stay as a record. Token counts are of the summarising model call."""

    __tablename__ = "summaries"
    __table_args__ = (Index("ix_summaries_session_id_id", "session_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(32))
    covers_to_id: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)



class ApprovalRow(Base):
    """A side-effecting tool call waiting for a person (issue 9). The waiting turn polls its
    ``status`` (``pending`` -> ``approved`` | ``denied`` | ``expired`` | ``cancelled``), so an
    ``/approve`` received by any instance wakes it."""

    __tablename__ = "approvals"
    __table_args__ = (Index("ix_approvals_key_status", "session_key", "status"),)

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    session_key: Mapped[str] = mapped_column(String(255))
    turn_id: Mapped[str] = mapped_column(String(64))
    call_id: Mapped[str] = mapped_column(String(128))
    requested_by: Mapped[str | None] = mapped_column(String(32))
    """The user whose message started the turn; only they (or an admin) may decide."""
    tool: Mapped[str] = mapped_column(String(128))
    summary: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    decided_by: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    decided_at: Mapped[float | None] = mapped_column(Float)


class MemoryRow(Base):
    """A long-term memory entry (issue 10): a conclusion or constraint, never a transcript, owned by
    one user or one group chat. A newer entry that contradicts it sets ``superseded_by``; both stay
    (audit, ``/memory``). Full-text search (migrations ``0401``, ``0806``) over ``search_text``: an FTS5
    index ``memories_fts`` kept by triggers on SQLite, a GIN index ``ix_memories_fts`` on
    ``to_tsvector('english', coalesce(search_text, text))`` on PostgreSQL; a ``text`` changed without
    its ``search_text`` clears it (trigger)."""

    __tablename__ = "memories"
    __table_args__ = (Index("ix_memories_owner_superseded", "owner", "superseded_by"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(255))
    """``user:<user id>`` (DM memory; linked accounts share the user) or ``group:<chat key>``."""
    text: Mapped[str] = mapped_column(Text)
    search_text: Mapped[str | None] = mapped_column(Text)
    """``text`` as the full-text index is given it (``gateway.memory.terms.index_text``: each Chinese
    or Japanese character a word of its own); ``None`` until analysed (rows stored before migration
    ``0806`` or by an older release, a text changed by hand): the next start fills it, meanwhile
    PostgreSQL indexes ``text`` and SQLite nothing."""
    type: Mapped[str] = mapped_column(String(16))
    """``preference`` | ``fact`` | ``decision`` | ``episode``."""
    source: Mapped[str] = mapped_column(String(16))
    """``user_explicit`` ("remember ...") | ``task`` (proposed after a turn, or saved by the model
    with ``save_memory``) | ``import``."""
    confidence: Mapped[float] = mapped_column(Float)
    """0..1: 1.0 for the user's own words, the proposing model's figure otherwise."""
    created_at: Mapped[float] = mapped_column(Float)
    last_used_at: Mapped[float | None] = mapped_column(Float)
    """Last time the entry was injected or returned by ``recall_memory`` (decay starts here)."""
    hits: Mapped[int] = mapped_column(Integer, default=0)
    """How many turns used the entry."""
    weight: Mapped[float] = mapped_column(Float)
    """Base importance (explicit entries weigh more); decays with time unused when scored."""
    superseded_by: Mapped[int | None] = mapped_column(Integer)
    """The entry that replaced this one (``None`` while valid); only valid entries are recalled."""
    evidence: Mapped[list[Any]] = mapped_column(JSON)
    """Transcript message ids (``messages.id``) of the user messages or tool results it came from."""
    embedding: Mapped[list[Any] | None] = mapped_column(JSON)
    """The text's embedding when an embedding endpoint is configured (cosine computed in Python)."""



class AdminSessionRow(Base):
    """One admin login (``gateway.admin.sessions``): the id the signed ``gw_admin`` cookie carries.
    Logout sets ``revoked_at``, which every instance sees."""

    __tablename__ = "admin_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)


class LinkFailureRow(Base):
    """A wrong ``/link CODE`` guess by a user (``Directory.link`` refuses more than
    ``LINK_GUESSES`` in ``LINK_GUESS_WINDOW_S``, on every instance)."""

    __tablename__ = "link_failures"
    __table_args__ = (Index("ix_link_failures_user_at", "user_id", "failed_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(String(32))
    failed_at: Mapped[float] = mapped_column(Float)

class InstanceRow(Base):
    """The process that holds an instance id (``gateway.ops.instance``): the owner name written into
    lane leases, outbox claims and job-run claims. One row per id while its process runs; renewed
    every ``HEARTBEAT_S``, deleted at a graceful stop. A process starting with an id whose holder
    is gone takes the row over (and with it the leases); with a live holder it refuses to start."""

    __tablename__ = "instances"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    boot: Mapped[str] = mapped_column(String(32))
    """Random per process start: tells this start of the id from an earlier or a twin one."""
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    pid_scope: Mapped[str] = mapped_column(String(255))
    """Where ``pid`` means this process: host name, kernel boot id and PID namespace (Linux)."""
    pid_start: Mapped[str | None] = mapped_column(String(32))
    """The process's start time in clock ticks after boot (``/proc/PID/stat``): tells a reused pid."""
    started_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)


class ChatSettingRow(Base):
    """Settings an admin set in a chat (``/model``, ``/persona``, ``/busy``;
    ``gateway.sessions.chat_settings``), stronger than every ``[[chats]]`` rule. One row per chat
    (all its threads); a ``None`` column is not set there."""

    __tablename__ = "chat_settings"

    platform: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    chat_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    route: Mapped[str | None] = mapped_column(String(64))
    persona: Mapped[str | None] = mapped_column(Text)
    busy_policy: Mapped[str | None] = mapped_column(String(16))
    updated_by: Mapped[str] = mapped_column(String(255))
    """``platform:user id`` of the admin who set the latest change."""
    updated_at: Mapped[float] = mapped_column(Float)


class GroupMessageRow(Base):
    """A group message not addressed to the bot, kept as group context (``gateway.sessions.group_context``)
    for chats with ``sessions.group_context_messages`` on: cleaned and redacted like the inbox, at
    most that many per chat, deleted after ``sessions.group_context_hours``."""

    __tablename__ = "group_messages"
    __table_args__ = (
        UniqueConstraint("platform", "tenant", "platform_message_id", name="uq_group_messages_platform_message"),
        Index("ix_group_messages_chat", "platform", "tenant", "chat_id", "received_at"),
        Index("ix_group_messages_stored_at", "stored_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    platform: Mapped[str] = mapped_column(String(32))
    tenant: Mapped[str] = mapped_column(String(128))
    chat_id: Mapped[str] = mapped_column(String(255))
    thread_id: Mapped[str | None] = mapped_column(String(255))
    """The thread or forum topic it was posted in (``None``: the chat's top level)."""
    platform_message_id: Mapped[str] = mapped_column(String(255))
    author: Mapped[str] = mapped_column(String(255))
    text: Mapped[str] = mapped_column(Text)
    attachments: Mapped[list[Any]] = mapped_column(JSON)
    received_at: Mapped[float] = mapped_column(Float)
    """The platform's time of the message (orders the context)."""
    stored_at: Mapped[float] = mapped_column(Float)
    """When the gateway kept it (retention counts from here)."""


class BlobRow(Base):
    """Content-addressed bytes (``gateway.media.store.DatabaseBlobStore``, ``media.store =
    "database"``). PostgreSQL stores ``data`` (``bytea``) out of line in its TOAST table, uncompressed
    (migration ``0801`` sets ``STORAGE EXTERNAL``: images and archives are compressed already), so
    reading rows of this table never drags the bytes along; one value may be up to 1 GB, the
    gateway's limits keep them far below."""

    __tablename__ = "blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    mime_type: Mapped[str] = mapped_column(String(255))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)


class AttachmentRow(Base):
    """Who uses a blob (``gateway.media.index``): one row per file of a message in a session (and
    one per rendition sent to the model). A blob is deleted once no row refers to it: retention,
    ``/forget_files`` and deleting a session remove rows, then the unreferenced blobs."""

    __tablename__ = "attachments"
    __table_args__ = (
        Index("ix_attachments_session", "session_id"),
        Index("ix_attachments_owner", "owner_user_id"),
        Index("ix_attachments_sha256", "sha256"),
        Index("ix_attachments_created", "created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sha256: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[str | None] = mapped_column(String(32))
    owner_user_id: Mapped[str | None] = mapped_column(String(32))
    """The user who sent the file (``users.id``); ``None`` for files the gateway made itself."""
    turn_id: Mapped[str | None] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16), default="original")
    """``original`` (as received) | ``rendition`` (re-encoded for the model) | ``outbound`` (sent by the bot)."""
    kind: Mapped[str] = mapped_column(String(16))
    mime_type: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(BigInteger)
    name: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float)


class UsageRow(Base):
    """One model call's (or transcription's) tokens and cost, written in the transaction that writes
    the call's assistant message, or the user message carrying the transcript
    (``Store.append_messages``, ``Store.finish_turn``): a step is counted exactly
    once, as its message is stored once (``call_key`` = ``message:<messages.id>``, unique). Kept when
    the session is deleted (what was spent stays spent). Summed by ``gateway.ops.usage``: per
    user, chat, provider and model, per ``day`` (``YYYY-MM-DD`` in ``limits.timezone`` when the call
    was made; a month is the range of its days)."""

    __tablename__ = "usage"
    __table_args__ = (
        UniqueConstraint("call_key", name="uq_usage_call"),
        Index("ix_usage_user_day", "user_id", "day"),
        Index("ix_usage_chat_day", "chat_key", "day"),
        Index("ix_usage_day", "day"),
        Index("ix_usage_turn", "turn_id"),  # a resumed turn's spend (Store.calls_spent)
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    call_key: Mapped[str] = mapped_column(String(96))
    turn_id: Mapped[str | None] = mapped_column(String(64))
    user_id: Mapped[str | None] = mapped_column(String(32))
    """The requester (``inbox.user_id``); ``None`` for a scheduled report's run."""
    chat_key: Mapped[str] = mapped_column(String(255))
    """``platform:tenant:chat_id`` of the chat the turn answered (as ``outbox.chat_key``)."""
    session_key: Mapped[str | None] = mapped_column(String(255))
    platform: Mapped[str] = mapped_column(String(32))
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    day: Mapped[str] = mapped_column(String(10))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    """Every prompt token, cached ones included (as the API reports them)."""
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    """Of ``prompt_tokens``, those served from the provider's cache (not counted again)."""
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    """At the configured price when the call was made, cache discount included."""
    created_at: Mapped[float] = mapped_column(Float)


class LimitNoticeRow(Base):
    """That a user (or chat) over a limit was told so, once per ``period`` (``gateway.ops.usage``):
    the messages after it get no reply until the period changes. ``inbox_id`` is the message that
    was answered, so a rerun of that turn after a crash answers it again (the outbox dedupes)."""

    __tablename__ = "limit_notices"

    subject: Mapped[str] = mapped_column(String(255), primary_key=True)
    """``user:<id>`` or ``chat:<chat key>``."""
    limit_name: Mapped[str] = mapped_column(String(64), primary_key=True)
    period: Mapped[str] = mapped_column(String(32), primary_key=True)
    inbox_id: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


# The FTS5 index is not a SQLAlchemy table: dropping ``memories`` (tests reset with drop_all) drops it too.
event.listen(MemoryRow.__table__, "after_drop",
             DDL("DROP TABLE IF EXISTS memories_fts").execute_if(dialect="sqlite"))


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Alembic's autogenerate filter: the full-text indexes of ``memories`` (SQLite: the FTS5 table
    ``memories_fts`` and its shadow tables; PostgreSQL: the GIN index ``ix_memories_fts`` and the
    trigger clearing a stale ``search_text``) are made by migrations ``0401`` and ``0806`` for one
    dialect each, not by these models."""
    if name is None:
        return True
    fts_table = type_ == "table" and name.startswith("memories_fts")
    return not (fts_table or (type_ == "index" and name == "ix_memories_fts"))


def table(row: type[Base]) -> Table:
    """The Core ``Table`` of a mapped row class (typed as ``Table``, which ``insert``/``update``
    accept; ``Row.__table__`` is typed as a plain ``FromClause``)."""
    return row.__table__  # type: ignore[return-value]
