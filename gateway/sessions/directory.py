"""``Directory``: users, their platform identities, one-time codes (linking and DM pairing) and
the sessions a user owns. Every call is a short transaction; call from worker threads or via
``Gateway.run_db``."""

from __future__ import annotations

import math
import secrets
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, and_, bindparam, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from gateway.core.i18n import _
from gateway.core.types import InboundMessage
from gateway.store.db import read_tx, write_tx
from gateway.store.fast import execute as run
from gateway.store.fast import execute_many
from gateway.store.models import (
    CodeRow,
    IdentityRow,
    InboxRow,
    LaneRow,
    LinkFailureRow,
    MessageRow,
    SessionRow,
    UserRow,
    table,
)
from gateway.store.sql import retry_locked

_users = table(UserRow)
_identities = table(IdentityRow)
_codes = table(CodeRow)
_sessions = table(SessionRow)
_lanes = table(LaneRow)
_inbox = table(InboxRow)
_messages = table(MessageRow)

_LAST_MESSAGE_AT = (select(_messages.c.created_at).where(_messages.c.session_id == _sessions.c.id)
                    .order_by(_messages.c.id.desc()).limit(1).correlate(_sessions).scalar_subquery())
OWNED_SESSIONS = select(_sessions.c.id, _sessions.c.title, _sessions.c.created_at,
                        _LAST_MESSAGE_AT.label("last")).where(_sessions.c.owner_user_id == bindparam("b_owner"))
"""A user's sessions (``b_owner``) with their newest message's time (``last``; ``NULL`` without
one): the sessions through their owner's index, each newest message through
``ix_messages_session_id_id`` (it once grouped every message of the database to find them)."""
_link_failures = table(LinkFailureRow)

_INSERT_USER = insert(_users)
"""Values: ``id``, ``approved``, ``created_at`` (built once: a new sender's first message runs it)."""
_INSERT_IDENTITY = insert(_identities)
"""Values: the identity columns."""

_IDENTIFY = (
    select(_identities.c.user_id, _users.c.approved, _users.c.language)
    .select_from(_identities.join(_users, _users.c.id == _identities.c.user_id))
    .where(_identities.c.platform == bindparam("b_platform"), _identities.c.tenant == bindparam("b_tenant"),
           _identities.c.platform_user_id == bindparam("b_user"))
)
"""The sender's user, whether it is approved and its chosen locale (built once: it runs for every inbound message)."""

_IDENTIFY_MANY = (
    select(_identities.c.platform_user_id, _identities.c.user_id, _users.c.approved, _users.c.language)
    .select_from(_identities.join(_users, _users.c.id == _identities.c.user_id))
    .where(_identities.c.platform == bindparam("b_platform"), _identities.c.tenant == bindparam("b_tenant"),
           _identities.c.platform_user_id.in_(bindparam("b_users", expanding=True)))
)
"""``_IDENTIFY`` for several senders of one platform and tenant (``b_users``: their platform user ids)."""

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: read aloud and typed on phones
CODE_LENGTH = 6
"""Characters of a pairing code (an admin types it to approve a sender: guessing it gains nothing)."""
LINK_CODE_LENGTH = 10
"""Characters of a ``/link`` code, shown as two groups of five (``ABCDE-FGHJK``): 50 bits. Guessing
needs no limit shared by all users then (which anyone could use up to close ``/link`` for everyone):
at 365 guesses a second, what one client made with fresh web identities, one of 1,000 codes alive at
once is found after some 100 years on average (32**10 / 1,000 / 365 s)."""
LINK_CODE_TTL_S = 600.0
LINK_CODES_PER_HOUR = 5
PAIRING_CODE_TTL_S = 7 * 24 * 3600.0
LINK_GUESSES = 5
LINK_GUESS_WINDOW_S = 900.0
"""At most ``LINK_GUESSES`` wrong ``/link CODE`` guesses per user in ``LINK_GUESS_WINDOW_S``; past
that, ``/link CODE`` is refused (even with a right code) until the oldest guess leaves the window."""


class CodeError(Exception):
    """A code cannot be used; the message is safe to show to the user (in the locale current where
    it was raised)."""


class WrongCode(CodeError):
    """The code is wrong, used or expired (a guess that counts against the limit)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who sent a message: their user id, whether DM pairing approved them, and the locale they
    chose with ``/language`` (``None``: none chosen)."""

    user_id: str
    approved: bool
    language: str | None = None


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One of a user's sessions, for ``/sessions``."""

    id: str
    title: str | None
    created_at: float
    last_used_at: float
    current: bool


class SessionUsage(NamedTuple):
    """A session's totals: messages, prompt tokens (``cached_tokens`` of them served from the
    provider's cache), completion tokens, and USD as recorded per call (``messages.meta.cost_usd``)."""

    messages: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost_usd: float


