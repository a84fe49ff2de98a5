"""Runs the statements every turn runs straight on the driver's cursor (SQLite, and PostgreSQL
through psycopg 3).

SQLAlchemy's ``Connection.execute`` of a statement built once (``gateway.store.prepared``) still
spends some 60 µs of Python per call (the compiled cache's lookup, an execution context,
parameter construction, event dispatch, a ``CursorResult``) against about 10 µs for the driver's
own ``execute`` on SQLite; a turn of a new chat runs some 40 of them. On PostgreSQL that Python was
a fifth of a turn's CPU (the round trips wait without it). ``execute`` compiles a statement once
per set of parameter names with SQLAlchemy (the same SQL text ``Connection.execute`` would send,
``?`` or ``%(name)s`` placeholders with psycopg's type casts, the same bind and result processing:
JSON columns through ``json_dumps``/``json_loads``, booleans) and afterwards only binds values and
runs the text on the transaction's own DBAPI connection. On PostgreSQL an ``INSERT`` returns its new
primary key with the ``RETURNING`` SQLAlchemy adds (SQLite: ``lastrowid``).

It falls back to ``Connection.execute`` (same result interface) where a plan cannot be made in
advance (other drivers; ``text()``; Python-side defaults computed per row; values rendered into
the SQL) and while the engine has statement listeners (``before_cursor_execute``/
``after_cursor_execute``: tracing instrumentation, tests counting statements), so they see every
statement. The SQLAlchemy connection keeps owning the transaction: ``BEGIN``, ``COMMIT`` and
``ROLLBACK`` go through it as before.
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Delete, Insert, Select, TextualSelect, Update
from sqlalchemy.sql import Executable as ClauseElement

from gateway.store.tx import Tx

_Processor = Callable[[Any], Any] | None


class _Plan:
    """One statement compiled for one set of parameter names: SQL text, its parameters in
    placeholder order with their bind processors and fixed values, and the result columns' names
    and types (``row`` is ``None`` for a statement that returns no rows); the types' result
    processors are made at the first run, from the driver's type codes in ``cursor.description``
    (PostgreSQL's numeric processors depend on them), and kept.
    ``placeholders``: the ``%(name)s`` names in ``binds``' order (``None``: ``?`` placeholders).
    ``returns_key``: an ``INSERT`` whose ``RETURNING`` gives its new primary key; ``key_param``: an
    ``INSERT`` given its primary key as this parameter (the new key is that value)."""

    __slots__ = ("binds", "dialect", "key_param", "multi", "placeholders", "processors", "returns_key", "row", "sql",
                 "types")

    def __init__(self, sql: str, binds: list[tuple[str, Any, _Processor]], names: list[str] | None,
                 types: list[Any], dialect: Any, *, placeholders: list[str] | None = None,
                 returns_key: bool = False, key_param: str | None = None) -> None:
        self.sql = sql
        self.key_param = key_param
        self.binds = binds
        self.placeholders = placeholders
        self.returns_key = returns_key
        self.types = types
        self.dialect = dialect
        self.processors: list[_Processor] | None = None if types and not returns_key else []
        self.row = _row_class(names) if names is not None and not returns_key else None
        self.multi: dict[int, tuple[str, list[str]] | None] = {}
        """``_multi_row``'s statements of this plan, by row count."""


class FastRow(tuple):
    """A result row: a tuple whose items are also attributes by column name (``row.payload``),
    as SQLAlchemy's ``Row`` (a ``collections.namedtuple`` per column list); ``_mapping`` gives
    ``{name: value}``."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))


_ROW_CLASSES: dict[tuple[str, ...], type[FastRow]] = {}


def _row_class(names: Sequence[str]) -> type[FastRow]:
    key = tuple(names)
    cls = _ROW_CLASSES.get(key)
    if cls is None:
        base = collections.namedtuple("Row", key, rename=True)  # type: ignore[misc]
        cls = _ROW_CLASSES[key] = type("FastRow", (base,), {"__slots__": (), "_mapping": FastRow._mapping})
    return cls


class FastResult:
    """What ``execute`` returns: the subset of SQLAlchemy's ``CursorResult`` the store uses
    (``first``, ``all``, ``scalar``, ``scalar_one``, ``scalar_one_or_none``, iteration,
    ``rowcount``, ``inserted_primary_key``)."""

    __slots__ = ("_lastrowid", "_rows", "rowcount")

    def __init__(self, rows: list[FastRow], rowcount: int, lastrowid: Any) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self._lastrowid = lastrowid

    def all(self) -> list[FastRow]:
        return self._rows

    def __iter__(self) -> Iterator[FastRow]:
        return iter(self._rows)

    def first(self) -> FastRow | None:
        return self._rows[0] if self._rows else None

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def scalar_one_or_none(self) -> Any:
        if len(self._rows) > 1:
            raise ValueError("more than one row")
        return self.scalar()

    def scalar_one(self) -> Any:
        if len(self._rows) != 1:
            raise ValueError(f"expected one row, got {len(self._rows)}")
        return self._rows[0][0]

    @property
    def inserted_primary_key(self) -> tuple[Any]:
        """The new row's primary key: the value given, else the integer one (SQLite ``lastrowid``;
        PostgreSQL: from ``RETURNING``)."""
        return (self._lastrowid,)


_DRIVERS = frozenset({"pysqlite", "psycopg"})
"""DBAPI drivers (``dialect.driver``) whose statements run planned; others through SQLAlchemy."""

MAX_PLANS = 512
"""Plans kept at most (statements x parameter-name sets); past it statements run through SQLAlchemy."""

_PLANS: dict[tuple[Any, ...], _Plan | None] = {}
_PLANS_LOCK = threading.Lock()
_EXPANDING: dict[tuple[Any, ...], tuple[str, ...]] = {}  # (statement, names) -> its expanding parameters
_KEEP: dict[int, ClauseElement] = {}


def _plan(conn: Connection, statement: ClauseElement, values: Mapping[str, Any]) -> _Plan | None:
    """Compiles ``statement`` for parameters named as ``values``' keys (and, for an expanding ``IN``
    parameter, for its list's length); ``None`` when it cannot run planned."""
    if not isinstance(statement, Select | Insert | Update | Delete | TextualSelect):
        return None  # a bare text(): its result columns are known only once it ran
    dialect = conn.dialect
    named = dialect.paramstyle != "qmark"
    if named and dialect.paramstyle != "pyformat":
        return None
    keys = set(values)
    compiled: Any = statement.compile(dialect=dialect, column_keys=sorted(keys))
    if compiled.insert_prefetch or compiled.update_prefetch:
        return None  # Python-side defaults computed per execution
    by_name = {name: bind for bind, name in compiled.bind_names.items()}  # rendered name -> parameter
    if any(bind.literal_execute or (bind.callable is not None and name not in keys) for name, bind in by_name.items()):
        return None  # rendered or computed per execution
    processors_in = {name: bind.type.dialect_impl(dialect).bind_processor(dialect) for name, bind in by_name.items()}
    sql, order = compiled.string, list(compiled.positiontup or by_name)
    fixed = {name: bind.value for name, bind in by_name.items() if name not in keys}
    expanded: dict[str, tuple[str, int]] = {}  # "b_ids_2" -> ("b_ids", 1): an element of a list given
    if any(bind.expanding for bind in by_name.values()):
        state = compiled.construct_expanded_state({k: v for k, v in values.items() if k in by_name})
        sql, order = state.statement, list(state.positiontup or state.parameters)
        for name, names in state.parameter_expansion.items():
            for index, element in enumerate(names):
                processors_in[element] = processors_in.get(name)
                if name in keys:
                    expanded[element] = (name, index)
                else:  # a list the statement carries itself: ``status IN ('claimed', 'sending')``
                    fixed[element] = state.parameters[element]
    binds: list[tuple[str, Any, _Processor]] = []
    for name in order:
        processor = processors_in.get(name)
        if name in expanded:
            binds.append((expanded[name][0], expanded[name][1], processor))
        elif name in keys:
            binds.append((name, _NO_VALUE, processor))
        elif name in fixed:
            binds.append((name, _Fixed(fixed[name]), processor))
        else:
            return None
    names = None
    types: list[Any] = []
    returns_key = isinstance(statement, Insert) and bool(getattr(compiled, "implicit_returning", None))
    key_param = None
    if isinstance(statement, Insert):
        primary = list(statement.table.primary_key.columns)  # type: ignore[attr-defined]
        if len(primary) == 1 and primary[0].key in keys:
            key_param = primary[0].key
    if compiled._result_columns:
        names = [entry[0] for entry in compiled._result_columns]
        types = [entry[3].dialect_impl(dialect) for entry in compiled._result_columns]
    return _Plan(sql, binds, names, types, dialect, placeholders=order if named else None, returns_key=returns_key,
                 key_param=key_param)


