"""Statements every turn runs, built once at import with named parameters (``b_*``).

Building a SQLAlchemy Core statement and computing its cache key costs more than running it on
SQLite (about 80 µs against 30 µs per statement), and a turn runs some 35 of them. A statement
object built once keeps its cache key and compiled form, so each call only binds values:
``conn.execute(PENDING_BATCH, {"b_key": key, "b_limit": 1})``.

Parameter names start with ``b_`` because SQLAlchemy reserves column names for the SET and VALUES
clauses: an UPDATE below without ``.values()`` takes its SET columns from the execute parameters
that are named after columns (``{"b_id": 7, "status": "sent"}`` sets ``status``).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import JSON, and_, bindparam, case, exists, func, insert, literal_column, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from gateway.store.models import (
    ChatMemberRow,
    InboxRow,
    JobRunRow,
    LaneRow,
    MessageRow,
    OutboxRow,
    SessionRow,
    SummaryRow,
    UsageRow,
    table,
)

_inbox = table(InboxRow)
_lanes = table(LaneRow)
_messages = table(MessageRow)
_outbox = table(OutboxRow)
_sessions = table(SessionRow)
_members = table(ChatMemberRow)
_summaries = table(SummaryRow)
_job_runs = table(JobRunRow)
_usage = table(UsageRow)

UNSETTLED = ("pending", "claimed", "sending")
SETTLED_OUTBOX = ("sent", "failed", "cancelled", "unconfirmed")
"""Outbox states a row never leaves."""
SETTLED_INBOX = ("done", "failed", "cancelled", "merged", "limited")
"""Inbox states a row never leaves (every one but *pending*)."""

# -- inbox and lanes --------------------------------------------------------------------------
INSERT_INBOX = insert(_inbox)
"""Values: the inbox columns."""

INSERT_LANE = insert(_lanes)
"""Values: ``key``, ``lease_owner``, ``lease_until``, ``generation``."""

LANE_EXISTS = select(_lanes.c.key).where(_lanes.c.key == bindparam("b_key"))

INSERT_LANE_IF_NEW = {
    "sqlite": sqlite.insert(_lanes).on_conflict_do_nothing(index_elements=[_lanes.c.key]),
    "postgresql": postgresql.insert(_lanes).on_conflict_do_nothing(index_elements=[_lanes.c.key]),
}
"""By dialect: ``INSERT_LANE`` unless the lane exists (``rowcount`` 0: it does, leased by another
instance when the claim before it failed), in one statement instead of a read and an insert."""

LANE_GENERATION = select(_lanes.c.generation).where(_lanes.c.key == bindparam("b_key"))

PENDING_BATCH = (
    select(_inbox.c.id, _inbox.c.payload, _inbox.c.user_id, _inbox.c.crashes,
           select(_lanes.c.generation).where(_lanes.c.key == bindparam("b_key")).scalar_subquery()
           .label("generation"))
    .where(_inbox.c.session_key == bindparam("b_key"), _inbox.c.status == "pending")
    .order_by(_inbox.c.id)
    .limit(bindparam("b_limit"))
)
"""The oldest ``b_limit`` pending rows of session key ``b_key`` (``id``, ``payload``, ``user_id``,
``crashes``), each with the lane's ``generation``."""

ANY_PENDING = select(_inbox.c.id).where(_inbox.c.session_key == bindparam("b_key"),
                                        _inbox.c.status == "pending").limit(1)

CLAIM_LANE = (
    update(_lanes)
    .where(_lanes.c.key == bindparam("b_key"),
           or_(_lanes.c.lease_owner.is_(None), _lanes.c.lease_owner == bindparam("b_owner"),
               _lanes.c.lease_until < bindparam("b_now")))
    .values(lease_owner=bindparam("b_owner"), lease_until=bindparam("b_until"))
)
"""Takes the lease on ``b_key`` if free, expired (before ``b_now``) or already ``b_owner``'s."""

CLAIM_FREE_LANE = (
    update(_lanes)
    .where(_lanes.c.key == bindparam("b_key"),
           or_(_lanes.c.lease_owner.is_(None), _lanes.c.lease_until < bindparam("b_now")))
    .values(lease_owner=bindparam("b_owner"), lease_until=bindparam("b_until"))
)
"""Takes the lease on ``b_key`` only if free or expired (before ``b_now``): ``CLAIM_LANE`` without
"already ``b_owner``'s" (a lease this instance holds is a turn running here)."""

