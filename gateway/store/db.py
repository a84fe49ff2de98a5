"""Engine creation, transactions and migrations. Each capability keeps its own SQL next to it
(``gateway/scheduler/store.py``, ``gateway/memory/store.py``...); every table is in ``models``.

SQLite: WAL journal, ``synchronous=NORMAL``, a busy timeout, and ``BEGIN IMMEDIATE`` for write
transactions so two writers queue on the lock instead of failing on a read->write upgrade.
PostgreSQL: a plain pooled engine (psycopg 3).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

from gateway.store.tx import NotNow, NowScope, Tx, TxScope

MIGRATIONS_DIR = Path(__file__).parent / "migrations"

T = TypeVar("T")


def json_dumps(value: Any) -> str:
    """JSON columns' serializer: orjson (several times faster than ``json`` on the payloads, metas
    and addresses every turn writes), compact, non-ASCII kept as UTF-8, NaN and infinities as
    ``null`` (PostgreSQL's JSON has no NaN); ``json.dumps`` for what orjson refuses (integers beyond
    64 bits, keys of mixed types)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(value)


def json_loads(text: str | bytes) -> Any:
    """JSON columns' deserializer: orjson, falling back to ``json.loads`` (what ``json_dumps``
    wrote through its fallback)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def create_db_engine(url: str, pool_size: int = 10) -> Engine:
    """Builds the engine for ``url``; creates the SQLite file's folder if needed.

    ``pool_size`` (``database.pool_size``): up to twice as many connections, opened as load needs
    them and kept open afterwards (recycled after 30 minutes), on PostgreSQL and on an SQLite file
    alike; a caller waiting longer than 30 s for one gets ``sqlalchemy.exc.TimeoutError``. None is
    closed when given back: SQLAlchemy closes an overflow connection (``max_overflow``) once the
    pool holds ``pool_size`` idle ones, and under a burst's uneven load PostgreSQL connections were
    opened and closed all along (measured: a 1,000-chat burst's last reply 0.2-0.4 s later, 0.15-0.3
    ms more CPU a turn; a new PostgreSQL connection forks a server process). Every store call holds a
    connection only for its own short transaction, never across a model or tool call, so a pool
    much smaller than ``agent.worker_threads`` serves all turns in flight.
    """
    parsed = make_url(url)
    # Every connection is used through ``write_tx``/``read_tx``, whose transaction is committed or
    # rolled back before the connection goes back: the pool's own ROLLBACK on return (a round trip
    # per transaction) would find nothing to reset.
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_size=2 * pool_size, max_overflow=0, pool_recycle=1800,
                             pool_reset_on_return=None, json_serializer=json_dumps, json_deserializer=json_loads)
    pool: dict[str, int] = {}
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        pool = {"pool_size": 2 * pool_size, "max_overflow": 0}
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, pool_reset_on_return=None,
                           json_serializer=json_dumps, json_deserializer=json_loads, **pool)

    if pool:  # a file: several connections, one writer at a time (":memory:" has one connection)
        _WRITERS[engine] = threading.RLock()

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # write_tx and read_tx issue BEGIN themselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=5000")
        cur.close()

    return engine


_WRITERS: weakref.WeakKeyDictionary[Engine, threading.RLock] = weakref.WeakKeyDictionary()
"""SQLite engine -> the lock its write transactions take in this process (see ``write_tx``)."""


def write_tx(engine: Engine) -> TxScope:
    """A write transaction (``BEGIN IMMEDIATE`` on SQLite), committed on success, rolled back on an
    exception (which is re-raised): ``with write_tx(engine) as tx: ...``. ``tx`` is a
    ``gateway.store.tx.Tx``: the store's planned statements run on its driver connection, anything
    else through the SQLAlchemy ``Connection`` API it offers. Raises SQLAlchemy's exceptions
    (``OperationalError`` when SQLite's busy timeout ran out, ``sqlalchemy.exc.TimeoutError`` when
    no pooled connection came within 30 s).

    SQLite has one writer at a time: on an SQLite engine (``create_db_engine``) this process's
    writers first queue on a lock, so a burst of turns waits in line instead of each polling the
    database lock through SQLite's busy handler (every poll takes the interpreter lock: hundreds
    of them starved the event loop's own inbox writes, and cost CPU). Writers of other processes
    still meet the busy timeout."""
    if getattr(_NOW, "engine", None) is engine:
        return _now_scope(engine)  # type: ignore[return-value]  # the same interface
    return TxScope(engine, "BEGIN IMMEDIATE" if engine.dialect.name == "sqlite" else None, _WRITERS.get(engine))


def write_one(engine: Engine) -> TxScope:
    """``write_tx`` for a transaction of exactly one statement (a delivery mark): on PostgreSQL the
    statement runs in autocommit, its own transaction, in one round trip instead of three (no
    ``BEGIN``, no ``COMMIT``); elsewhere it is ``write_tx``. A second statement in the block would
    be committed apart from the first: use ``write_tx`` for more than one."""
    if engine.dialect.name == "postgresql":
        return TxScope(engine, None, None, autocommit=True)
    return write_tx(engine)


def read_one(engine: Engine) -> TxScope:
    """``read_tx`` for a read of exactly one statement (a turn's memory search): on PostgreSQL
    in autocommit, one round trip instead of three; elsewhere ``read_tx``. Several statements in
    the block would each read their own snapshot: use ``read_tx`` for more than one."""
    if engine.dialect.name == "postgresql":
        return TxScope(engine, None, None, autocommit=True)
    return read_tx(engine)


def read_tx(engine: Engine) -> TxScope:
    """A read-only transaction (deferred ``BEGIN`` on SQLite: WAL readers never wait on writers);
    see ``write_tx`` for what it yields and raises."""
    if getattr(_NOW, "engine", None) is engine:
        raise NotNow("a read (the pool's connections may all be in use)")
    return TxScope(engine, "BEGIN" if engine.dialect.name == "sqlite" else None, None)


_NOW = threading.local()
"""``engine``: the engine whose ``write_now`` call runs on this thread (``None``: none)."""
_NOW_CONNECTIONS: weakref.WeakKeyDictionary[Engine, Any] = weakref.WeakKeyDictionary()
"""SQLite engine -> the connection of its ``write_now`` transactions (detached from the pool):
``(pool proxy, DBAPI connection)``."""


def write_now(engine: Engine, fn: Callable[..., T], *args: Any) -> tuple[bool, T | None]:
    """Runs ``fn(*args)``, which makes one write transaction with the store's planned statements
    (``Inbound._admit``, ``Store.mark_sending``, ``mark_sent``...), on the calling thread when
    that never waits: ``(True, its result)``; ``(False, None)``, with nothing written, when it would
    have to (the caller then runs it on the DB pool).

    Used by the main loop for the admit of a message addressed to the bot and for a reply's delivery
    marks, which otherwise cost a thread hop each way. It never waits: only on an SQLite file
    engine, only when this process's writer lock is free (taken without blocking and held
    throughout, so no other writer of the process runs meanwhile), on a connection of its own (not
    the pool's, which may all be in use) whose busy timeout is 0 (a lock another process holds is
    not waited for) and which never checkpoints the WAL (the pool's connections do; a checkpoint may
    sync the disk). A read, a second transaction or a statement that is not planned is not run here
    (``NotNow``: rolled back, then the pool).
    Errors of ``fn`` are raised as usual."""
    lock = _WRITERS.get(engine)
    if lock is None or getattr(_NOW, "engine", None) is not None or not lock.acquire(blocking=False):
        return False, None
    try:
        _NOW.engine, _NOW.used = engine, False
        try:
            return True, fn(*args)
        except NotNow:
            return False, None
        finally:
            _NOW.engine = None
    finally:
        lock.release()


def close_now_connection(engine: Engine) -> None:
    """Closes ``engine``'s ``write_now`` connection, if it has one (the gateway's stop, with
    ``engine.dispose()``)."""
    found = _NOW_CONNECTIONS.pop(engine, None)
    if found is not None:
        found[0].close()


def _now_scope(engine: Engine) -> NowScope:
    if _NOW.used:
        raise RuntimeError("write_now runs one transaction per call")
    _NOW.used = True
    found = _NOW_CONNECTIONS.get(engine)
    if found is None:
        fairy = engine.raw_connection()
        driver = fairy.driver_connection
        fairy.detach()  # ours from now on: the pool neither counts nor hands it out
        assert driver is not None
        cursor = driver.cursor()
        cursor.execute("PRAGMA busy_timeout=0")
        cursor.execute("PRAGMA wal_autocheckpoint=0")
        cursor.close()
        found = _NOW_CONNECTIONS[engine] = (fairy, driver)
    return NowScope(engine, *found)


def sa_connection(conn: Connection) -> Connection:
    """The SQLAlchemy ``Connection`` of a ``write_tx``/``read_tx`` transaction, for what needs the
    real class (Alembic's migration context): already in that transaction, committed with it."""
    return conn.sa if isinstance(conn, Tx) else conn


MIGRATION_LOCK_ID = 0x6761_7465  # PostgreSQL advisory lock key: instances migrate one at a time


def upgrade(engine: Engine) -> None:
    """Applies every Alembic migration not yet applied (``alembic upgrade heads``).

    Several instances may start at once against one database: the migration runs in one
    transaction that first takes a lock (PostgreSQL advisory lock, SQLite ``BEGIN IMMEDIATE``),
    so the others wait and then find nothing left to do.
    """
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with write_tx(engine) as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_ID})")
        cfg.attributes["connection"] = sa_connection(conn)  # in this transaction: the lock's
        command.upgrade(cfg, "heads")  # every branch: parallel work may add heads before it is chained
