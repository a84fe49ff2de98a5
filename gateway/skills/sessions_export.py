"""Reading a session back for ``gateway sessions export`` (operator tools, not the hot path)."""

from __future__ import annotations

from sqlalchemy import Engine, select

from gateway.store.db import read_tx
from gateway.store.models import SessionRow, table

_sessions = table(SessionRow)


def find_sessions(engine: Engine, prefix: str) -> list[str]:
    """Ids of the sessions whose id starts with ``prefix`` (case-insensitive; at most 10; ``%`` and
    ``_`` are characters, not ``LIKE`` wildcards)."""
    prefix = prefix.strip().lower()
    if not prefix:
        return []
    with read_tx(engine) as conn:
        return list(conn.execute(select(_sessions.c.id).where(_sessions.c.id.startswith(prefix, autoescape=True))
                                 .order_by(_sessions.c.id).limit(10)).scalars())