RELEASE_LANE = (
    update(_lanes)
    .where(_lanes.c.key == bindparam("b_key"), _lanes.c.lease_owner == bindparam("b_owner"))
    .values(lease_owner=None, lease_until=0.0)
)

FINISH_INBOX = update(_inbox).where(_inbox.c.id == bindparam("b_id"))
"""SET columns from the parameters (``status``, ``finished_at``)."""

FINISH_INBOX_MANY = update(_inbox).where(_inbox.c.id.in_(bindparam("b_ids", expanding=True)))

# -- sessions and transcript ------------------------------------------------------------------
CURRENT_SESSION = (
    select(_sessions.c.id, _sessions.c.system_prompt, _sessions.c.updated_at, _sessions.c.settings)
    .select_from(_lanes.join(_sessions, _sessions.c.id == _lanes.c.session_id))
    .where(_lanes.c.key == bindparam("b_key"))
)

LATEST_SUMMARY = (
    select(_summaries.c.covers_to_id, _summaries.c.text)
    .where(_summaries.c.session_id == bindparam("b_session"))
    .order_by(_summaries.c.id.desc())
    .limit(1)
)

_newest = _summaries.alias("newest")
_NEWEST_SUMMARY_ID = (select(_newest.c.id).where(_newest.c.session_id == _sessions.c.id)
                      .order_by(_newest.c.id.desc()).limit(1).correlate(_sessions).scalar_subquery())

CURRENT_SESSION_SUMMARY = (
    select(_sessions.c.id, _sessions.c.system_prompt, _sessions.c.updated_at, _sessions.c.settings,
           _summaries.c.covers_to_id, _summaries.c.text.label("summary_text"))
    .select_from(_lanes.join(_sessions, _sessions.c.id == _lanes.c.session_id)
                 .outerjoin(_summaries, _summaries.c.id == _NEWEST_SUMMARY_ID))
    .where(_lanes.c.key == bindparam("b_key"))
)
"""``CURRENT_SESSION`` with its ``LATEST_SUMMARY`` (``covers_to_id``, ``summary_text``: ``NULL``
without one) in one statement: the summary found through its index on ``(session_id, id)``."""

WINDOW = (
    select(_messages.c.id, _messages.c.turn_id, _messages.c.role, _messages.c.content, _messages.c.tool_calls,
           _messages.c.tool_call_id, _messages.c.name, _messages.c.meta, _messages.c.platform_message_id)
    .where(_messages.c.session_id == bindparam("b_session"), _messages.c.id > bindparam("b_after"))
    .order_by(_messages.c.id.desc())
    .limit(bindparam("b_limit"))
)
"""The newest ``b_limit`` messages of ``b_session`` after id ``b_after``, newest first."""


def _session_with_window() -> Any:
    current = CURRENT_SESSION_SUMMARY.subquery("current")
    m = _messages
    newest = (select(m.c.id, m.c.turn_id, m.c.role, m.c.content, m.c.tool_calls, m.c.tool_call_id, m.c.name, m.c.meta,
                     m.c.platform_message_id)
              .where(m.c.session_id == current.c.id, m.c.id > func.coalesce(current.c.covers_to_id, 0))
              .order_by(m.c.id.desc()).limit(bindparam("b_limit")).correlate(current).subquery("newest"))
    window = (select(func.json_agg(postgresql.aggregate_order_by(func.json_build_array(*newest.c), newest.c.id),
                                   type_=JSON))
              .correlate(current).scalar_subquery())
    return select(*current.c, window.label("window"))


SESSION_WITH_WINDOW = _session_with_window()
"""PostgreSQL: ``CURRENT_SESSION_SUMMARY`` and its ``WINDOW`` (the newest ``b_limit`` messages after
the summary's cut) in one statement, one round trip instead of two: ``window`` is a JSON array of
``[id, turn_id, role, content, tool_calls, tool_call_id, name, meta, platform_message_id]`` arrays,
oldest first (``NULL``: none). ``json`` values are embedded as stored, so ``meta`` reads back with
the same keys and numbers as through ``WINDOW``. The messages are found through their
``(session_id, id)`` index, as ``WINDOW``'s."""