def _result_processors(plan: _Plan, description: Sequence[Any] | None) -> list[_Processor]:
    """The result processors of ``plan``'s columns for the driver's type codes (``[]`` when none
    converts anything), as SQLAlchemy makes them per result."""
    codes = [column[1] for column in description] if description else [None] * len(plan.types)
    processors = [kind.result_processor(plan.dialect, code) for kind, code in zip(plan.types, codes, strict=False)]
    return processors if any(p is not None for p in processors) else []


class _Fixed:
    """A value the statement carries itself (a literal in its WHERE clause, a column default)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_NO_VALUE = object()


def _planned(conn: Connection, statement: ClauseElement, values: Mapping[str, Any]) -> _Plan | None:
    """``statement``'s plan for parameters named as ``values``' keys (made at its first use), or
    ``None`` when it runs through SQLAlchemy: another driver, statement listeners on the engine,
    a statement that cannot be planned, or the plan cache full."""
    dispatch = conn.dispatch
    dbapi = conn.dialect.driver
    if dbapi not in _DRIVERS or dispatch.before_cursor_execute or dispatch.after_cursor_execute:
        return None  # (statement listeners: instrumentation sees every one)
    cache_key: tuple[Any, ...] = (id(statement), dbapi, frozenset(values))
    expanding = _EXPANDING.get(cache_key)
    if expanding is None:
        if len(_PLANS) >= MAX_PLANS:  # statements built per call were passed: not worth a plan each
            return None
        compiled: Any = statement.compile(  # type: ignore[attr-defined]
            dialect=conn.dialect, column_keys=sorted(values))
        with _PLANS_LOCK:  # kept alive with its entry: its id is never another statement's
            _KEEP[id(statement)] = statement
            expanding = _EXPANDING[cache_key] = tuple(name for bind, name in compiled.bind_names.items()
                                                      if bind.expanding and name in values)
    if expanding:  # a plan per length of each expanding list
        cache_key += tuple(len(values[name]) for name in expanding)
    plan = _PLANS.get(cache_key, _NO_VALUE)
    if plan is _NO_VALUE:
        if len(_PLANS) >= MAX_PLANS:  # statements built per call were passed: not worth a plan each
            return None
        with _PLANS_LOCK:
            plan = _PLANS.setdefault(cache_key, _plan(conn, statement, values))  # (one plan per key)
    assert plan is None or isinstance(plan, _Plan)
    return plan


def _bound(plan: _Plan, values: Mapping[str, Any]) -> list[Any] | dict[str, Any]:
    """``values`` as ``plan``'s driver parameters: in placeholder order, bind-processed."""
    args = []
    for name, how, processor in plan.binds:
        if how is _NO_VALUE:
            value = values[name]
        elif how.__class__ is int:
            value = values[name][how]
        else:
            value = how.value
        args.append(processor(value) if processor is not None else value)
    return args if plan.placeholders is None else dict(zip(plan.placeholders, args, strict=True))