def usage_sums() -> list[Any]:
    """SQL sums over ``messages`` rows: prompt, completion and cached tokens, recorded cost (SQLite
    and PostgreSQL: the JSON ``meta`` fields are read with the dialect's JSON operators)."""
    return [func.coalesce(func.sum(_messages.c.prompt_tokens), 0),
            func.coalesce(func.sum(_messages.c.completion_tokens), 0),
            func.coalesce(func.sum(_messages.c.meta["cached_tokens"].as_integer()), 0),
            func.coalesce(func.sum(_messages.c.meta["cost_usd"].as_float()), 0.0)]


class Directory:
    """Users and identities on one engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine, *, on_join: Sequence[Callable[[Connection, str, str], object]] = ()) -> None:
        self.engine = engine
        self._on_join = tuple(on_join)
        """Run inside a ``/link`` transaction as ``hook(conn, joining_user, target_user)``: state
        owned by other capabilities follows the account that joined (long-term memory entries:
        ``gateway.memory.store.move_user_entries``; the files it sent:
        ``gateway.media.index.move_user_files``)."""

    # -- identities --------------------------------------------------------------------------
    @retry_locked
    def identify(self, message: InboundMessage) -> Identity:
        """The sender's user; creates the user and identity on first contact."""
        with read_tx(self.engine) as conn:
            found = self._lookup(conn, message)
        if found is not None:
            return found
        try:
            with write_tx(self.engine) as conn:
                return self._create(conn, message)
        except IntegrityError:  # created concurrently by another instance: read theirs
            return self.identify(message)

    def identify_in(self, conn: Connection, message: InboundMessage) -> Identity:
        """``identify`` inside the caller's write transaction ``conn`` (the inbox write of the same
        message shares it). Raises ``IntegrityError`` when another instance created the sender at the
        same moment: the caller rolls back and uses ``identify``."""
        found = self._lookup(conn, message)
        return found if found is not None else self._create(conn, message)

    def identify_many_in(self, conn: Connection, messages: Sequence[InboundMessage]) -> list[Identity]:
        """``identify_in`` for each of ``messages``, in order, with a statement per platform and
        tenant among them for the senders known and, for those who are not, one ``INSERT`` of users
        and one of identities for the lot (``execute_many``: on PostgreSQL a round trip each instead
        of one to three per message). A sender of several of them is created once, with the display
        name of their first. Raises ``IntegrityError`` as ``identify_in`` does."""
        found: dict[tuple[str, str, str], Identity] = {}
        scopes: dict[tuple[str, str], list[str]] = {}
        for message in messages:
            users = scopes.setdefault((message.address.platform, message.address.tenant), [])
            if message.sender.user_id not in users:
                users.append(message.sender.user_id)
        for (platform, tenant), users in scopes.items():
            for row in run(conn, _IDENTIFY_MANY, {"b_platform": platform, "b_tenant": tenant, "b_users": users}):
                found[(platform, tenant, row.platform_user_id)] = Identity(row.user_id, bool(row.approved),
                                                                           row.language)
        now = time.time()
        new_users: list[dict[str, Any]] = []
        new_identities: list[dict[str, Any]] = []
        for message in messages:
            address, sender = message.address, message.sender
            if (address.platform, address.tenant, sender.user_id) in found:
                continue
            user_id = uuid.uuid4().hex
            found[(address.platform, address.tenant, sender.user_id)] = Identity(user_id, False)
            new_users.append({"id": user_id, "approved": False, "created_at": now})
            new_identities.append({"user_id": user_id, "platform": address.platform, "tenant": address.tenant,
                                   "platform_user_id": sender.user_id,
                                   "display_name": sender.display_name or sender.username, "created_at": now})
        execute_many(conn, _INSERT_USER, new_users)
        execute_many(conn, _INSERT_IDENTITY, new_identities)
        return [found[(m.address.platform, m.address.tenant, m.sender.user_id)] for m in messages]

    @staticmethod
    def _lookup(conn: Connection, message: InboundMessage) -> Identity | None:
        row = run(conn, _IDENTIFY, {"b_platform": message.address.platform, "b_tenant": message.address.tenant,
                                    "b_user": message.sender.user_id}).first()
        return Identity(row.user_id, bool(row.approved), row.language) if row is not None else None

    @staticmethod
    def _create(conn: Connection, message: InboundMessage) -> Identity:
        address, sender = message.address, message.sender
        user_id, now = uuid.uuid4().hex, time.time()
        run(conn, _INSERT_USER, {"id": user_id, "approved": False, "created_at": now})
        run(conn, _INSERT_IDENTITY, {
            "user_id": user_id, "platform": address.platform, "tenant": address.tenant,
            "platform_user_id": sender.user_id, "display_name": sender.display_name or sender.username,
            "created_at": now})
        return Identity(user_id, False)

    @retry_locked
    def set_language(self, user_id: str, locale: str | None) -> None:
        """Stores the locale ``user_id`` chose (``/language``; ``None`` clears it): every identity of
        the user, on every instance, answers in it from the next message on."""
        with write_tx(self.engine) as conn:
            conn.execute(update(_users).where(_users.c.id == user_id).values(language=locale))

    def identities(self, user_id: str) -> list[dict[str, Any]]:
        """The user's identities (platform, tenant, platform user id, display name, linked_at)."""
        with read_tx(self.engine) as conn:
            rows = conn.execute(select(_identities).where(_identities.c.user_id == user_id)
                                .order_by(_identities.c.id)).all()
        return [dict(r._mapping) for r in rows]

    # -- linking -----------------------------------------------------------------------------
    @retry_locked
    def new_code(self, user_id: str, kind: str) -> str:
        """A fresh one-time code for ``user_id`` (``link``: 10 minutes, at most 5 an hour,
        ``LINK_CODE_LENGTH`` characters shown as ``ABCDE-FGHJK``; ``pairing``: ``CODE_LENGTH``
        characters, the pending one reused). Raises ``CodeError`` past the rate limit."""
        now = time.time()
        with write_tx(self.engine) as conn:
            if kind == "pairing":
                pending = conn.execute(select(_codes.c.code).where(
                    _codes.c.user_id == user_id, _codes.c.kind == "pairing", _codes.c.used_at.is_(None),
                    _codes.c.expires_at > now)).first()
                if pending is not None:
                    return str(pending.code)
            else:
                recent = conn.execute(select(func.count()).select_from(_codes).where(
                    _codes.c.user_id == user_id, _codes.c.kind == kind, _codes.c.created_at > now - 3600)).scalar_one()
                if recent >= LINK_CODES_PER_HOUR:
                    raise CodeError(_("Too many link codes in the last hour; try again later."))
            ttl = PAIRING_CODE_TTL_S if kind == "pairing" else LINK_CODE_TTL_S
            length = LINK_CODE_LENGTH if kind == "link" else CODE_LENGTH
            code = "".join(secrets.choice(CODE_ALPHABET) for _i in range(length))
            conn.execute(insert(_codes).values(code=code, kind=kind, user_id=user_id, created_at=now,
                                               expires_at=now + ttl))
        return f"{code[:5]}-{code[5:]}" if kind == "link" else code

    def _take_code(self, conn: Any, code: str, kind: str) -> str:
        """Marks ``code`` used (once) and returns its user id; raises ``CodeError``. Case, spaces
        and the hyphen of a link code's groups do not matter."""
        now = time.time()
        code = "".join(code.split()).replace("-", "").upper()
        row = conn.execute(select(_codes.c.user_id, _codes.c.expires_at, _codes.c.used_at)
                           .where(_codes.c.code == code, _codes.c.kind == kind)).first()
        if row is None or row.used_at is not None or row.expires_at < now:
            raise WrongCode(_("That code is not valid (wrong, used or expired)."))
        taken = conn.execute(update(_codes).where(_codes.c.code == code, _codes.c.used_at.is_(None))
                             .values(used_at=now)).rowcount
        if taken != 1:
            raise WrongCode(_("That code is not valid (wrong, used or expired)."))
        return str(row.user_id)

    @retry_locked
    def link(self, code: str, user_id: str) -> str:
        """Joins ``user_id`` (the sender of ``/link CODE``) into the code's user: all its
        identities, sessions, long-term memory entries and files move there, in one transaction.
        Returns the surviving user id.

        Raises:
            CodeError: the code is wrong, used or expired (recorded as a wrong guess), names this
                user, or the user made ``LINK_GUESSES`` wrong guesses in ``LINK_GUESS_WINDOW_S``.
        """
        now = time.time()
        with read_tx(self.engine) as conn:
            guesses = conn.execute(select(_link_failures.c.failed_at).where(
                _link_failures.c.user_id == user_id, _link_failures.c.failed_at > now - LINK_GUESS_WINDOW_S)
                .order_by(_link_failures.c.failed_at.desc()).limit(LINK_GUESSES)).scalars().all()
        if len(guesses) >= LINK_GUESSES:
            minutes = max(1, math.ceil((min(guesses) + LINK_GUESS_WINDOW_S - now) / 60))
            raise CodeError(_("Too many wrong codes; try again in {minutes} minutes.", minutes=minutes))
        try:
            return self._join(code, user_id, now)
        except WrongCode:
            with write_tx(self.engine) as conn:
                conn.execute(insert(_link_failures).values(user_id=user_id, failed_at=now))
                conn.execute(delete(_link_failures).where(_link_failures.c.failed_at < now - LINK_GUESS_WINDOW_S))
            raise

    def _join(self, code: str, user_id: str, now: float) -> str:
        with write_tx(self.engine) as conn:
            target = self._take_code(conn, code, "link")
            if target == user_id:
                raise CodeError(_("This account is already linked to that one."))
            conn.execute(update(_identities).where(_identities.c.user_id == user_id)
                         .values(user_id=target, linked_at=now))
            conn.execute(update(_sessions).where(_sessions.c.owner_user_id == user_id).values(owner_user_id=target))
            for hook in self._on_join:  # long-term memory follows the joining account too
                hook(conn, user_id, target)
            joining = conn.execute(select(_users.c.approved, _users.c.language).where(_users.c.id == user_id)).first()
            if joining is not None and joining.approved:
                conn.execute(update(_users).where(_users.c.id == target).values(approved=True))
            if joining is not None and joining.language:  # a choice made on either account is kept
                conn.execute(update(_users).where(_users.c.id == target, _users.c.language.is_(None))
                             .values(language=joining.language))
        return target

    @retry_locked
    def unlink(self, message: InboundMessage) -> bool:
        """Detaches the sender's identity into a user of its own (its sessions stay with the old
        user). Returns ``False`` when the identity was not linked to anything."""
        address, sender = message.address, message.sender
        where = and_(_identities.c.platform == address.platform, _identities.c.tenant == address.tenant,
                     _identities.c.platform_user_id == sender.user_id)
        now = time.time()
        with write_tx(self.engine) as conn:
            row = conn.execute(select(_identities.c.id, _identities.c.user_id).where(where)).first()
            if row is None:
                return False
            others = conn.execute(select(func.count()).select_from(_identities).where(
                _identities.c.user_id == row.user_id, _identities.c.id != row.id)).scalar_one()
            if not others:
                return False
            old = conn.execute(select(_users.c.approved, _users.c.language).where(_users.c.id == row.user_id)).first()
            new_user = uuid.uuid4().hex
            conn.execute(insert(_users).values(id=new_user, approved=bool(old and old.approved), created_at=now,
                                               language=old.language if old else None))
            conn.execute(update(_identities).where(_identities.c.id == row.id).values(user_id=new_user, linked_at=None))
        return True

    # -- DM pairing ----------------------------------------------------------------------------
    @retry_locked
    def approve(self, code: str) -> str:
        """Approves the user behind pairing ``code``; returns its user id. Raises ``CodeError``."""
        with write_tx(self.engine) as conn:
            user_id = self._take_code(conn, code, "pairing")
            conn.execute(update(_users).where(_users.c.id == user_id).values(approved=True))
        return user_id

    # -- sessions a user owns --------------------------------------------------------------------
    def sessions(self, user_id: str, key: str, limit: int = 20) -> list[SessionInfo]:
        """The user's sessions, most recently used first (``/sessions``). One index look-up per
        session of the user (``OWNED_SESSIONS``), however many messages the database holds."""
        with read_tx(self.engine) as conn:
            current = conn.execute(select(_lanes.c.session_id).where(_lanes.c.key == key)).scalar()
            rows = conn.execute(OWNED_SESSIONS, {"b_owner": user_id}).all()
        infos = [SessionInfo(r.id, r.title, r.created_at, r.last or r.created_at, r.id == current) for r in rows]
        return sorted(infos, key=lambda s: s.last_used_at, reverse=True)[:limit]

    def owned_session(self, user_id: str, prefix: str) -> str | None:
        """The id of the user's session whose id starts with ``prefix`` (≥ 4 characters), or
        ``None`` — the same answer whether the session is someone else's or does not exist.
        ``%`` and ``_`` are characters, not ``LIKE`` wildcards (``/resume ____`` resumed the only
        session a user had)."""
        prefix = prefix.strip().lower()
        if len(prefix) < 4:
            return None
        with read_tx(self.engine) as conn:
            rows = conn.execute(select(_sessions.c.id).where(
                _sessions.c.owner_user_id == user_id,
                _sessions.c.id.startswith(prefix, autoescape=True))).scalars().all()
        return rows[0] if len(rows) == 1 else None

    def pending_count(self, key: str) -> int:
        """Messages waiting in the lane (``/status``)."""
        with read_tx(self.engine) as conn:
            return conn.execute(select(func.count()).select_from(_inbox).where(
                _inbox.c.session_key == key, _inbox.c.status == "pending")).scalar_one()

    def session_usage(self, session_id: str) -> SessionUsage:
        """What a session's stored model calls used (``/status``): each assistant row holds one
        call's reported figures, so the sums count every call once."""
        with read_tx(self.engine) as conn:
            row = conn.execute(select(func.count(), *usage_sums()).where(_messages.c.session_id == session_id)).first()
        assert row is not None
        return SessionUsage(int(row[0]), int(row[1]), int(row[2]), int(row[3]), float(row[4]))