TURN_TEXTS = (
    select(_messages.c.id, _messages.c.turn_id, _messages.c.role, _messages.c.content)
    .where(_messages.c.session_id == bindparam("b_session"), _messages.c.id.in_(
        select(_messages.c.id).where(_messages.c.session_id == bindparam("b_session"))
        .order_by(_messages.c.id.desc()).limit(bindparam("b_limit")).scalar_subquery()),
        _messages.c.turn_id.in_(bindparam("b_turns", expanding=True)))
    .order_by(_messages.c.id)
)
"""The messages of turns ``b_turns`` among the newest ``b_limit`` of ``b_session``, oldest first
(text columns only: no JSON decoded)."""

INSERT_MESSAGE = insert(_messages)
"""Values: ``session_id``, ``turn_id``, ``role``, ``content``, ``created_at`` and the optional
columns a message has (SQLite; PostgreSQL: ``insert_messages``)."""

MESSAGE_COLUMNS = tuple(c.key for c in _messages.columns if c.key != "id")
"""The ``messages`` columns ``insert_messages`` sets for each row."""

MESSAGES_PER_INSERT = 8
"""Rows of one ``insert_messages`` statement at most (a turn's finish writes two or three)."""


USAGE_COLUMNS = tuple(c.key for c in _usage.columns if c.key not in ("id", "call_key"))
"""The ``usage`` columns ``insert_messages`` sets for each usage row besides its ``call_key``."""


@functools.cache
def insert_messages(count: int, usage: tuple[tuple[int, int], ...] = ()) -> Any:
    """PostgreSQL: ``count`` transcript messages and their model calls' ``usage`` rows in one
    statement (one round trip instead of one per row), selecting the messages' ids. Every column is
    set: message ``i``'s parameters are ``<column>_<i>`` for each of ``MESSAGE_COLUMNS`` (``None``
    where a message has no value; a JSON column's ``None`` is SQL ``NULL``, as when the column is
    left out). ``usage[j] = (i, n)``: the ``j``-th usage row is message ``i``'s ``n``-th call, keyed
    ``message:<its id>`` (``:<n>`` after the first), its other columns ``u<j>_<column>`` for each of
    ``USAGE_COLUMNS``. Ids are handed out in insertion order and come back in no promised order:
    sorted, they are the messages' ids in order (a usage row finds its message's id so too).
    Built once per shape (``count``: 1 to ``MESSAGES_PER_INSERT``). Not on SQLite: there, with no
    round trip to save, binding every column of every row cost twice the Python of one
    ``INSERT_MESSAGE`` per message (108-123 against 54-58 µs for a turn's two)."""
    def param(column: Any, name: str) -> Any:
        kind = JSON(none_as_null=True) if isinstance(column.type, JSON) else column.type
        return bindparam(name, type_=kind)

    columns = [_messages.c[key] for key in MESSAGE_COLUMNS]
    rows = [{column.key: param(column, f"{column.key}_{i}") for column in columns} for i in range(count)]
    inserted = insert(_messages).values(rows).returning(_messages.c.id).cte("inserted")
    calls = []
    for j, (i, n) in enumerate(usage):
        message_id = select(inserted.c.id).order_by(inserted.c.id).offset(i).limit(1).scalar_subquery()
        key = func.concat("message:", message_id, f":{n}" if n else "")
        values = [param(_usage.c[c], f"u{j}_{c}") for c in USAGE_COLUMNS]
        calls.append(insert(_usage).from_select(["call_key", *USAGE_COLUMNS], select(key, *values)).cte(f"call_{j}"))
    return select(inserted.c.id).add_cte(*calls)


INSERT_USAGE = insert(_usage)
"""Values: the usage columns (one model call)."""

SET_TITLE = (
    update(_sessions)
    .where(_sessions.c.id == bindparam("b_session"), _sessions.c.title.is_(None))
    .values(title=bindparam("b_title"))
)

TOUCH_SESSION = update(_sessions).where(_sessions.c.id == bindparam("b_session")).values(
    updated_at=bindparam("b_now"))

TOUCH_SESSION_TITLED = update(_sessions).where(_sessions.c.id == bindparam("b_session")).values(
    updated_at=bindparam("b_now"), title=func.coalesce(_sessions.c.title, bindparam("b_title")))
"""``TOUCH_SESSION`` and ``SET_TITLE`` in one statement (a turn whose user message is appended with
its reply)."""