def execute(conn: Connection, statement: ClauseElement, params: Mapping[str, Any] | None = None) -> Any:
    """Runs ``statement`` (built once, e.g. ``gateway.store.prepared``) with ``params`` in ``conn``'s
    transaction; returns a ``FastResult`` when planned, SQLAlchemy's ``CursorResult`` otherwise (both
    give ``first``/``all``/``scalar*``/``rowcount``/``inserted_primary_key``).

    Raises what the driver raises, as SQLAlchemy's exceptions (``OperationalError`` for a locked
    database, ``IntegrityError`` for a constraint), so callers' retries and handling see the same
    errors either way."""
    values = params or {}
    plan = _planned(conn, statement, values)
    if plan is None:
        return conn.execute(statement, dict(values))
    bound = _bound(plan, values)
    kept = isinstance(conn, Tx)  # the transaction's own cursor, kept for its next statement
    on: Any = conn.cursor if isinstance(conn, Tx) else conn.connection.driver_connection
    try:
        cursor = on.execute(plan.sql, bound)
    except Exception as exc:
        raise _translated(conn, exc, plan.sql, bound) from exc
    rows: list[FastRow] = []
    if plan.returns_key:
        key = cursor.fetchone()
        result = FastResult(rows, cursor.rowcount, values[plan.key_param] if plan.key_param is not None
                            else key[0] if key else None)
        if not kept:
            cursor.close()
        return result
    if plan.row is not None:
        raw = cursor.fetchall()
        procs = plan.processors
        if procs is None:
            procs = plan.processors = _result_processors(plan, cursor.description)
        if procs:
            raw = [tuple(p(v) if p is not None else v for p, v in zip(procs, r, strict=True)) for r in raw]
        cls = plan.row
        rows = [tuple.__new__(cls, r) for r in raw]
    new_key = values[plan.key_param] if plan.key_param is not None else getattr(cursor, "lastrowid", None)
    result = FastResult(rows, cursor.rowcount, new_key)
    if not kept:
        cursor.close()
    return result


