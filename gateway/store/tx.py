"""``Tx``: one short transaction on a pooled DBAPI connection, without a SQLAlchemy ``Connection``
unless a statement needs one.

A turn runs about a dozen short transactions. Through ``engine.connect()`` each one built a
SQLAlchemy ``Connection``, a ``RootTransaction`` and their event dispatch, and committed and
closed through them: about 35 µs of Python per transaction in a tight loop, some 0.1 ms in a busy
process, before any statement ran. ``Tx`` takes the connection from the engine's own pool
(``Engine.raw_connection``: the same pool size, overflow, timeout, recycling and invalidation) and
issues ``BEGIN`` (SQLite; psycopg begins implicitly), ``COMMIT`` and ``ROLLBACK`` on the driver.
Statements the store runs planned (``gateway.store.fast.execute``) go straight to the driver; any
other use (``tx.execute(select(...))``, ``tx.exec_driver_sql``, ...) builds a SQLAlchemy
``Connection`` on the same DBAPI connection the first time, so it runs inside the same
transaction with SQLAlchemy's full behaviour (its result objects, events, error wrapping).

Errors raised by the driver at ``BEGIN``/``COMMIT`` are SQLAlchemy's exceptions (``OperationalError``
for a locked database), as through a ``Connection``; a lost connection (the server restarted)
invalidates it and the pool's older connections, as SQLAlchemy does.
"""

from __future__ import annotations

import threading
from typing import Any, cast

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc


class Tx:
    """One transaction (see the module docstring). Offers ``engine``, ``dialect``, ``dispatch`` (the
    engine's: its statement listeners), ``connection`` (the pool's connection proxy, with
    ``driver_connection``) and ``driver`` (the DBAPI connection) directly; every other attribute of
    a SQLAlchemy ``Connection`` (``execute``, ``exec_driver_sql``, ``scalar``...) through the one
    built for this transaction on first use. Made by ``gateway.store.db.write_tx``/``read_tx``."""

    __slots__ = ("_cursor", "_sa", "autocommit", "connection", "dialect", "dispatch", "driver", "engine", "now")

    def __init__(self, engine: Engine, fairy: Any, now: bool = False, driver: Any = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect
        self.dispatch = engine.dispatch
        self.connection = fairy
        self.driver = driver if driver is not None else fairy.driver_connection
        self.now = now
        self.autocommit = False
        self._sa: Connection | None = None
        self._cursor: Any = None

    @property
    def cursor(self) -> Any:
        """The DBAPI cursor the planned statements of this transaction run on, made on first use and
        kept until the transaction ends (``gateway.store.fast.execute`` reads each result whole
        before the next statement): psycopg builds a cursor in some 20 µs, and a turn runs about
        thirty statements."""
        if self._cursor is None:
            self._cursor = self.driver.cursor()
        return self._cursor

    @property
    def sa(self) -> Connection:
        """The SQLAlchemy ``Connection`` on this transaction's DBAPI connection, built on first use
        and already in its transaction (SQLAlchemy's own ``begin`` emits nothing on these drivers),
        so what uses it (Alembic) never begins and commits one of its own; committed with the
        ``Tx``. Raises ``NotNow`` in a transaction of ``gateway.store.db.write_now`` (its connection
        is not the pool's: only planned statements run there)."""
        if self.now:
            raise NotNow("a statement that needs SQLAlchemy's Connection")
        if self._sa is None:
            self._sa = Connection(self.engine, connection=self.connection)
            self._sa.begin()
        return self._sa

    def execute(self, statement: Any, parameters: Any = None, **kwargs: Any) -> Any:
        """``Connection.execute`` in this transaction."""
        return self.sa.execute(statement, parameters, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sa, name)

    # -- lifecycle (``gateway.store.db``) ----------------------------------------------------
    def start(self, statement: str | None) -> None:
        """Starts the transaction: ``statement`` (``BEGIN`` / ``BEGIN IMMEDIATE`` on SQLite) on the
        driver; ``None`` where the driver begins by itself (psycopg)."""
        if statement is not None:
            try:
                self.driver.execute(statement)
            except Exception as exc:
                raise self.translated(exc, statement) from exc

    def finish(self) -> None:
        """Commits (through the SQLAlchemy connection when one took part, so it ends its own
        transaction too). Raises SQLAlchemy's exceptions."""
        if self._sa is not None and self._sa.in_transaction():
            self._sa.commit()  # the driver's COMMIT, SQLAlchemy's error handling
            return
        try:
            self.driver.commit()
        except Exception as exc:
            raise self.translated(exc, "COMMIT") from exc

    def abort(self) -> None:
        """Rolls back after a failure; a failure of the rollback itself is not raised (the original
        error is what the caller sees), but a lost connection is invalidated."""
        try:
            if self._sa is not None and self._sa.in_transaction():
                self._sa.rollback()
            else:
                self.driver.rollback()
        except Exception as exc:
            self.translated(exc, "ROLLBACK")

    def release(self) -> None:
        """Gives the connection back to the pool (dropped instead when it was invalidated), out of
        autocommit again (``TxScope``'s ``autocommit``)."""
        if self.autocommit:
            self.autocommit = False
            try:
                self.driver.autocommit = False
            except Exception:  # a lost connection: never hand it out again
                self.connection.invalidate()
        if self._cursor is not None:
            try:
                self._cursor.close()
            except Exception:  # a connection already lost: nothing to free
                pass
            self._cursor = None
        if self._sa is not None:
            self._sa.close()
        else:
            self.connection.close()

    def translated(self, exc: Exception, statement: str, args: Any = None) -> Exception:
        """The driver's exception as SQLAlchemy raises it (``DBAPIError`` subclasses); a lost
        connection is invalidated first, with the pool's older connections (SQLAlchemy's
        ``invalidate_pool_on_disconnect``)."""
        dbapi = self.dialect.loaded_dbapi
        if not isinstance(exc, dbapi.Error):
            return exc
        disconnect = self.dialect.is_disconnect(exc, self.driver, None)
        if disconnect:
            try:
                self.engine.pool._invalidate(self.connection, exc)
            except Exception:  # already invalidated or closed: nothing left to drop
                pass
        return sa_exc.DBAPIError.instance(statement, args, exc, dbapi.Error, dialect=self.dialect,
                                          connection_invalidated=disconnect)


class NotNow(Exception):
    """A call given to ``gateway.store.db.write_now`` cannot run on the calling thread now (the
    process's writer lock is taken, another process holds the database, or the call needs more than
    the store's planned statements); nothing was written: run it on the DB pool."""


class TxScope:
    """``with TxScope(engine, begin, lock) as tx``: takes ``lock`` (if any), a pooled connection and
    begins (``begin``: the SQLite ``BEGIN`` statement, ``None`` for psycopg); on leaving commits, or
    rolls back when the block raised or the commit failed (the error goes on), then gives the
    connection back and releases ``lock``. A plain class rather than a generator context manager:
    it runs a dozen times per turn.

    ``autocommit`` (psycopg only, with ``begin`` ``None``): the connection is put in autocommit for
    the block, so each statement is its own transaction: for a block of one statement, one round
    trip instead of three (psycopg sends ``BEGIN`` before the first statement and the commit is one
    more); psycopg's commit and rollback do nothing then. Back out of autocommit before the pool has
    it again."""

    __slots__ = ("_autocommit", "_begin", "_engine", "_lock", "_tx")

    def __init__(self, engine: Engine, begin: str | None, lock: threading.RLock | None,
                 autocommit: bool = False) -> None:
        self._engine = engine
        self._begin = begin
        self._lock = lock
        self._autocommit = autocommit
        self._tx: Tx | None = None

    def __enter__(self) -> Connection:
        """The ``Tx``, typed as the SQLAlchemy ``Connection`` whose interface it offers."""
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            engine = self._engine
            try:
                fairy = engine.raw_connection()
            except engine.dialect.loaded_dbapi.Error as exc:  # could not connect: SQLAlchemy's exception
                Connection._handle_dbapi_exception_noconnection(exc, engine.dialect, engine)
                raise
            tx = Tx(engine, fairy)
            try:
                if self._autocommit:
                    tx.autocommit = True
                    try:
                        tx.driver.autocommit = True
                    except Exception as exc:  # a connection known lost: SQLAlchemy's error, invalidated
                        raise tx.translated(exc, "SET autocommit") from exc
                tx.start(self._begin)
            except BaseException:
                tx.release()
                raise
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        self._tx = tx
        return cast(Connection, tx)

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        tx = self._tx
        assert tx is not None
        try:
            if kind is None:
                try:
                    tx.finish()
                except BaseException:
                    tx.abort()  # the connection goes back clean
                    raise
            else:
                tx.abort()
        finally:
            self._tx = None
            try:
                tx.release()
            finally:
                if self._lock is not None:
                    self._lock.release()


class NowScope:
    """The transaction of a ``gateway.store.db.write_now`` call, on its own connection (the caller
    holds the process's writer lock): ``BEGIN IMMEDIATE`` (``NotNow`` when another process holds
    the database: the connection's busy timeout is 0), then commit or roll back; the connection is
    kept, not given back."""

    __slots__ = ("_driver", "_engine", "_fairy", "_tx")

    def __init__(self, engine: Engine, fairy: Any, driver: Any) -> None:
        self._engine = engine
        self._fairy = fairy
        self._driver = driver
        self._tx: Tx | None = None

    def __enter__(self) -> Connection:
        tx = Tx(self._engine, self._fairy, now=True, driver=self._driver)
        try:
            tx.driver.execute("BEGIN IMMEDIATE")
        except self._engine.dialect.loaded_dbapi.OperationalError as exc:
            raise NotNow(f"the database is busy ({exc})") from exc
        self._tx = tx
        return cast(Connection, tx)

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        tx = self._tx
        assert tx is not None
        self._tx = None
        if kind is None:
            try:
                tx.finish()
            except BaseException:
                tx.abort()
                raise
        else:
            tx.abort()