def _members_seen(dialect_insert: Any) -> Any:
    chat_id = _inbox.c.payload[("address", "chat_id")].as_string()
    user_id = _inbox.c.payload[("sender", "user_id")].as_string()
    seen = (select(_inbox.c.platform, _inbox.c.tenant, chat_id, user_id, _inbox.c.payload["chat_type"].as_string(),
                   bindparam("b_now", type_=_members.c.first_seen_at.type))
            .where(_inbox.c.id.in_(bindparam("b_ids", expanding=True)), user_id.is_not(None)).distinct())
    return (dialect_insert(_members)
            .from_select(["platform", "tenant", "chat_id", "user_id", "chat_type", "first_seen_at"], seen)
            .on_conflict_do_nothing())


RECORD_MEMBERS_SQLITE = _members_seen(sqlite.insert)
"""SQLite: the senders of inbox rows ``b_ids`` recorded in ``chat_members`` (those not yet there),
seen at ``b_now``. PostgreSQL does it in ``finish_writes`` (``RECORD_MEMBERS`` alone elsewhere)."""
RECORD_MEMBERS = _members_seen(postgresql.insert)
"""PostgreSQL: ``RECORD_MEMBERS_SQLITE``."""
RECORD_MEMBER = {name: insert_(_members).on_conflict_do_nothing()
                 for name, insert_ in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))}
"""By dialect name: one sender recorded in ``chat_members`` unless there already (values: the
columns), for a row stored handled at once (a control command's)."""

# -- outbox -----------------------------------------------------------------------------------
LOCK_CHAT = select(func.pg_advisory_xact_lock(func.hashtextextended(bindparam("b_chat"), 0)))
"""PostgreSQL: chat ``b_chat``'s transaction-level advisory lock (released at commit or rollback):
the reply queues of a chat's lanes, one after the other."""

INSERT_OUTBOX = insert(_outbox)

UNSETTLED_IN_CHAT = select(_outbox.c.id).where(_outbox.c.chat_key == bindparam("b_chat"),
                                               _outbox.c.status.in_(UNSETTLED)).limit(1)
"""Any unsettled row of chat ``b_chat`` (a reply queued now must wait behind it: chat order)."""

OUTBOX_BY_KEY = select(_outbox.c.id, _outbox.c.status).where(_outbox.c.idempotency_key == bindparam("b_key"))

_by_key = _outbox.c.idempotency_key == bindparam("b_key")
QUEUE_CHECK = select(
    select(_outbox.c.id).where(_by_key).scalar_subquery().label("id"),
    select(_outbox.c.status).where(_by_key).scalar_subquery().label("status"),
    exists().where(_outbox.c.chat_key == bindparam("b_chat"), _outbox.c.status.in_(UNSETTLED)).label("unsettled"),
    select(_lanes.c.generation).where(_lanes.c.key == bindparam("b_lane")).scalar_subquery().label("generation"),
    select(_outbox.c.preview_id).where(_by_key).scalar_subquery().label("preview_id"),
)
"""What queueing a reply ``b_key`` already claimed needs to know, in one read instead of three
(``OUTBOX_BY_KEY``, ``UNSETTLED_IN_CHAT``, ``LANE_GENERATION``): the key's row (``id``, ``status``,
``preview_id``: a streamed reply's preview; ``None`` when not queued yet), whether chat ``b_chat``
has an unsettled row, and lane ``b_lane``'s generation (``None``: no lane)."""

_NEW_REPLY_COLUMNS = ("idempotency_key", "session_id", "session_key", "chat_key", "generation", "address", "text",
                      "reply_to_id", "buttons", "next_attempt_at", "created_at", "attachments")


def _queue_new_reply() -> Any:
    claimable = and_(
        ~exists().where(_outbox.c.chat_key == bindparam("chat_key"), _outbox.c.status.in_(UNSETTLED)),
        func.coalesce(select(_lanes.c.generation).where(_lanes.c.key == bindparam("session_key"))
                      .scalar_subquery(), 0) <= bindparam("generation"))
    flag = select(claimable.label("ok")).subquery("flag")
    given = [bindparam(name, type_=_outbox.c[name].type) for name in _NEW_REPLY_COLUMNS]
    row = (select(*given, case((flag.c.ok, "claimed"), else_="pending"), case((flag.c.ok, 1), else_=0),
                  case((flag.c.ok, bindparam("b_until", type_=_outbox.c.claim_until.type)), else_=0.0),
                  case((flag.c.ok, bindparam("b_owner", type_=_outbox.c.claimed_by.type)), else_=None))
           .select_from(flag)
           .where(~exists().where(_outbox.c.idempotency_key == bindparam("idempotency_key"))))
    return (insert(_outbox)
            .from_select([*_NEW_REPLY_COLUMNS, "status", "attempts", "claim_until", "claimed_by"], row)
            .returning(_outbox.c.id, _outbox.c.status))