def _translated(conn: Connection, exc: Exception, sql: str, args: list[Any] | dict[str, Any]) -> Exception:
    """The driver's exception as SQLAlchemy would raise it (``sqlalchemy.exc.DBAPIError`` subclasses)."""
    from sqlalchemy import exc as sa_exc

    dbapi = conn.dialect.loaded_dbapi
    if isinstance(exc, dbapi.Error):
        return sa_exc.DBAPIError.instance(sql, args, exc, dbapi.Error, dialect=conn.dialect)
    return exc


def execute_many(conn: Connection, statement: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
    """Runs ``statement`` (an ``INSERT`` or ``UPDATE`` built once) once per item of ``rows``, in
    order, in ``conn``'s transaction, its results discarded; every item names the same parameters.
    On PostgreSQL an ``INSERT ... VALUES`` of several rows is one multi-row statement
    (``_multi_row``: one round trip, the rows' serial keys ascending in their order); any other
    planned statement is the driver's ``executemany`` (sqlite3 steps one prepared statement;
    psycopg pipelines). Otherwise (statement listeners, another driver) SQLAlchemy's executemany.

    Raises as ``execute`` does (``IntegrityError`` for a refused row: the transaction must be rolled
    back, on PostgreSQL it is spoilt)."""
    if not rows:
        return
    plan = _planned(conn, statement, rows[0])
    if plan is None:
        conn.execute(statement, [dict(row) for row in rows])
        return
    bound = [_bound(plan, row) for row in rows]
    driver: Any = conn.driver if isinstance(conn, Tx) else conn.connection.driver_connection
    many = _multi_row(plan, len(rows)) if plan.placeholders is not None and len(rows) > 1 else None
    if many is not None:  # psycopg: one multi-row INSERT, one send and one wait
        sql, names = many
        flat: list[Any] = []
        for row in bound:
            assert isinstance(row, dict)  # (named placeholders: _multi_row made it)
            flat.extend(row[name] for name in names)
        import psycopg  # (only here: the driver is psycopg)

        try:
            with psycopg.RawCursor(driver) as raw:
                raw.execute(sql, flat)
        except Exception as exc:
            raise _translated(conn, exc, plan.sql, bound[0]) from exc
        return
    kept = isinstance(conn, Tx)
    on: Any = conn.cursor if isinstance(conn, Tx) else driver.cursor()
    try:
        on.executemany(plan.sql, bound)
    except Exception as exc:
        raise _translated(conn, exc, plan.sql, bound[0]) from exc
    finally:
        if not kept:
            on.close()


MULTI_ROW_COUNTS = 64
"""Row counts a plan keeps a multi-row statement for at most (a batch has at most 32)."""
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def _multi_row(plan: _Plan, count: int) -> tuple[str, list[str]] | None:
    """``plan``'s ``INSERT ... VALUES (%(a)s, %(b)s::JSONB) [RETURNING ...]`` (psycopg's named
    placeholders) as one ``INSERT`` of ``count`` rows with PostgreSQL's own ``$1, $2...``
    placeholders (run on a ``psycopg.RawCursor``: psycopg parses a statement's ``%s`` placeholders
    again on every run when it is longer than 4 KB, 1.2 ms for a batch's inbox rows), and the
    parameter names of a row in their order there; ``None`` for any other shape (the caller runs
    ``executemany``). The rows are inserted in their order, so a serial key ascends with them.
    Psycopg's ``executemany`` pipelines the rows (one round trip) but gives the interpreter lock up
    and takes it again several times a row, which costs a turn's worth of waiting each time hundreds
    of threads are runnable (a burst); one statement gives it up once."""
    if count in plan.multi:
        return plan.multi[count]
    made: tuple[str, list[str]] | None = None
    sql = plan.sql
    start = sql.find(" VALUES (")
    if sql.startswith("INSERT INTO ") and start > 0:
        depth, end = 0, -1
        for index in range(start + len(" VALUES "), len(sql)):
            depth += {"(": 1, ")": -1}.get(sql[index], 0)
            if depth == 0:
                end = index + 1
                break
        tail = sql[end:].strip() if end > 0 else "?"
        if end > 0 and (not tail or tail.startswith("RETURNING ")):
            group = sql[start + len(" VALUES "):end]
            names = _PLACEHOLDER.findall(group)
            if "%" not in _PLACEHOLDER.sub("", group) and "$" not in group:
                pieces = _PLACEHOLDER.split(group)[::2]  # the text around the placeholders
                width = len(names)
                groups = []
                for index in range(count):
                    numbered = [pieces[0]]
                    for at, piece in enumerate(pieces[1:], start=index * width + 1):
                        numbered += [f"${at}", piece]
                    groups.append("".join(numbered))
                made = (f"{sql[:start]} VALUES {', '.join(groups)}", names)
    if len(plan.multi) < MULTI_ROW_COUNTS:
        plan.multi[count] = made
    return made
