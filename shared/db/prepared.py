"""Statements compiled once and run on the driver's cursor.

SQLAlchemy's execution machinery (cache key, execution context, result set-up) costs about
0.1 ms of CPU per statement here; on the per-call write path that is most of the write. A
`Prepared` statement is compiled once for the engine's dialect, and each execution applies the
same bind processors SQLAlchemy would (JSON, DateTime, Boolean...), so rows are stored exactly
as the ORM stores them, on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Dialect, Executable
from sqlalchemy.dialects.sqlite import base as sqlite_base
from sqlalchemy.sql.compiler import SQLCompiler


class Prepared:
    """One statement compiled for one dialect. Inserts name their columns in `keys` (every
    column to set, so no Python-side default is needed); textual statements take their bind
    names from the text."""

    def __init__(
        self,
        statement: Executable,
        dialect: Dialect,
        keys: Sequence[str] | None = None,
        *,
        many: bool = True,
    ) -> None:
        compiled = statement.compile(  # type: ignore[attr-defined]
            dialect=dialect,
            column_keys=list(keys) if keys is not None else None,
            for_executemany=many,
        )
        assert isinstance(compiled, SQLCompiler)
        if compiled.insert_prefetch or compiled.update_prefetch:
            missing = [c.key for c in (*compiled.insert_prefetch, *compiled.update_prefetch)]
            raise ValueError(f"prepared statement leaves columns to Python defaults: {missing}")
        self.sql: str = compiled.string
        self.positional: bool = bool(compiled.positional)
        names = list(compiled.positiontup or []) if self.positional else list(compiled.binds)
        self.names: tuple[str, ...] = tuple(names)
        processors: dict[str, Callable[[Any], Any]] = {}
        for name in dict.fromkeys(names):
            bind = compiled.binds[name]
            impl = bind.type.dialect_impl(dialect)
            proc = impl.bind_processor(dialect)
            if proc is not None:
                processors[name] = _fast_datetime(impl, proc) or _last_value_memo(proc)
        self._processors = processors
        # Positional: every value fetched at once, then only the typed ones processed.
        self._get = operator.itemgetter(*names) if len(names) > 1 else None
        self._typed = tuple((i, processors[n]) for i, n in enumerate(names) if n in processors)

    def parameters(self, values: Mapping[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        """The driver's parameters for one row of `values` (bind name → Python value)."""
        if not self.positional:
            procs = self._processors
            return {n: procs[n](values[n]) if n in procs else values[n] for n in self.names}
        get = self._get
        row = list(get(values)) if get is not None else [values[n] for n in self.names]
        for i, proc in self._typed:
            row[i] = proc(row[i])
        return tuple(row)

    def execute(self, cursor: Any, values: Mapping[str, Any]) -> Any:
        """Execute for one row; returns the cursor (for a RETURNING statement's row)."""
        cursor.execute(self.sql, self.parameters(values))
        return cursor

    def execute_many(self, cursor: Any, rows: Iterable[Mapping[str, Any]]) -> None:
        params = [self.parameters(r) for r in rows]
        if len(params) == 1:
            cursor.execute(self.sql, params[0])
        elif params:
            cursor.executemany(self.sql, params)


# SQLAlchemy's storage format for a SQLite DATETIME, and the same with positional fields.
_SQLITE_DATETIME_FORMAT = (
    "%(year)04d-%(month)02d-%(day)02d %(hour)02d:%(minute)02d:%(second)02d.%(microsecond)06d"
)
_POSITIONAL_FORMAT = "%04d-%02d-%02d %02d:%02d:%02d.%06d"


def _fast_datetime(impl: Any, slow: Callable[[Any], Any]) -> Callable[[Any], Any] | None:
    """For a SQLite DATETIME in SQLAlchemy's default storage format, its bind processor
    (`slow`) with the fields formatted from a tuple instead of a dict (0.8 against 2.1 µs a
    value here; every call log row and event has one): the same text for every datetime,
    naive or aware (the offset ignored, as SQLAlchemy ignores it). Anything else (a date, a
    string, a subclass) goes through `slow`. None for any other type or format."""
    if not isinstance(impl, sqlite_base.DATETIME):
        return None
    if getattr(impl, "_storage_format", None) != _SQLITE_DATETIME_FORMAT:
        return None

    def process(value: Any) -> Any:
        if type(value) is datetime:
            return _POSITIONAL_FORMAT % (
                value.year,
                value.month,
                value.day,
                value.hour,
                value.minute,
                value.second,
                value.microsecond,
            )
        return slow(value)

    return process


def _last_value_memo(proc: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`proc` remembering its last argument (by identity) and result: the rows of one batch
    share their timestamp object, formatted once. The pair is swapped as one tuple, so threads
    sharing the statement never see a result paired with another value."""
    last: tuple[Any, Any] = (object(), None)

    def memo(value: Any) -> Any:
        nonlocal last
        seen, result = last
        if value is seen:
            return result
        result = proc(value)
        last = (value, result)
        return result

    return memo


class PreparedCache:
    """Prepared statements of one dialect, compiled on first use and kept by statement."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        # Keyed by identity: statements are module constants, kept alive by the entry.
        self._cache: dict[tuple[int, tuple[str, ...] | None, bool], tuple[Executable, Prepared]]
        self._cache = {}

    def get(
        self, statement: Executable, keys: Sequence[str] | None = None, *, many: bool = True
    ) -> Prepared:
        key = (id(statement), tuple(keys) if keys is not None else None, many)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = (
                statement,
                Prepared(statement, self._dialect, keys, many=many),
            )
        return entry[1]