QUEUE_NEW_REPLY = _queue_new_reply()
"""PostgreSQL: a turn's reply queued in one statement when its key is not queued yet, *claimed* by
``b_owner`` until ``b_until`` when its chat has no unsettled row and its lane's generation (lane
``session_key``) is not past ``generation``, else *pending*: what ``QUEUE_CHECK`` and
``INSERT_OUTBOX`` do in two round trips. Returns ``(id, status)``, or no row when the key is
queued already (a resumed turn's reply, a streamed reply's row: ``QUEUE_CHECK`` then decides).
Parameters: the ``INSERT_OUTBOX`` values but those of the claim, ``b_owner``, ``b_until``."""

FINISH_STREAM = update(_outbox).where(_outbox.c.id == bindparam("b_id"))
"""A streamed reply's row (*streaming*) with its final text: SET columns from the parameters
(``Store._queue``: *pending*, or *claimed* by the instance that sends it at once)."""

UNSETTLED_BEFORE_STREAM = select(_outbox.c.id).where(_outbox.c.chat_key == bindparam("b_chat"),
                                                     _outbox.c.idempotency_key != bindparam("b_key"),
                                                     _outbox.c.status.in_(UNSETTLED)).limit(1)
"""Any unsettled row of chat ``b_chat`` other than the reply ``b_key`` (a preview sent now would
overtake it)."""

STREAM_BY_KEY = select(_outbox.c.id, _outbox.c.preview_id, _outbox.c.status).where(
    _outbox.c.idempotency_key == bindparam("b_key"))

SET_PREVIEW = update(_outbox).where(_outbox.c.id == bindparam("b_id"), _outbox.c.status == "streaming").values(
    preview_id=bindparam("b_preview"))

CANCEL_STREAMS = (
    update(_outbox)
    .where(_outbox.c.idempotency_key.in_(bindparam("b_keys", expanding=True)), _outbox.c.status == "streaming")
    .values(status="cancelled", error="turn stopped while streaming")
)

_DUE = or_(
    and_(_outbox.c.status == "pending", _outbox.c.next_attempt_at <= bindparam("b_now")),
    and_(_outbox.c.status.in_(("claimed", "sending")), _outbox.c.claim_until < bindparam("b_now")),
)
"""Rows due at ``b_now``: pending and due, or claimed by an owner whose claim expired."""

_earlier = _outbox.alias("earlier")

DUE_OUTBOX = (
    select(_outbox.c.id, _outbox.c.attempts, _outbox.c.idempotency_key, _outbox.c.address, _outbox.c.text,
           _outbox.c.reply_to_id, _outbox.c.platform_message_ids, _outbox.c.status, _outbox.c.preview_id,
           _outbox.c.buttons, _outbox.c.attachments, _outbox.c.generation,
           _lanes.c.generation.label("lane_generation"))
    .select_from(_outbox.outerjoin(_lanes, _lanes.c.key == _outbox.c.session_key))
    .where(_DUE, ~exists().where(_earlier.c.chat_key == _outbox.c.chat_key, _earlier.c.id < _outbox.c.id,
                                 _earlier.c.status.in_(UNSETTLED)))
    .order_by(_outbox.c.id)
    .limit(bindparam("b_limit"))
)
"""Due rows, oldest first, at most the oldest unsettled row of each chat (chat order)."""

PENDING_IN_CHATS = select(_outbox.c.id).where(_outbox.c.chat_key.in_(bindparam("b_chats", expanding=True)),
                                             _outbox.c.status == "pending").limit(1)
"""Any pending row in chats ``b_chats`` (after a claim: a row waiting behind the claimed ones)."""

CLAIM_OUTBOX_ROW = (
    update(_outbox)
    .where(_outbox.c.id == bindparam("b_id"), _DUE)
    .values(status="claimed", claimed_by=bindparam("b_owner"), claim_until=bindparam("b_until"),
            attempts=bindparam("b_attempts"))
)

