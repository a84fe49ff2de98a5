"""``AdminSessions``: admin logins in the database (table ``admin_sessions``), so a logout on one
gateway instance ends the session on every instance. Every call is a short transaction; call via
``Gateway.run_db``."""

from __future__ import annotations

import secrets
import time

from sqlalchemy import Engine, delete, insert, select, update

from gateway.store.db import read_tx, write_tx
from gateway.store.models import AdminSessionRow, table
from gateway.store.sql import retry_locked

_admin_sessions = table(AdminSessionRow)


class AdminSessions:
    """Create, check and revoke admin sessions on one engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @retry_locked
    def create(self, lifetime_s: float) -> str:
        """A new session valid for ``lifetime_s`` seconds; returns its random id (32 bytes,
        URL-safe). Expired rows are deleted on the way."""
        now = time.time()
        session_id = secrets.token_urlsafe(32)
        with write_tx(self.engine) as conn:
            conn.execute(delete(_admin_sessions).where(_admin_sessions.c.expires_at < now))
            conn.execute(insert(_admin_sessions).values(id=session_id, created_at=now, expires_at=now + lifetime_s))
        return session_id

    def active(self, session_id: str) -> bool:
        """Whether ``session_id`` exists, is not expired and was not revoked."""
        with read_tx(self.engine) as conn:
            row = conn.execute(select(_admin_sessions.c.expires_at, _admin_sessions.c.revoked_at)
                               .where(_admin_sessions.c.id == session_id)).first()
        return row is not None and row.revoked_at is None and row.expires_at > time.time()

    @retry_locked
    def revoke(self, session_id: str) -> bool:
        """Ends ``session_id`` (logout); ``False`` when it was unknown or already revoked."""
        with write_tx(self.engine) as conn:
            return conn.execute(update(_admin_sessions).where(
                _admin_sessions.c.id == session_id, _admin_sessions.c.revoked_at.is_(None))
                .values(revoked_at=time.time())).rowcount == 1