SETTLE_OUTBOX = update(_outbox).where(_outbox.c.id == bindparam("b_id"), _outbox.c.claimed_by == bindparam("b_owner"),
                                      _outbox.c.status.in_(("claimed", "sending")))
"""SET columns from the parameters; writes only while ``b_owner`` holds the claim."""

SETTLE_JOB_RUN = (
    update(_job_runs)
    .where(_job_runs.c.outbox_id == bindparam("b_id"), _job_runs.c.status == "delivering")
    .values(status=bindparam("b_status"),
            platform_message_ids=bindparam("b_ids", type_=_job_runs.c.platform_message_ids.type),
            error=bindparam("b_error"), finished_at=bindparam("b_now"))
)

@functools.cache
def settle_with_job_run(keys: frozenset[str]) -> Any:
    """PostgreSQL: ``SETTLE_OUTBOX`` setting the columns ``keys`` and ``SETTLE_JOB_RUN`` for the row
    in one statement (data-modifying CTEs, one snapshot, one round trip), selecting how many outbox
    rows were settled (0 or 1). The job run (a scheduled report's, if the row is one) takes the
    mark's ``status``, ``platform_message_ids`` and ``error``, and ``b_now`` as its end; parameters:
    ``b_id``, ``b_owner``, ``b_now`` and the columns. Built once per set of columns."""
    values = {key: bindparam(key, type_=_outbox.c[key].type) for key in sorted(keys)}
    settled = SETTLE_OUTBOX.values(**values).returning(_outbox.c.id).cte("settled")
    run = (update(_job_runs)
           .where(_job_runs.c.outbox_id.in_(select(settled.c.id)), _job_runs.c.status == "delivering")
           .values(status=bindparam("status", type_=_job_runs.c.status.type),
                   platform_message_ids=bindparam("platform_message_ids", type_=_job_runs.c.platform_message_ids.type),
                   error=bindparam("error", type_=_job_runs.c.error.type), finished_at=bindparam("b_now"))
           .cte("run"))
    return select(func.count()).select_from(settled).add_cte(run)


# -- a turn's finish in fewer round trips (PostgreSQL) ----------------------------------------
@functools.cache
def finish_writes(titled: bool, streams: bool) -> Any:
    """PostgreSQL: the unread writes of ``Store.finish_turn`` in one statement (data-modifying CTEs,
    one round trip instead of three or four): ``TOUCH_SESSION`` (``titled``: ``TOUCH_SESSION_TITLED``),
    the senders of the turn's inbox rows recorded (``RECORD_MEMBERS``), ``CANCEL_STREAMS``
    (``streams``) and the inbox rows finished (``b_ids``: the last one, ``b_last``, gets
    ``b_status``, earlier ones ``b_merged``). Parameters: ``b_session``, ``b_now`` (``b_title``),
    ``b_keys`` (a list), ``b_ids`` (a list), ``b_last``, ``b_status``, ``b_merged``. The statements
    write four different tables: no row is written twice, so one snapshot gives what the statements one by one
    gave. Built once per shape."""
    session = TOUCH_SESSION_TITLED if titled else TOUCH_SESSION
    members = RECORD_MEMBERS.cte("members")
    finished = (update(_inbox).where(_inbox.c.id.in_(bindparam("b_ids", expanding=True)))
                .values(status=case((_inbox.c.id == bindparam("b_last"),
                                     bindparam("b_status", type_=_inbox.c.status.type)),
                                    else_=bindparam("b_merged", type_=_inbox.c.status.type)),
                        finished_at=bindparam("b_now"))
                .cte("finished"))
    ctes = [session.cte("touched_session"), members, finished]
    if streams:
        ctes.append(CANCEL_STREAMS.cte("cancelled"))
    return select(literal_column("1")).add_cte(*ctes)


def _claim_free_lane_with_batch() -> Any:
    new = (postgresql.insert(_lanes)
           .values(key=bindparam("b_key"), lease_owner=bindparam("b_owner"), lease_until=bindparam("b_until"),
                   generation=0)
           .on_conflict_do_nothing(index_elements=[_lanes.c.key]).returning(_lanes.c.key).cte("new_lane"))
    taken = CLAIM_FREE_LANE.returning(_lanes.c.key).cte("taken")
    batch = PENDING_BATCH.cte("first_batch")
    state = select(exists(select(new.c.key)).label("fresh"),
                   or_(exists(select(new.c.key)), exists(select(taken.c.key))).label("won")).cte("claim")
    return (select(state.c.won, state.c.fresh, batch.c.id, batch.c.payload, batch.c.user_id, batch.c.crashes,
                   batch.c.generation)
            .select_from(state.outerjoin(batch, state.c.fresh))
            .order_by(batch.c.id))


CLAIM_FREE_LANE_WITH_BATCH = _claim_free_lane_with_batch()
"""PostgreSQL: ``INSERT_LANE_IF_NEW``, else ``CLAIM_FREE_LANE``, in one statement, with the new
lane's ``PENDING_BATCH``: a new chat's lane in one round trip instead of three (the insert, the
claim tried, the batch), a free lane's in two instead of three (this, then its batch).
Rows: ``won`` (the lease was taken), ``fresh`` (the lane was created), and for a created lane the
batch's columns (``id`` ``None``: no row waits; ``generation`` ``None``: a new lane's is 0, and the
statement's own snapshot cannot see the row it inserts); the first row alone otherwise. A lane
that existed is claimed only: its batch must be read by a statement of its own (``PENDING_BATCH``).
The claim's ``UPDATE`` may wait for a transaction holding the lane's row (its owner's finish
releasing it, a ``/stop`` moving its generation on) and then takes the lease from the row as that
transaction left it, but a read in this statement sees the rows as they were before it: the rows
that owner finished would be read as pending (answered twice), the generation as before the stop
(the message cancelled). A created lane was nobody's: its batch is read here."""


def _claim_free_lanes() -> Any:
    keys = bindparam("b_keys", type_=postgresql.ARRAY(_lanes.c.key.type))
    owner = bindparam("b_owner", type_=_lanes.c.lease_owner.type)
    until = bindparam("b_until", type_=_lanes.c.lease_until.type)
    wanted = select(func.unnest(keys).label("key")).cte("wanted")
    new = (postgresql.insert(_lanes)
           .from_select(["key", "lease_owner", "lease_until", "generation"],
                        select(wanted.c.key, owner, until, literal_column("0")).order_by(wanted.c.key))
           .on_conflict_do_nothing(index_elements=[_lanes.c.key]).returning(_lanes.c.key).cte("new_lanes"))
    # the lanes that existed, locked in key order (an index scan's or a sort's) once every insert
    # is done: the NOT IN reads the insert's rows in full before the first row reaches the lock
    free = (select(_lanes.c.key)
            .where(_lanes.c.key == func.any(keys), _lanes.c.key.not_in(select(new.c.key)),
                   or_(_lanes.c.lease_owner.is_(None), _lanes.c.lease_until < bindparam("b_now")))
            .order_by(_lanes.c.key).with_for_update().cte("free_lanes"))
    taken = (update(_lanes).where(_lanes.c.key.in_(select(free.c.key)))
             .values(lease_owner=owner, lease_until=until)
             .returning(_lanes.c.key).cte("taken"))
    ranked = (select(_inbox.c.id, _inbox.c.payload, _inbox.c.user_id, _inbox.c.crashes, _inbox.c.session_key,
                     func.row_number().over(partition_by=_inbox.c.session_key, order_by=_inbox.c.id).label("n"))
              .where(_inbox.c.session_key.in_(select(new.c.key)), _inbox.c.status == "pending")
              .cte("first_batches"))
    return (select(wanted.c.key, new.c.key.is_not(None).label("fresh"), ranked.c.id, ranked.c.payload,
                   ranked.c.user_id, ranked.c.crashes, literal_column("0").label("generation"))
            .select_from(wanted.outerjoin(new, new.c.key == wanted.c.key)
                         .outerjoin(taken, taken.c.key == wanted.c.key)
                         .outerjoin(ranked, and_(ranked.c.session_key == new.c.key,
                                                 ranked.c.n <= bindparam("b_limit"))))
            .where(or_(new.c.key.is_not(None), taken.c.key.is_not(None)))
            .order_by(wanted.c.key, ranked.c.id))


CLAIM_FREE_LANES = _claim_free_lanes()
"""PostgreSQL: ``CLAIM_FREE_LANE_WITH_BATCH`` for the session keys ``b_keys`` (a list, sorted;
distinct: a key named twice would read its batch twice) in one statement: a batch's new chats
claimed in one round trip instead of one each (``Store.claim_free_lanes_in``). Locks are taken in
two passes, each in key order: the new lanes' inserts (waiting on a key another transaction
inserts or updates), then, once every insert is done, the free lanes that existed (``FOR
UPDATE``, then the lease's ``UPDATE``). Two such statements therefore never wait for each other in
a cycle, whatever plan the planner picks (an ``UPDATE`` the planner ran before the ``INSERT``
locked existing lanes while inserts still waited: two instances' batches over new and freed
lanes deadlocked, ``tests/test_lane_claims.py``). Rows, ordered by ``key`` and inbox id, only for
the lanes won: ``key``, ``fresh`` (created here), and for a created lane its first ``b_limit``
pending rows (``id`` ``None``: none waits; ``generation``: a new lane's, 0); a lane that existed
and was free is claimed only, and its batch read by a statement of its own, for the reason
``CLAIM_FREE_LANE_WITH_BATCH`` gives. Parameters: ``b_keys``, ``b_owner``, ``b_now``,
``b_until``, ``b_limit``."""


def lock_lanes_in_key_order(*where: Any) -> Any:
    """A CTE (column ``key``) of the lanes matching ``where``, locked (``FOR UPDATE``; nothing on
    SQLite, whose writers never overlap) in key order. An ``UPDATE ... WHERE key IN (SELECT key
    FROM it)`` then changes rows this transaction already holds, so every transaction that locks
    several lanes takes them in one order and none waits in a cycle (PostgreSQL row locks:
    "Deadlocks" in the manual; ``CLAIM_FREE_LANES`` locks in key order too)."""
    return select(_lanes.c.key).where(*where).order_by(_lanes.c.key).with_for_update().cte("locked_lanes")


_batch = PENDING_BATCH.cte("batch")
BATCH_OR_RELEASE = (
    select(_batch.c.id, _batch.c.payload, _batch.c.user_id, _batch.c.crashes, _batch.c.generation)
    .add_cte(RELEASE_LANE.where(~exists(select(_batch.c.id))).cte("released"))
    .order_by(_batch.c.id)
)
"""PostgreSQL: ``PENDING_BATCH``, and ``RELEASE_LANE`` when it finds no row, in one statement
(parameters of both: ``b_key``, ``b_limit``, ``b_owner``)."""


# -- a new chat's first turn ------------------------------------------------------------------
INSERT_SESSION = insert(_sessions)
"""Values: the session columns."""

SET_LANE_SESSION = update(_lanes).where(_lanes.c.key == bindparam("b_key"))
"""Parameters: ``b_key`` and ``session_id`` (the SET column)."""


def _create_session_set_lane() -> Any:
    columns = ("id", "key", "system_prompt", "created_at", "updated_at", "owner_user_id", "settings")
    made = (insert(_sessions).values({c: bindparam(f"s_{c}", type_=_sessions.c[c].type) for c in columns})
            .returning(_sessions.c.id).cte("new_session"))
    return (update(_lanes).where(_lanes.c.key == bindparam("b_key"))
            .values(session_id=select(made.c.id).scalar_subquery()).add_cte(made))


CREATE_SESSION_SET_LANE = _create_session_set_lane()
"""PostgreSQL: ``INSERT_SESSION`` and ``SET_LANE_SESSION`` in one statement (one round trip
instead of two for a new chat's session). Parameters: the session's columns as ``s_<column>``,
and ``b_key``; ``rowcount`` 0: the key has no lane (the session is inserted all the same)."""


def _set_lanes_sessions() -> Any:
    pairs = (func.unnest(bindparam("b_keys", type_=postgresql.ARRAY(_lanes.c.key.type)),
                         bindparam("b_sessions", type_=postgresql.ARRAY(_lanes.c.session_id.type)))
             .table_valued("key", "session_id").render_derived(name="made"))
    return update(_lanes).where(_lanes.c.key == pairs.c.key).values(session_id=pairs.c.session_id)


SET_LANES_SESSIONS = _set_lanes_sessions()
"""PostgreSQL: ``SET_LANE_SESSION`` for many lanes in one statement: lane ``b_keys[i]`` gets
session ``b_sessions[i]`` (two lists of one length)."""


