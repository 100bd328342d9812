"""Handlers of the "analysis" system tools: load_dataset (a CSV/Parquet file inside the data roots
into a conversation dataset), preview_data, describe_entry and query (read-only DuckDB SQL over
the conversation's datasets). Each is a sync `(inputs, context)` handler run in a worker thread;
recoverable mistakes raise HintException, real failures raise the exceptions below.

All four are tabular under the Uniform Tool Contract. load_dataset, preview_data and query are
spec-only (`migrate_tool`: they return a ToolResult, and the registry wraps them);
describe_entry is source-decorated (`@uniform_contract`: it returns Ok, and a direct caller gets
the envelope — a Hint rather than a raised HintException)."""

from __future__ import annotations

import bz2
import codecs
import csv
import datetime
import decimal
import difflib
import functools
import gzip
import io
import itertools
import json
import logging
import lzma
import os
import re
import selectors
import stat
import sys
import threading
import time
import unicodedata
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from services.registry.context import (
    CallCancelled,
    DatasetInfo,
    ToolContext,
    call_cancellation,
    raise_if_cancelled,
)
from services.registry.datasets import dataframe_to_arrow, unique_names
from shared.arrow_ipc import exact_unsigned_lists, integer_lists_as_lists
from shared.config import Settings
from shared.contract import (
    Alternative,
    ColumnSpec,
    Envelope,
    HintException,
    Ok,
    ToolResult,
    Warning,
    envelope_to_tool_result,
    measure_schema,
    migrate_tool,
    uniform_contract,
)
from shared.convert import clip

logger = logging.getLogger(__name__)

IDENTIFIER_RE = re.compile(r"[a-z_][a-z0-9_]*")
MAX_IDENTIFIER_LENGTH = 64

PREVIEW_DEFAULT_LIMIT = 10
PREVIEW_MAX_LIMIT = 200
QUERY_DEFAULT_LIMIT = 1000
QUERY_MAX_LIMIT = 10_000
QUERY_TIMEOUT_CAP_S = 60.0
QUERY_BATCH_ROWS = 8192
# The most a query returns without save_as (its rows travel in the result and the event log).
QUERY_MAX_RESULT_BYTES = 16 * 1024 * 1024
DUCKDB_CONFIG: dict[str, Any] = {
    "enable_external_access": False,
    "threads": 2,
    "memory_limit": "1GB",
    # No spilling to disk: with file access off, DuckDB still wrote what did not fit in memory
    # to `.tmp` in the service's working directory (up to 90% of the free disk by default), and
    # showed that path to any query. Over memory_limit is an Err the model can act on instead.
    "temp_directory": "",
}
# Statement types DuckDB reports for reads: SELECT covers WITH, VALUES, FROM-first, SHOW,
# DESCRIBE and SUMMARIZE.
READ_STATEMENT_TYPES = frozenset({"SELECT", "EXPLAIN"})

MAX_WALK_FILES = 2000
# Significant digits a float64 always keeps.
FLOAT_DIGITS = 15
MAX_ALTERNATIVES = 5
MIN_SUGGESTION_SCORE = 0.3
CSV_SUFFIXES = frozenset({".csv", ".tsv", ".txt"})
PARQUET_SUFFIXES = frozenset({".parquet", ".pq"})
EXCEL_SUFFIXES = frozenset({".xlsx", ".xlsm"})
ODS_SUFFIXES = frozenset({".ods"})
XLS_SUFFIXES = frozenset({".xls"})
# Read as spreadsheets (format "excel"): workbooks with openpyxl, OpenDocument and Excel 97-2003
# (BIFF in an OLE compound file) with calamine.
SPREADSHEET_SUFFIXES = EXCEL_SUFFIXES | ODS_SUFFIXES | XLS_SUFFIXES
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
# SQLite databases: one table of one loaded (`table`), read through the file already opened.
SQLITE_SUFFIXES = frozenset({".sqlite", ".sqlite3", ".db", ".db3"})
SQLITE_MAGIC = b"SQLite format 3\x00"
JSON_SUFFIXES = frozenset({".json", ".jsonl", ".ndjson"})
# The compressions DuckDB's JSON reader decompresses (a path in /proc has no extension to say).
JSON_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
JSON_MIN_OBJECT_BYTES = 16 << 20  # DuckDB's default maximum_object_size
JSON_MEMORY_FACTOR = 4  # DuckDB's memory limit for a JSON read: this many times the largest value
COMPRESSION_SUFFIXES = frozenset({".gz", ".bz2", ".zip", ".xz", ".zst"})
DELIMITER_ALIASES = {"\\t": "\t", "tab": "\t", "\\|": "|"}
MAX_MESSAGE_LINES = 6
MAX_MESSAGE_CHARS = 800
MAX_PATH_ECHO_CHARS = 200
# A header cell longer than this is not a column name: the file has no line breaks, or is not
# text (its "header" would be the whole file, in every schema line the model reads).
MAX_COLUMN_NAME_CHARS = 1024
READ_CHUNK_BYTES = 1 << 20
PARQUET_BATCH_ROWS = 65_536
# Bytes sampled from the start of a CSV to recognise a UTF-16/32 file without a byte order mark.
ENCODING_SAMPLE_BYTES = 4096
# Without an explicit delimiter, the separator is read off the file's first lines: the
# candidates in order of preference, the bytes sampled, and the records compared.
DELIMITER_CANDIDATES = (",", "\t", ";", "|")
DELIMITER_SAMPLE_BYTES = 64 * 1024
DELIMITER_SAMPLE_RECORDS = 100
# The share of sampled records that must have the header's number of fields.
DELIMITER_MIN_CONSISTENCY = 0.9
# Tried in order when the file has no byte order mark: cp1252 is what "not UTF-8" usually is
# (its € and curly quotes are C1 controls in Latin-1), Latin-1 decodes any byte sequence.
FALLBACK_ENCODINGS = ("utf-8", "cp1252", "latin-1")
_BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32"),
    (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)

FileFormat = Literal["csv", "parquet", "excel", "json", "sqlite"]
_Quoting = Literal[0, 1, 2, 3]  # csv.QUOTE_*


class PathOutsideDataRoots(Exception):
    """load_dataset was asked for a path that does not resolve inside the data roots."""


class QueryPermissionDenied(Exception):
    """DuckDB refused a file or system access the query attempted."""


class QueryTimeout(Exception):
    """The query ran past its time limit and was interrupted."""


class DatasetTooLarge(Exception):
    """A file (or a query result to save) is over the configured dataset size limit
    (TOOLMESH_MAX_DATASET_BYTES)."""


class QueryResultTooLarge(Exception):
    """The query's result could not be materialised (a batch over Arrow's or memory's limits)."""


# --------------------------------------------------------------------------------------------
# Shared helpers


def _ok(ok: Ok) -> ToolResult:
    return envelope_to_tool_result(ok)


def _str_input(inputs: dict[str, Any], key: str, *, required: bool) -> str | None:
    """A string input; None when absent (or blank and optional)."""
    value = inputs.get(key)
    if value is None:
        if required:
            raise HintException("schema", f"`{key}` is required")
        return None
    if not isinstance(value, str):
        raise HintException("schema", f"`{key}` must be a string, not {type(value).__name__}")
    if not value.strip():
        if required:
            raise HintException("schema", f"`{key}` must not be empty")
        return None
    return value


def _required_str(inputs: dict[str, Any], key: str) -> str:
    value = _str_input(inputs, key, required=True)
    assert value is not None
    return value


def _int_input(
    inputs: dict[str, Any],
    key: str,
    *,
    default: int,
    minimum: int,
    maximum: int | None,
    warnings: list[Warning],
) -> int:
    """An integer input: below `minimum` is a fetch hint, above `maximum` is capped (warned)."""
    raw = inputs.get(key)
    if raw is None:
        return default
    if isinstance(raw, bool):
        raise HintException("schema", f"`{key}` must be an integer, not a boolean")
    try:
        value = int(raw)
    except (TypeError, ValueError) as exc:
        raise HintException("schema", f"`{key}` must be an integer, not {raw!r}") from exc
    if value < minimum:
        raise HintException(
            "fetch",
            f"`{key}` must be at least {minimum}, not {value}",
            [{"label": f"{key}={minimum}", "score": 1.0, "action": "narrow"}],
        )
    if maximum is not None and value > maximum:
        warnings.append(
            Warning(
                kind="capped",
                message=f"{key} {value} is above the maximum; used {maximum}",
                details={"requested": value, "used": maximum},
            )
        )
        return maximum
    return value


def _score(a: str, b: str) -> float:
    return round(difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio(), 3)


def _ranked(
    candidates: Iterable[tuple[float, str, dict[str, Any]]],
    *,
    min_score: float = 0.0,
    limit: int = MAX_ALTERNATIVES,
) -> list[Alternative]:
    """The best `limit` candidates (score, label, details) at or above `min_score`."""
    best: dict[str, Alternative] = {}
    for score, label, details in candidates:
        if score >= min_score and (label not in best or best[label].score < score):
            best[label] = Alternative(label=label, score=score, details=details)
    return sorted(best.values(), key=lambda a: (-a.score, a.label))[:limit]


def _first_lines(exc: BaseException) -> str:
    lines = [line.rstrip() for line in str(exc).strip().splitlines()]
    text = "\n".join(line for line in lines[:MAX_MESSAGE_LINES])
    return text[:MAX_MESSAGE_CHARS]


@functools.cache
def _reserved_words() -> frozenset[str]:
    """DuckDB's reserved keywords: a dataset named like one could not be queried unquoted."""
    with duckdb.connect(":memory:", config={"enable_external_access": False}) as con:
        rows = con.sql(
            "SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category = 'reserved'"
        ).fetchall()
    return frozenset(str(row[0]).lower() for row in rows)


@functools.cache
def _keywords_that_may_need_quotes() -> frozenset[str]:
    """DuckDB's keywords that are not free to use as a column name everywhere (its reserved,
    type-or-function and column-name keywords: `order`, `at`, `left`, `time`…)."""
    with duckdb.connect(":memory:", config={"enable_external_access": False}) as con:
        rows = con.sql(
            "SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category <> 'unreserved'"
        ).fetchall()
    return frozenset(str(row[0]).lower() for row in rows)


def sanitize_identifier(text: str) -> str:
    """`text` as a dataset name `[a-z_][a-z0-9_]*`: accents folded, other characters to `_`,
    a leading digit prefixed with `t_`, a reserved SQL word suffixed with `_data`."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    name = re.sub(r"[^a-z0-9]+", "_", folded.lower()).strip("_")
    if not name:
        name = "dataset"
    if name[0].isdigit():
        name = f"t_{name}"
    name = name[:MAX_IDENTIFIER_LENGTH].rstrip("_")
    if name in _reserved_words():
        name = f"{name}_data"
    return name


def _check_identifier(value: str, key: str) -> str:
    if (
        IDENTIFIER_RE.fullmatch(value)
        and len(value) <= MAX_IDENTIFIER_LENGTH
        and value not in _reserved_words()
    ):
        return value
    suggestion = sanitize_identifier(value)
    reason = (
        "is a reserved SQL word"
        if value.lower() in _reserved_words()
        else "must be lowercase letters, digits and underscores, not starting with a digit, "
        f"at most {MAX_IDENTIFIER_LENGTH} characters"
    )
    raise HintException(
        "schema",
        f"{key} {value!r} is not a valid dataset name: it {reason}",
        [{"label": suggestion, "score": _score(value, suggestion)}],
    )


def _unknown_dataset(name: str, infos: Sequence[DatasetInfo]) -> HintException:
    if not infos:
        return HintException(
            "schema",
            f"no dataset named {name!r}: this conversation has no datasets yet; "
            "load a file with load_dataset first",
        )
    listed = ", ".join(info.name for info in infos[:20])
    more = f" and {len(infos) - 20} more" if len(infos) > 20 else ""
    return HintException(
        "schema",
        f"no dataset named {name!r}; this conversation's datasets are: {listed}{more}",
        _ranked((_score(name, info.name), info.name, {"rows": info.rows}) for info in infos),
    )


def _load_named(context: ToolContext, name: str) -> tuple[str, pd.DataFrame]:
    """The dataset called `name` (exactly, else case-insensitively when unambiguous)."""
    infos = context.list_datasets()
    exact = [info for info in infos if info.name == name]
    folded = [info for info in infos if info.name.lower() == name.lower()]
    matches = exact or (folded if len(folded) == 1 else [])
    if not matches:
        raise _unknown_dataset(name, infos)
    resolved = matches[0].name
    try:
        return resolved, context.load_dataset(resolved)
    except KeyError:  # removed between list and load
        raise _unknown_dataset(name, [info for info in infos if info.name != resolved]) from None


def sql_names(names: Sequence[object]) -> list[str]:
    """Column names as strings that differ even ignoring case, later repeats suffixed `_2`,
    `_3`, …: SQL folds the case of names, so of `Name` and `name` a query would read the first
    whichever it asked for."""
    return unique_names(names, fold_case=True)


def _sql_column_names(columns: Sequence[object], warnings: list[Warning]) -> list[str]:
    """sql_names() of `columns`, an empty name as `column_<position>` (SQL cannot name it:
    DuckDB calls it v0), and one warning naming those renamed."""
    blanks = [str(c) if str(c).strip() else f"column_{i + 1}" for i, c in enumerate(columns)]
    names = sql_names(blanks)
    renamed = [new for old, new in zip(columns, names, strict=True) if str(old) != new]
    if renamed:
        warnings.append(
            Warning(
                kind="duplicate_columns",
                message="column names that are empty or repeat (SQL ignores case) were renamed: "
                + ", ".join(renamed),
                details={"renamed": renamed},
            )
        )
    return names


def _sql_named_columns(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """`df` with _sql_column_names() for columns."""
    names = _sql_column_names(list(df.columns), warnings)
    if names != [str(c) for c in df.columns] or not all(isinstance(c, str) for c in df.columns):
        df.columns = pd.Index(names)
    return df


# --------------------------------------------------------------------------------------------
# load_dataset


def _max_dataset_bytes(context: ToolContext) -> int:
    if context.settings is None:
        return Settings.max_dataset_bytes
    return context.settings.max_dataset_bytes


# pandas' nullable integer types, for Arrow integer columns with nulls.
_NULLABLE_INTEGERS: dict[pa.DataType, Any] = {
    pa.int8(): pd.Int8Dtype(),
    pa.int16(): pd.Int16Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.int64(): pd.Int64Dtype(),
    pa.uint8(): pd.UInt8Dtype(),
    pa.uint16(): pd.UInt16Dtype(),
    pa.uint32(): pd.UInt32Dtype(),
    pa.uint64(): pd.UInt64Dtype(),
}


def _arrow_to_pandas(table: pa.Table, warnings: list[Warning] | None = None) -> pd.DataFrame:
    """`table` as a DataFrame; a column pandas has no type for (a UNION, …) as text. Integer
    columns with nulls stay integers (nullable): pandas makes them float64, which shows a count
    of 3 as 3.0 and rounds an id past 2**53 (Parquet from Spark, DuckDB or Arrow, and query
    results, carry no pandas metadata to say otherwise); lists of integers with nulls among
    them are Python lists (`[1, None, 3]`, not pandas' `[1.0, nan, 3.0]`), so they are stored,
    shown and queried as integers. Lists of uint64 with nulls among them become lists of int64,
    or of decimal(20, 0) past int64 (see exact_unsigned_lists), named in a warning added to
    `warnings`: as floats they were rounded past 2**53."""
    table, changed = exact_unsigned_lists(table)
    if changed and warnings is not None:
        listed = ", ".join(f"{name} ({kind})" for name, kind in changed.items())
        warnings.append(
            Warning(
                kind="unsigned_lists",
                message="lists of unsigned 64-bit integers with nulls among them are kept "
                f"exact as lists of signed integers, or of 20-digit decimals when a value is "
                f"past 2**63: {listed}",
                details={"columns": changed},
            )
        )
    return integer_lists_as_lists(table, _nullable_integers(table, _arrow_to_pandas_types(table)))


def _nullable_integers(table: pa.Table, df: pd.DataFrame) -> pd.DataFrame:
    """`df` (from `table`) with the integer columns pandas made float64 as nullable integers."""
    positions = {name: i for i, name in enumerate(table.column_names)}
    for position, name in enumerate(df.columns):
        source = positions.get(str(name))
        if source is None or not pd.api.types.is_float_dtype(df.iloc[:, position].dtype):
            continue
        column = table.column(source)
        if column.type in _NULLABLE_INTEGERS:
            df.isetitem(position, column.to_pandas(types_mapper=_NULLABLE_INTEGERS.get).array)
    return df


def _arrow_to_pandas_types(table: pa.Table) -> pd.DataFrame:
    try:
        return table.to_pandas()
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        pass  # ArrowInvalid: a nanosecond TIME, which pandas' time objects cannot hold
    except (TypeError, ValueError):
        # The file's pandas metadata names a dtype this pandas cannot rebuild (an Arrow-backed
        # dtype such as 'list<item: uint64>[pyarrow]', or one from another pandas version):
        # the Arrow types alone decide, as for a file written without pandas.
        logger.info("the file's pandas metadata is not usable here; ignoring it")
        table = table.replace_schema_metadata(None)
        try:
            return table.to_pandas()
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            pass
    columns: list[pa.Array | pa.ChunkedArray] = []
    for field, column in zip(table.schema, table.columns, strict=True):
        try:
            pa.table({"c": column}).to_pandas()
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            logger.info(
                "column %r of type %s has no pandas type; kept as text", field.name, field.type
            )
            try:  # Arrow's own text keeps what Python's objects cannot (nanoseconds)
                column = column.cast(pa.string())
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
                column = pa.array(
                    [None if v is None else str(v) for v in column.to_pylist()],
                    type=pa.string(),
                )
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names).to_pandas()


def _data_roots(context: ToolContext) -> list[Path]:
    if context.settings is None:
        raise RuntimeError("load_dataset needs settings (data_roots) in its context")
    roots: list[Path] = []
    for root in context.settings.data_roots:
        try:
            resolved = Path(root).resolve()
        except (OSError, RuntimeError):
            logger.warning("data root %s cannot be resolved; skipping it", root)
            continue
        if resolved not in roots:
            roots.append(resolved)
    if not roots:
        raise RuntimeError("no data roots are configured (TOOLMESH_DATA_ROOTS)")
    return roots


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _shown(raw: str) -> str:
    """A path as quoted back in a message: clipped (a path may be megabytes of input)."""
    return repr(clip(raw, MAX_PATH_ECHO_CHARS))


def _resolve(path: Path, raw: str) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # symlink loop, NUL byte, …
        raise HintException("schema", f"path {_shown(raw)} cannot be resolved: {exc}") from exc


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long, a component that is not a directory, …
        return False


def _resolve_input_path(raw: str, roots: Sequence[Path]) -> Path:
    """The resolved (symlink-free) path `raw` names; PathOutsideDataRoots when it is not inside
    a root. A relative path is taken against the first root, or against a later root that
    holds the file when the first does not."""
    if "\x00" in raw:
        raise HintException("schema", "path contains a NUL character")
    candidate = Path(raw)
    if candidate.is_absolute():
        resolved = _resolve(candidate, raw)
    else:
        resolved = _resolve(roots[0] / candidate, raw)
        if not _exists(resolved):
            for root in roots[1:]:
                other = _resolve(root / candidate, raw)
                if _exists(other) and _inside(other, roots):
                    resolved = other
                    break
    if not _inside(resolved, roots):
        logger.warning("load_dataset refused %r: resolves outside the data roots", raw[:1000])
        raise _outside(raw, roots)
    return resolved


def _outside(raw: str, roots: Sequence[Path]) -> PathOutsideDataRoots:
    allowed = ", ".join(str(root) for root in roots)
    return PathOutsideDataRoots(
        f"refused to read {_shown(raw)}: it resolves outside the allowed data directories "
        f"({allowed}); load_dataset only reads files inside them (symlinks are followed "
        "before checking)"
    )


def _opened_path(fd: int, fallback: Path) -> Path:
    """The path of the file `fd` is open on (Linux's /proc/self/fd), else `fallback`."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return fallback


def _open_regular(path: Path, raw: str, roots: Sequence[Path]) -> IO[bytes]:
    """`path` opened once for reading, and only if it is a regular file inside the roots.

    The check and the read are on the same open file: O_NOFOLLOW refuses a last component
    swapped for a symlink since it was resolved, and the file actually opened is checked
    against the roots again. O_NONBLOCK makes opening a named pipe return at once (it would
    otherwise wait for a writer, holding a worker thread forever); fstat then refuses it, a
    socket or a device (/dev/zero never ends) before a byte is read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise HintException(
            "schema",
            f"{_shown(raw)} does not exist in the data directories",
            _file_alternatives(raw, roots),
        ) from None
    except OSError as exc:
        raise HintException(
            "schema",
            f"{_shown(raw)} cannot be opened: {exc.strerror or exc}",
            _file_alternatives(raw, roots),
        ) from exc
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise HintException(
                "schema",
                f"{_shown(raw)} is a directory, not a file in the data directories",
                _file_alternatives(raw, roots),
            )
        if not stat.S_ISREG(mode):
            raise HintException(
                "schema",
                f"{_shown(raw)} is not a regular file (a named pipe, socket or device); "
                "load_dataset reads CSV and Parquet files only",
                _file_alternatives(raw, roots),
            )
        opened = _opened_path(fd, path)
        if not _inside(opened, roots):
            logger.warning("load_dataset refused %r: opened %s, outside the roots", raw, opened)
            raise _outside(raw, roots)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _format_suffixes(path: Path) -> list[str]:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSION_SUFFIXES:
        suffixes = suffixes[:-1]
    return suffixes


def _file_stem(path: Path) -> str:
    name = path.name
    for suffix in reversed(path.suffixes):
        low = suffix.lower()
        # A workbook's suffix only as the last one: workbooks are not read compressed.
        workbook = low in SPREADSHEET_SUFFIXES and name == path.name
        known = low in CSV_SUFFIXES or low in PARQUET_SUFFIXES or low in JSON_SUFFIXES
        if low in COMPRESSION_SUFFIXES or known or workbook:
            name = name[: -len(suffix)]
        else:
            break
    return name or path.name


def _supported(path: Path) -> bool:
    suffixes = _format_suffixes(path)
    if path.suffix.lower() in SPREADSHEET_SUFFIXES:
        return True
    last = suffixes[-1] if suffixes else ""
    return last in CSV_SUFFIXES or last in PARQUET_SUFFIXES or last in JSON_SUFFIXES


def _walk_files(roots: Sequence[Path], limit: int = MAX_WALK_FILES) -> list[Path]:
    """Up to `limit` loadable files under the roots (hidden entries skipped, links not
    followed into directories)."""
    found: list[Path] = []
    for root in roots:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for filename in sorted(filenames):
                if filename.startswith("."):
                    continue
                path = Path(dirpath) / filename
                if _supported(path) and path.is_file():
                    found.append(path)
                    if len(found) >= limit:
                        return found
    return found


def _path_label(path: Path, roots: Sequence[Path]) -> str:
    """How to name `path` in a later load_dataset call: relative to the first root if inside
    it, else absolute."""
    if path.is_relative_to(roots[0]):
        return path.relative_to(roots[0]).as_posix()
    return str(path)


def _file_alternatives(raw: str, roots: Sequence[Path]) -> list[Alternative]:
    wanted_name = Path(raw).name
    scored: list[tuple[float, str, dict[str, Any]]] = []
    for path in _walk_files(roots):
        label = _path_label(path, roots)
        score = max(_score(wanted_name, path.name), _score(raw, label))
        scored.append((score, label, {}))
    ranked = _ranked(scored, min_score=MIN_SUGGESTION_SCORE, limit=MAX_ALTERNATIVES * 2)
    safe: list[Alternative] = []
    for alt in ranked:
        target = Path(alt.label) if Path(alt.label).is_absolute() else roots[0] / alt.label
        try:
            if _inside(target.resolve(), roots):  # no symlinks pointing outside
                safe.append(alt)
        except (OSError, RuntimeError):
            continue
    return safe[:MAX_ALTERNATIVES]


SUPPORTED_FORMATS = (
    "load_dataset reads CSV text (.csv, .tsv, .txt, also compressed: .gz, .bz2, .xz, .zst or a "
    "one-file .zip), Parquet (.parquet, .pq), spreadsheets (.xlsx, .xlsm, .xls, .ods) and JSON "
    "(.json: an array of records, or a document holding one; .jsonl/.ndjson: a record per "
    "line; also .gz or .zst), and a table of a SQLite database (.sqlite, .sqlite3, .db)"
)
# Formats load_dataset does not read, by extension: what the file is, and what to do instead.
_EXCEL_ADVICE = "save the sheet as .xlsx or CSV (UTF-8) and load that"
_CONVERT_ADVICE = "convert it to CSV or Parquet and load that"
_JSON_ADVICE = "pass format='json' to read it as JSON"
_UNSUPPORTED_SUFFIXES: dict[str, tuple[str, str]] = {
    ".xlsb": ("an Excel binary workbook", _EXCEL_ADVICE),
    ".geojson": ("GeoJSON", _CONVERT_ADVICE),
    ".feather": ("an Arrow IPC (Feather) file", _CONVERT_ADVICE),
    ".arrow": ("an Arrow IPC (Feather) file", _CONVERT_ADVICE),
    ".orc": ("an ORC file", _CONVERT_ADVICE),
    ".avro": ("an Avro file", _CONVERT_ADVICE),
    ".sav": ("an SPSS data file", _CONVERT_ADVICE),
    ".dta": ("a Stata data file", _CONVERT_ADVICE),
    ".sas7bdat": ("a SAS data file", _CONVERT_ADVICE),
    ".h5": ("an HDF5 file", _CONVERT_ADVICE),
    ".hdf5": ("an HDF5 file", _CONVERT_ADVICE),
    ".pdf": ("a PDF document", "extract its tables to CSV and load that"),
}
PARQUET_MAGIC = b"PAR1"
# Formats load_dataset does not read, by their first bytes (a file whose name does not say,
# or one given format='csv'), which would otherwise be read as a one-column CSV of garbage.
_FOREIGN_FILE_MAGIC: tuple[tuple[bytes, str, str], ...] = (
    (
        OLE_MAGIC,
        "an Excel 97-2003 workbook (.xls) or another legacy Office file",
        "pass format='excel' (or name it .xls) to read it as a workbook",
    ),
    (b"ARROW1", "an Arrow IPC (Feather) file", _CONVERT_ADVICE),
    (SQLITE_MAGIC, "a SQLite database", "pass format='sqlite' (and table=...) to load a table"),
    (b"%PDF-", "a PDF document", "extract its tables to CSV and load that"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file", _CONVERT_ADVICE),
    (b"Obj\x01", "an Avro file", _CONVERT_ADVICE),
)
# The same, and what is not CSV once decompressed (a ZIP file or Parquet inside a gzip one).
_FOREIGN_MAGIC: tuple[tuple[bytes, str, str], ...] = (
    *_FOREIGN_FILE_MAGIC,
    (b"PK\x03\x04", "a ZIP archive (an Excel .xlsx workbook?) inside the file", _EXCEL_ADVICE),
    (
        PARQUET_MAGIC,
        "Parquet data in a compressed or truncated file",
        "load the uncompressed, complete .parquet file",
    ),
)
# Compressed data, by its first bytes: read so whatever the file is named.
_COMPRESSION_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b\x08", ".gz"),
    (b"\xfd7zXZ\x00", ".xz"),
    (b"\x28\xb5\x2f\xfd", ".zst"),
    (b"PK\x03\x04", ".zip"),
)
_BZIP2_MAGIC_RE = re.compile(rb"BZh[1-9]1AY&SY")


def _unsupported(name: str, what: str, advice: str) -> HintException:
    return HintException(
        "schema", f"{clip(name, MAX_PATH_ECHO_CHARS)!r} is {what}: {SUPPORTED_FORMATS}; {advice}"
    )


def _peek(opened: IO[bytes], size: int = 16) -> bytes:
    """The first `size` bytes of `opened`, which is left at its start."""
    opened.seek(0)
    head = opened.read(size)
    opened.seek(0)
    return head


def _is_parquet(opened: IO[bytes]) -> bool:
    """Whether `opened` is a Parquet file: it starts and ends with PAR1."""
    if not _peek(opened).startswith(PARQUET_MAGIC):
        return False
    try:
        opened.seek(-len(PARQUET_MAGIC), os.SEEK_END)
        return opened.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    except OSError:
        return False
    finally:
        opened.seek(0)


def _detect_format(
    path: Path, requested: str, opened: IO[bytes], warnings: list[Warning]
) -> FileFormat:
    """The format to read `opened` as: Parquet when its bytes are (whatever it is named or
    `requested` says, with a warning), else what `requested` or the extension says. A format
    load_dataset does not read (Excel, JSON…) is a schema Hint naming the ones it does."""
    formats = ("csv", "parquet", "excel", "json", "sqlite")
    if requested not in ("auto", *formats):
        raise HintException(
            "schema",
            f"format must be 'auto', 'csv', 'parquet', 'excel', 'json' or 'sqlite', not "
            f"{requested!r}",
            [{"label": f, "score": 0.5} for f in formats],
        )
    if requested == "sqlite" or (requested == "auto" and path.suffix.lower() in SQLITE_SUFFIXES):
        return "sqlite"
    suffixes = _format_suffixes(path)
    last = suffixes[-1] if suffixes else ""
    if requested != "excel" and _is_xlsx(opened):
        if requested != "auto" or path.suffix.lower() not in SPREADSHEET_SUFFIXES:
            said = f"format={requested!r}" if requested != "auto" else f"its name ({path.name!r})"
            warnings.append(
                Warning(
                    kind="format",
                    message=f"the file is an Excel workbook, though {said} says otherwise; "
                    "read as Excel",
                )
            )
        return "excel"
    if requested == "excel" or path.suffix.lower() in SPREADSHEET_SUFFIXES:
        return "excel"
    if requested == "json" or (requested == "auto" and last in JSON_SUFFIXES):
        return "json"
    if requested != "parquet" and _is_parquet(opened):
        if requested == "csv" or last in CSV_SUFFIXES:
            said = "format='csv'" if requested == "csv" else f"its name ({path.name!r})"
            warnings.append(
                Warning(
                    kind="format",
                    message=f"the file is Parquet, though {said} says CSV; read as Parquet",
                )
            )
        return "parquet"
    if requested in ("csv", "parquet"):
        return "csv" if requested == "csv" else "parquet"
    if last in CSV_SUFFIXES:
        return "csv"
    if last in PARQUET_SUFFIXES:
        return "parquet"
    if last in _UNSUPPORTED_SUFFIXES:
        raise _unsupported(path.name, *_UNSUPPORTED_SUFFIXES[last])
    head = _peek(opened)
    if requested == "auto" and head.startswith(SQLITE_MAGIC):  # whatever its name says
        return "sqlite"
    for magic, what, advice in _FOREIGN_FILE_MAGIC:
        if head.startswith(magic):
            raise _unsupported(path.name, what, advice)
    if path.suffix.lower() == ".zip" and not suffixes:
        member = _zip_member_suffix(opened, path)
        if member in CSV_SUFFIXES:
            return "csv"
    raise HintException(
        "fetch",
        f"cannot tell the format of {path.name!r} from its extension "
        f"({last or 'none'}); {SUPPORTED_FORMATS} — pass format if the file is one of those",
        [
            {"label": 'format="csv"', "score": 0.5, "action": "add"},
            {"label": 'format="parquet"', "score": 0.5, "action": "add"},
        ],
    )


def _is_xlsx(opened: IO[bytes]) -> bool:
    """Whether `opened` is an Office Open XML workbook (a ZIP archive with xl/workbook.xml)."""
    if not _peek(opened, 4).startswith(b"PK\x03\x04"):
        return False
    try:
        with zipfile.ZipFile(opened) as archive:
            return "xl/workbook.xml" in archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return False
    finally:
        opened.seek(0)


def _zip_member_suffix(opened: IO[bytes], path: Path) -> str:
    """The extension of the one file in the ZIP archive `opened` (`data.zip` holding
    `data.csv`), lowercased; "" when it holds another number of files or is not a ZIP."""
    try:
        with zipfile.ZipFile(opened) as archive:
            members = [info for info in archive.infolist() if not info.is_dir()]
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return ""
    finally:
        opened.seek(0)
    if len(members) != 1:
        return ""
    return Path(members[0].filename).suffix.lower()


def _delimiter(raw: str | None, path: Path) -> str | None:
    """The separator asked for, tab for a .tsv file, or None: to be read off the file."""
    if raw is None:
        return "\t" if ".tsv" in _format_suffixes(path) else None
    value = DELIMITER_ALIASES.get(raw.lower(), raw)
    if len(value) != 1 or value in {'"', "\n", "\r"}:
        raise HintException(
            "schema",
            f"delimiter must be a single character other than a quote or newline, not {raw!r}",
            [{"label": d, "score": 0.5} for d in (",", ";", "\\t", "|")],
        )
    return value


class _BoundedReader(io.RawIOBase):
    """A byte stream that raises DatasetTooLarge once more than `limit` bytes were read from
    it: the bound on what a (possibly compressed) file may expand to in memory."""

    def __init__(self, source: Any, limit: int, name: str) -> None:
        super().__init__()
        self._source = source
        self._limit = limit
        self._name = name
        self._count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        raise_if_cancelled()  # a cancelled call's load stops at the next chunk
        data = self._source.read(min(len(buffer), READ_CHUNK_BYTES))
        size = len(data)
        self._count += size
        if self._count > self._limit:
            raise _too_large(self._name, f"more than {self._limit} bytes", self._limit)
        buffer[:size] = data
        return size


def _too_large(name: str, what: str, limit: int) -> DatasetTooLarge:
    return DatasetTooLarge(
        f"{name!r} is too large to load: {what}, over the limit of {limit / 2**20:g} MiB "
        "(TOOLMESH_MAX_DATASET_BYTES); load a smaller extract of it"
    )


# What a corrupt or truncated compressed file raises while it is decompressed.
_DECOMPRESSION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,  # gzip.BadGzipFile, bz2's "Invalid data stream", pyarrow's IOError
    EOFError,
    zlib.error,
    lzma.LZMAError,
    zipfile.BadZipFile,
    pa.ArrowException,
)


class _Borrowed(io.RawIOBase):
    """`raw` for a reader that closes what it is given (pyarrow's PythonFile): closing this
    leaves `raw` open for the next attempt."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _compression_suffix(path: Path) -> bool:
    return bool(path.suffixes) and path.suffixes[-1].lower() in COMPRESSION_SUFFIXES


def _compression(raw: IO[bytes], path: Path) -> str:
    """How `raw` is compressed: by the last suffix of `path`, else by its first bytes (a
    gzip file saved as `data.csv`, as some downloads are); "" when it is not."""
    suffix = path.suffixes[-1].lower() if path.suffixes else ""
    if suffix in COMPRESSION_SUFFIXES:
        return suffix
    head = _peek(raw)
    for magic, sniffed in _COMPRESSION_MAGIC:
        if head.startswith(magic):
            return sniffed
    return ".bz2" if _BZIP2_MAGIC_RE.match(head) else ""


def _excel_archive(archive: zipfile.ZipFile) -> str | None:
    """What spreadsheet the ZIP archive is (an .xlsx or .ods file is one), else None."""
    names = set(archive.namelist())
    if "[Content_Types].xml" in names and any(n.startswith("xl/") for n in names):
        return "an Excel workbook (.xlsx)"
    if "mimetype" in names and b"spreadsheet" in archive.read("mimetype")[:100]:
        return "an OpenDocument spreadsheet (.ods)"
    return None


def _decompressing(raw: IO[bytes], path: Path) -> Any:
    """A reader of `raw`'s decompressed bytes, by the last suffix of `path` or its first
    bytes (see _compression)."""
    suffix = _compression(raw, path)
    if suffix == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if suffix == ".bz2":
        return bz2.BZ2File(raw)
    if suffix == ".xz":
        return lzma.LZMAFile(raw)
    if suffix == ".zst":  # pyarrow's codec: no zstandard package needed
        return pa.CompressedInputStream(pa.PythonFile(_Borrowed(raw), mode="r"), "zstd")
    if suffix == ".zip":
        archive = zipfile.ZipFile(raw)
        spreadsheet = _excel_archive(archive)
        if spreadsheet is not None:
            raise _unsupported(path.name, spreadsheet, _EXCEL_ADVICE)
        members = [info for info in archive.infolist() if not info.is_dir()]
        if len(members) != 1:
            listed = ", ".join(clip(info.filename, 80) for info in members[:5])
            raise HintException(
                "schema",
                f"{path.name!r} holds {len(members)} files"
                + (f" ({listed})" if members else "")
                + "; load_dataset reads a ZIP archive of exactly one CSV file",
            )
        return archive.open(members[0])
    return raw


def _sniff_encodings(sample: bytes) -> tuple[str, ...]:
    """The encodings to try, in order, for a CSV that starts with `sample`: the one its byte
    order mark names, UTF-16 when every other byte is NUL (ASCII text in UTF-16 without a
    BOM), else UTF-8 then the 8-bit fallbacks."""
    for bom, encoding in _BOMS:
        if sample.startswith(bom):
            return (encoding, *FALLBACK_ENCODINGS[1:])  # a bad BOM falls back to 8 bits
    if len(sample) >= 4:
        even, odd = sample[0::2], sample[1::2]
        if odd.count(0) > 0.4 * len(odd) and even.count(0) < 0.1 * len(even):
            return ("utf-16-le", *FALLBACK_ENCODINGS)
        if even.count(0) > 0.4 * len(even) and odd.count(0) < 0.1 * len(odd):
            return ("utf-16-be", *FALLBACK_ENCODINGS)
    return FALLBACK_ENCODINGS


def _without_implicit_index(df: pd.DataFrame, name: str, warnings: list[Warning]) -> pd.DataFrame:
    """Undo pandas' guess that rows with more fields than the header start with an index: it
    would shift every value one column to the left of its name and drop the first field. A
    trailing delimiter on every row (the extra fields all empty) is dropped with a warning;
    other extra fields are a schema Hint. (An implicit index that happens to be 0, 1, 2, … is
    indistinguishable from pandas' default one, and is not caught.)"""
    index = df.index
    if isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1:
        return df
    header = list(df.columns)
    extra = df.index.nlevels
    flat = df.reset_index(allow_duplicates=True)
    trailing = flat.iloc[:, len(header) :]
    if not trailing.isna().all().all():
        raise HintException(
            "schema",
            f"the data rows of {name!r} have {len(header) + extra} fields but the header names "
            f"{len(header)}; fix the header, or pass delimiter if the file uses another "
            "separator",
        )
    fixed = flat.iloc[:, : len(header)]
    fixed.columns = pd.Index(header)
    warnings.append(
        Warning(
            kind="trailing_delimiter",
            message="the rows end with an extra empty field (a trailing delimiter); dropped",
        )
    )
    return fixed


# How many of a column's first values a conversion that needs every value to match tries
# first: a column of words fails on them, without a pass over a million rows.
SAMPLE_VALUES = 256


def _sample(values: pd.Series) -> pd.Series:
    return values.head(SAMPLE_VALUES)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _all_text(values: pd.Series) -> bool:
    """Whether every one of `values` (none missing) is a str — pandas' C loop, not Python's."""
    return pd.api.types.infer_dtype(values, skipna=False) == "string"


# A column's conversion: (the column, its non-missing values) -> the new column, or None to
# leave it.
_ColumnRule = Callable[[pd.Series, pd.Series], Any]


def _convert_object_columns(
    df: pd.DataFrame,
    holds: Callable[[Any], bool],
    rule: _ColumnRule,
    warnings: list[Warning],
    warning: Warning | None = None,
) -> pd.DataFrame:
    """Apply `rule` to every column of Python objects (or strings) whose non-missing values
    all satisfy `holds`; name the columns it changed in `warning` (added to `warnings` with
    its message ending in their names) when there are any."""
    converted = []
    for position in range(df.shape[1]):
        col = df.iloc[:, position]
        if not (pd.api.types.is_string_dtype(col.dtype) or col.dtype == object):
            continue
        values = col.dropna()
        if values.empty:
            continue
        if not (_all_text(values) if holds is _is_text else all(holds(v) for v in values)):
            continue
        new = rule(col, values)
        if new is not None:
            df.isetitem(position, new)
            converted.append(str(df.columns[position]))
    if converted and warning is not None:
        details = {**warning.details, "columns": converted}
        message = warning.message + ", ".join(converted)
        warnings.append(Warning(kind=warning.kind, message=message, details=details))
    return df


def _huge_integers_as_text(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """Columns of integers beyond 64 bits (pandas keeps them as Python ints, which Arrow cannot
    store) as exact text, with a warning."""

    def is_int(value: Any) -> bool:
        # bool is an int to Python: a TRUE/FALSE column with blanks is not one of these.
        return type(value) is int

    def as_text(col: pd.Series, values: pd.Series) -> Any:
        return pd.array([None if pd.isna(v) else str(v) for v in col], dtype="str")

    warning = Warning("big_integers", "integers too large for 64 bits are kept as text in: ")
    return _convert_object_columns(df, is_int, as_text, warnings, warning)


def _nullable_booleans(df: pd.DataFrame) -> pd.DataFrame:
    """Columns of TRUE/FALSE with blanks (pandas keeps them as Python objects) as nullable
    booleans, so they are typed BOOLEAN in SQL and described as booleans."""

    def is_bool(value: Any) -> bool:
        return isinstance(value, bool)

    def as_booleans(col: pd.Series, values: pd.Series) -> Any:
        return col.astype("boolean").array

    return _convert_object_columns(df, is_bool, as_booleans, [])


def _without_empty_unnamed_last_column(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """Drop the last column when its header cell is empty and it holds nothing: the header
    and every row end with a delimiter (as spreadsheets export them), which would otherwise
    be a column of nulls named `column_<n>`. (The header is read as written, see
    _header_as_written: a column the file names `Unnamed: 3` is kept.)"""
    if df.shape[1] < 2:
        return df
    last = df.columns[-1]
    if (isinstance(last, str) and last.strip()) or not df.iloc[:, -1].isna().all():
        return df
    warnings.append(
        Warning(
            kind="trailing_delimiter",
            message="the header and rows end with an extra empty field (a trailing delimiter); "
            "dropped",
        )
    )
    return df.iloc[:, :-1]


# A number written with a leading zero (a ZIP or FIPS code, an account number): its zeros are
# part of the value, and reading it as a number would drop them.
_LEADING_ZERO_RE = r"^[+-]?0\d+$"
# The largest magnitude every integer up to which a float64 holds exactly.
MAX_EXACT_FLOAT_INTEGER = 2**53


def _may_have_leading_zeros(stream: IO[bytes], encoding: str, layout: _CsvLayout) -> bool:
    """Whether any field of the CSV file `stream` reads may start with a zero followed by a
    digit: a quick scan of the bytes (a tenth of reading the columns again as text), so that
    only the files that may hold such numbers pay for that. True for a UTF-16/32 file, whose
    bytes the scan cannot read."""
    if not codecs.lookup(encoding).name.startswith(("utf-8", "cp", "latin", "iso8859")):
        return True
    before = (
        re.escape(layout.delimiter.encode("latin-1"))
        + b'\n\r"'
        + (b" \t" if layout.initial_space else b"")
    )
    pattern = re.compile(b"[" + before + b"]0[0-9]")
    tail = b"\n"  # the first field of the file starts after a line break
    while chunk := stream.read(READ_CHUNK_BYTES):
        if pattern.search(tail + chunk):
            return True
        tail = chunk[-2:]
    return False


def _integral_columns(df: pd.DataFrame) -> list[int]:
    """Positions of the number columns whose values all are whole numbers: an integer column,
    or a float one (an integer column with blanks), the columns whose text may matter."""
    positions = []
    for position in range(df.shape[1]):
        col = df.iloc[:, position]
        if pd.api.types.is_bool_dtype(col.dtype):
            continue
        if pd.api.types.is_integer_dtype(col.dtype):
            positions.append(position)
        elif pd.api.types.is_float_dtype(col.dtype):
            values = col.dropna()
            if not values.empty and bool((values == values.round()).all()):
                positions.append(position)
    return positions


def _exact_integers(text: pd.Series) -> Any:
    """Text integers (some missing) as nullable int64, or as text past 64 bits."""
    try:
        return text.str.strip().astype("Int64").array
    except (OverflowError, ValueError, TypeError):  # past 64 bits
        return text.to_numpy()


def _numbers_as_written(
    df: pd.DataFrame,
    read_as_text: Callable[[list[int]], pd.DataFrame],
    may_have_leading_zeros: Callable[[], bool],
    warnings: list[Warning],
) -> pd.DataFrame:
    """Number columns whose text a number would change, as written: with a leading zero
    (ZIP codes: 01234 read as 1234) as text, named in a warning; and integers with blanks
    among them, which pandas makes float64 (a count of 10 shown as 10.0, and past 2**53
    rounded), as nullable integers (named in a warning when past 2**53). Needs the columns'
    text: `read_as_text` reads the given positions as strings, when `may_have_leading_zeros`
    or a column's blanks say it may matter."""
    positions = _integral_columns(df)
    if positions and not may_have_leading_zeros():
        positions = [
            position
            for position in positions
            if pd.api.types.is_float_dtype(df.iloc[:, position].dtype)
            and df.iloc[:, position].isna().any()
        ]
    if not positions:
        return df
    try:
        texts = read_as_text(positions)
    except (pd.errors.ParserError, ValueError) as exc:  # read once already: not expected
        logger.warning("could not re-read number columns as text: %s", exc)
        return df
    zeros: list[str] = []
    exact: list[str] = []
    for position, (_, text) in zip(positions, texts.items(), strict=True):
        col = df.iloc[:, position]
        stripped = text.dropna().str.strip()
        if stripped.str.fullmatch(_LEADING_ZERO_RE).any():
            df.isetitem(position, text.str.strip().to_numpy())
            zeros.append(str(df.columns[position]))
        elif (
            pd.api.types.is_float_dtype(col.dtype)
            and not stripped.empty
            and stripped.str.fullmatch(_INTEGER_RE).all()
        ):
            df.isetitem(position, _exact_integers(text))
            if col.abs().max() > MAX_EXACT_FLOAT_INTEGER:
                exact.append(str(df.columns[position]))
    if zeros:
        warnings.append(
            Warning(
                kind="leading_zeros",
                message="numbers written with leading zeros (codes such as ZIP codes) were kept "
                "as text to keep their zeros in: "
                + ", ".join(zeros)
                + "; CAST them in SQL to compute with them",
                details={"columns": zeros},
            )
        )
    if exact:
        warnings.append(
            Warning(
                kind="big_integers",
                message="integers too large for a float, among blanks, were kept exact "
                "(nullable integers) in: " + ", ".join(exact),
                details={"columns": exact},
            )
        )
    return df


def _check_column_names(df: pd.DataFrame, name: str) -> None:
    longest = max((len(str(c)) for c in df.columns), default=0)
    if longest > MAX_COLUMN_NAME_CHARS:
        raise HintException(
            "schema",
            f"the header of {name!r} has a column name of {longest} characters (at most "
            f"{MAX_COLUMN_NAME_CHARS}): the file has no line breaks or is not a CSV with a "
            "header row; pass delimiter if it uses another separator",
        )


def _sample_records(
    text: str, complete: bool, delimiter: str, quoting: _Quoting = csv.QUOTE_MINIMAL
) -> list[list[str]] | None:
    """The first DELIMITER_SAMPLE_RECORDS + 1 non-blank records of CSV text `text` (`complete`:
    the whole file) split by `delimiter` with CSV quoting (or `quoting`); a record the sample
    may have cut short is left out. None when csv cannot split it (a field over its size
    limit, a NUL)."""
    reader = csv.reader(io.StringIO(text), delimiter=delimiter, quoting=quoting)
    try:
        records = [r for r in itertools.islice(reader, DELIMITER_SAMPLE_RECORDS + 1) if r]
    except csv.Error:
        return None
    if not complete and len(records) <= DELIMITER_SAMPLE_RECORDS:
        records = records[:-1]  # the sample may end inside its last record
    return records


def _sniff_delimiter(text: str, complete: bool) -> str | None:
    """The separator of the CSV text `text` starts with (`complete`: it is the whole file), or
    None when no candidate fits better than the default comma.

    A candidate fits when it splits the header into two or more fields and at least
    DELIMITER_MIN_CONSISTENCY of the sampled records into as many; of those that fit, the one
    giving the most fields wins (ties by DELIMITER_CANDIDATES' order). Records are parsed with
    CSV quoting, so a separator inside a quoted value does not count; or, when that does not
    fit, without it (a quote that opens a value and never closes swallows the records after
    it: IMDb's TSV files)."""
    best: tuple[int, str] | None = None
    for candidate in DELIMITER_CANDIDATES:
        for quoting in (csv.QUOTE_MINIMAL, csv.QUOTE_NONE):
            records = _sample_records(text, complete, candidate, quoting)
            if records and len(records[0]) >= 2 and _consistent(records):
                width = len(records[0])
                if best is None or width > best[0]:
                    best = (width, candidate)
                break
    return None if best is None or best[1] == "," else best[1]


def _consistent(records: list[list[str]]) -> bool:
    """Whether at least DELIMITER_MIN_CONSISTENCY of the records after the first have as many
    fields as it has (or one more, empty: a trailing separator)."""
    width, rows = len(records[0]), records[1:]
    fitting = sum(len(r) == width or (len(r) == width + 1 and r[-1] == "") for r in rows)
    return fitting >= DELIMITER_MIN_CONSISTENCY * len(rows)


_NUMBER_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _first_record_is_data(records: list[list[str]]) -> bool:
    """Whether the first sampled record is a row of data rather than a header (the classic
    UCI files, iris.data or adult.data, have none): every column that holds numbers below it
    has a number in it too, and either all of it is numbers or at least half of its text
    values occur again in their columns below (a value, not a name). A header that passes
    (all-text columns whose names also appear as values) is taken for data: pass header=true."""
    if len(records) < 2:
        return False
    first, rows = [c.strip() for c in records[0]], records[1:]
    text_cells = repeated = 0
    for i, cell in enumerate(first):
        column = [r[i].strip() for r in rows if i < len(r) and r[i].strip()]
        numeric_column = bool(column) and all(_NUMBER_RE.fullmatch(v) for v in column)
        if _NUMBER_RE.fullmatch(cell):
            continue
        if numeric_column:
            return False  # a name over numbers: a header
        text_cells += 1
        repeated += cell in column
    return text_cells == 0 or (repeated > 0 and 2 * repeated >= text_cells)


def _spaced_after_separator(records: list[list[str]]) -> bool:
    """Whether every non-empty field after the first of every sampled record starts with a
    space (`39, State-gov, 77516`): the file separates its fields with the delimiter and a
    space, which is not part of the values."""
    seen = False
    for record in records:
        for field in record[1:]:
            if field:
                if not field.startswith(" "):
                    return False
                seen = True
    return seen


def _shown_delimiter(delimiter: str) -> str:
    return "\\t" if delimiter == "\t" else delimiter


def _detected_delimiter(text: str, complete: bool, warnings: list[Warning]) -> str:
    """The separator of a CSV file starting with `text` (`complete`: the whole file): a comma
    unless the first lines say otherwise, with a warning naming any other, so the caller knows
    what was assumed."""
    sniffed = _sniff_delimiter(text, complete)
    if sniffed is None:
        return ","
    _detected_delimiter_warning(sniffed, warnings)
    return sniffed


def _detected_delimiter_warning(delimiter: str, warnings: list[Warning]) -> None:
    warnings.append(
        Warning(
            kind="delimiter",
            message=f"fields are separated by {_shown_delimiter(delimiter)!r} (read off the "
            "file's first lines); pass delimiter to use another separator",
            details={"delimiter": delimiter},
        )
    )


# Lines of notes (a title, the source, a date) looked for above a table, and how many of them
# a warning quotes and keeps.
MAX_NOTE_LINES = 50
MAX_NOTES_SHOWN = 4
MAX_NOTES_KEPT = 20


def _blank_line(line: str) -> bool:
    """Whether `line` holds nothing but separators: a blank line, or a blank row as a
    spreadsheet saves it (`,,,,`)."""
    return not line.strip(" \t\r\n\ufeff" + "".join(DELIMITER_CANDIDATES))


def _filled(fields: Sequence[str]) -> int:
    return sum(bool(field.strip()) for field in fields)


def _padded_note(fields: Sequence[str]) -> bool:
    """Whether a record is a line of notes a spreadsheet padded to the table's width with
    empty fields (`"Data Source","World Development Indicators",,,`): three or more fields,
    of which only the first one or two hold anything."""
    return len(fields) >= 3 and _filled(fields[:2]) > 0 and _filled(fields[2:]) == 0


def _padded_notes_above(notes: list[list[str]], records: list[list[str]]) -> bool:
    """Whether `notes` (split records) are padded lines of notes (see _padded_note) above the
    table whose sampled records are `records`: its header fills most of its three or more
    fields and most of its rows fill more than the first two, which no note does; and no
    note fits the table as a row of it would (a number over a column of numbers: a data row
    with its last values missing, not a note)."""
    header, rows = records[0], records[1:]
    width = len(header)
    if width < 3 or _filled(header) <= 2 or 2 * _filled(header) < width or not rows:
        return False
    if 2 * sum(_filled(row) > 2 for row in rows) <= len(rows):
        return False
    numeric = [
        bool(column) and all(_NUMBER_RE.fullmatch(v) for v in column)
        for column in (
            [r[i].strip() for r in rows if i < len(r) and r[i].strip()] for i in range(2)
        )
    ]
    return all(
        _padded_note(fields)
        and not any(
            numeric[i] and _NUMBER_RE.fullmatch(field.strip()) for i, field in enumerate(fields[:2])
        )
        for fields in notes
    )


def _notes_above_table(
    lines: Sequence[str], complete: bool, delimiter: str | None
) -> tuple[int, str, list[str]] | None:
    """Where a table starts below lines of notes, as World Bank and national statistics
    offices export it (`"Data Source","World Development Indicators",`, a blank line,
    `"Last Updated Date","2024-06-28",`, a blank line, then the header): the number of lines
    before its header, its separator (`delimiter`, or the candidate giving the widest table)
    and the notes (the non-blank lines skipped). The header is the first line after a blank
    one (or one of separators only, `,,,`) such that the records from it on are consistent
    (see _consistent), it reads as a header rather than data, and every note above it has
    fewer fields than it, or they are all notes padded to its width as a spreadsheet saves
    them (see _padded_notes_above). None when there is no such line."""
    candidates = (delimiter,) if delimiter is not None else DELIMITER_CANDIDATES
    for i in range(1, min(len(lines), MAX_NOTE_LINES + 1)):
        if not _blank_line(lines[i - 1]) or _blank_line(lines[i]):
            continue
        notes = [line.strip() for line in lines[:i] if not _blank_line(line)]
        if not notes:
            continue  # only blank lines above: pandas skips those itself
        table = "".join(lines[i:])
        best: tuple[int, str] | None = None
        for candidate in candidates:
            records = _sample_records(table, complete, candidate)
            if not records or len(records) < 2 or len(records[0]) < 2:
                continue
            width = len(records[0])
            if (
                not _consistent(records)
                or _first_record_is_data(records)
                or (best is not None and width <= best[0])
            ):
                continue
            noted = [next(csv.reader([note], delimiter=candidate), []) for note in notes]
            if all(len(fields) < width for fields in noted) or _padded_notes_above(noted, records):
                best = (width, candidate)
        if best is not None:
            return i, best[1], notes
    return None


def _excel_separator(line: str) -> str | None:
    """The separator a first line `sep=;` names (Excel writes it, and reads it, to say which
    separator the file uses), else None."""
    match = re.fullmatch(r"\ufeff?sep=(.)\s*", line)
    return match.group(1) if match is not None and match.group(1) not in '"\r\n' else None


@dataclass(frozen=True)
class _CsvLayout:
    """How a CSV file is laid out, as far as its first lines tell."""

    delimiter: str
    header: bool  # the first row (after the preamble) names the columns
    preamble_lines: int  # '#' comment lines (and blank ones among them) before it
    initial_space: bool  # a space follows every separator


_MARKUP_STARTS = ("<!doctype html", "<html", "<?xml", "<head", "<body")


def _refuse_json(text: str, complete: bool, name: str) -> None:
    """A schema Hint when the text a CSV file starts with is JSON: an array of objects or
    arrays, or JSON Lines (a first line that is a JSON object), which read as CSV would be a
    table of fragments (`{"a":1`, `b:"x"}`)."""
    start = text.lstrip("\ufeff \t\r\n")
    if re.match(r"\[\s*[\[{]", start):
        raise _unsupported(name, "JSON (an array of records), not CSV", _JSON_ADVICE)
    if not start.startswith("{"):
        return
    first, newline, _ = start.partition("\n")
    if not newline and not complete:
        return  # one line longer than the sample: cannot tell
    try:
        record = json.loads(first)
    except ValueError:
        return
    if isinstance(record, dict):
        raise _unsupported(name, "JSON Lines (a JSON object per line), not CSV", _JSON_ADVICE)


def _csv_layout(
    text: str,
    *,
    complete: bool,
    delimiter: str | None,
    header: bool | None,
    name: str,
    warnings: list[Warning],
) -> _CsvLayout:
    """The layout of a CSV file whose first DELIMITER_SAMPLE_BYTES decode to `text`
    (`complete`: the whole file); `delimiter` and `header` as asked, None to read them off the
    text. Every guess that departs from a plain comma-separated file with a header is named in
    a warning. An HTML or XML document (a saved web page, a download's error page) is a schema
    Hint rather than a one-column table named after its first line."""
    if text.lstrip("\ufeff \t\r\n")[:20].lower().startswith(_MARKUP_STARTS):
        raise HintException(
            "schema",
            f"{name!r} is an HTML or XML document, not CSV (a saved web page or a download's "
            "error page?): fetch the data file itself",
        )
    _refuse_json(text, complete, name)
    lines = text.splitlines(keepends=True)
    excel = _excel_separator(lines[0] if lines else "")
    if excel is not None and delimiter is None:
        delimiter = excel
    start = preamble = int(excel is not None)  # the `sep=` line is skipped like a comment
    while preamble < len(lines) - 1 and (
        lines[preamble].startswith("#") or (preamble > start and not lines[preamble].strip())
    ):
        preamble += 1
    while preamble > start and not lines[preamble - 1].strip():
        preamble -= 1  # blank lines before the header: pandas skips those itself
    rest = "".join(lines[preamble:]) if preamble else text
    given = delimiter
    if delimiter is None and _eurostat_header_line(rest):
        # Eurostat's TSV: commas inside its first column, tabs between the columns.
        delimiter = "\t"
        _detected_delimiter_warning(delimiter, warnings)
    elif delimiter is None:
        delimiter = _detected_delimiter(rest, complete, warnings)
    records = _sample_records(rest, complete, delimiter) or []
    if preamble > start and records:
        # The last '#' line is the header when it has the data's fields ("#CHROM\tPOS…").
        last = lines[preamble - 1]
        fields = next(csv.reader([last], delimiter=delimiter), [])
        if len(fields) >= 2 and len(fields) == len(records[0]):
            preamble -= 1
            records = [fields, *records]
            header = True if header is None else header
    if preamble > start:
        warnings.append(
            Warning(
                kind="preamble",
                message=f"skipped {preamble - start} comment line(s) starting with '#' before "
                "the header",
                details={"lines": preamble - start},
            )
        )
    if records and (len(records[0]) < 2 or not _consistent(records) or _padded_note(records[0])):
        block = _notes_above_table(lines[preamble:], complete, given)
        if block is not None:
            skipped, found, notes = block
            preamble += skipped
            records = _sample_records("".join(lines[preamble:]), complete, found) or []
            if given is None and found != delimiter:
                _detected_delimiter_warning(found, warnings)
            delimiter = found
            # Without the empty fields a spreadsheet pads them with (`"Data Source","WDI",,,`).
            notes = [note.rstrip(found + " ") or note for note in notes]
            warnings.append(
                Warning(
                    kind="preamble",
                    message=f"skipped {skipped} line(s) of notes above the table's header: "
                    + _quoted_notes(notes),
                    details={"lines": skipped, "notes": notes[:MAX_NOTES_KEPT]},
                )
            )
    if excel is not None:
        warnings.append(
            Warning(
                kind="delimiter",
                message="the first line names the separator (Excel's "
                f"'sep={_shown_delimiter(excel)}'); it was "
                f"skipped, and fields are separated by {_shown_delimiter(delimiter)!r}",
                details={"delimiter": delimiter},
            )
        )
    if header is None:
        header = not _first_record_is_data(records)
        if not header:
            warnings.append(
                Warning(
                    kind="no_header",
                    message="the first row holds data, not column names: the columns are "
                    "named column_1, column_2, …; pass header=true if it is a header",
                )
            )
    spaced = _spaced_after_separator(records)
    if spaced:
        warnings.append(
            Warning(
                kind="initial_space",
                message="every field follows its separator after a space; the spaces were dropped",
            )
        )
    return _CsvLayout(delimiter, header, preamble, spaced)


# Reads the file: (encoding, quoting, the column positions to read as text or None for all).
_CsvRead = Callable[..., pd.DataFrame]


def _read_quoted(
    read: _CsvRead, encoding: str, name: str, warnings: list[Warning]
) -> tuple[pd.DataFrame, _Quoting]:
    """The file read with CSV quoting, or without it (see _read_unquoted) when a quote opens a
    field and never closes (a TSV whose titles start with a quote, as IMDb's do); and the
    quoting used."""
    try:
        return read(encoding, csv.QUOTE_MINIMAL), csv.QUOTE_MINIMAL
    except pd.errors.ParserError as exc:
        if "EOF inside string" not in str(exc):
            raise
        return _read_unquoted(read, encoding, name, _first_lines(exc), warnings), csv.QUOTE_NONE


def _read_unquoted(
    read: _CsvRead, encoding: str, name: str, problem: str, warnings: list[Warning]
) -> pd.DataFrame:
    """The file read with quotes as ordinary characters, with a warning: its quotes do not pair
    up as CSV quoting (`problem` says where), and reading them as quoting merged rows into one
    value or ran to the end of the file. A schema Hint when it does not read that way either
    (a quoted value that holds the separator)."""
    try:
        # More fields than the header (a quoted value holding the separator) are an error
        # here, not a shifted table.
        df = _without_implicit_index(read(encoding, csv.QUOTE_NONE), name, warnings)
    except (pd.errors.ParserError, HintException) as exc:
        raise HintException(
            "schema",
            f"the quotes in {name!r} do not pair up ({problem}), and without quoting its rows "
            f"do not have the header's fields either ({_first_lines(exc)[:300]}): a quote "
            "opens a value and does not close it; the file needs fixing before it can be loaded",
        ) from exc
    warnings.append(
        Warning(
            kind="quotes",
            message=f"the file's quotes do not pair up as CSV quoting ({problem[:200]}); it was "
            'read with " as an ordinary character, so quoted values keep their quotes',
        )
    )
    return df


def _has_line_breaks(col: pd.Series) -> bool:
    """Whether a value of `col` is text holding a line break."""
    if col.dtype == object:
        col = col[col.map(lambda v: isinstance(v, str))]
    elif not pd.api.types.is_string_dtype(col.dtype):
        return False
    return bool(col.str.contains("\n|\r", regex=True, na=False).any())


def _broken_quote(
    df: pd.DataFrame, stream: IO[bytes], encoding: str, layout: _CsvLayout
) -> str | None:
    """Where the file's quoting is malformed, when that may have merged rows, else None.

    pandas reads a quote that opens a field but is not closed at its end (`"Weird title` in a
    TSV) by running on to the next quote, however many lines later, taking every row between
    into one value and dropping them: a value with a line break in it. Only then is the file
    read again by Python's strict csv reader, which refuses such a quote."""
    if not any(_has_line_breaks(col) for _, col in df.items()):
        return None
    lines = io.TextIOWrapper(stream, encoding=encoding, errors="replace", newline="")
    for _ in range(layout.preamble_lines):
        lines.readline()
    reader = csv.reader(
        lines, delimiter=layout.delimiter, skipinitialspace=layout.initial_space, strict=True
    )
    try:
        for _ in reader:
            pass
    except csv.Error as exc:
        if "field limit" in str(exc):  # a long value: nothing wrong with the quotes
            return None
        return f"line {reader.line_num}: {exc}"
    return None


def _trimmed_column_names(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """Column names without the spaces around them (` a ` → `a`), unless that would make two
    of them the same; with a warning."""
    names = [str(c) for c in df.columns]
    trimmed = [n.strip() or n for n in names]
    if trimmed == names or len(set(trimmed)) < len(set(names)):
        return df
    df.columns = pd.Index(trimmed)
    warnings.append(
        Warning(
            kind="trimmed_names",
            message="spaces around column names were removed",
            details={"renamed": [n for n, t in zip(names, trimmed, strict=True) if n != t]},
        )
    )
    return df


# Lines of notes below a table (World Bank, Statistics Canada): looked for among its last rows.
MAX_FOOTNOTE_ROWS = 50
# The start of a line of notes: a label and a colon (`Source: …`, `Symbol legend:`, `Note 1:`)
# or a footnote mark (`1.`, `(2)`, `[3]`, `*`, `†`, `¹`).
_NOTE_LABEL_RE = re.compile(r"[^\W\d_][^:]{0,40}:(?:\s|$)")
_FOOTNOTE_MARK_RE = re.compile(r"(?:\(?\d{1,2}[.)]|\[\d{1,2}\]|[*†‡§¹²³⁴⁵⁶⁷⁸⁹⁰]+)\s*[^\W\d]")
# A value that is a number or a date (`2023`, `1,234.5`, `2023-01`, `01/02/2023`, `2023Q1`).
_NUMBER_OR_DATE_RE = re.compile(
    r"[+-]?[\d.,]*\d(?:[eE][+-]?\d+)?%?"
    r"|\d{4}(?:[-/.]\d{1,2}){0,2}(?:[ T][\d:.]+)?"
    r"|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}|\d{4} ?[QMHW]\d{1,2}"
)


def _quoted_notes(notes: Sequence[str]) -> str:
    """Notes as a warning quotes them: the first MAX_NOTES_SHOWN, each clipped."""
    shown = "; ".join(clip(note, 100) for note in notes[:MAX_NOTES_SHOWN])
    more = f"; … {len(notes) - MAX_NOTES_SHOWN} more" if len(notes) > MAX_NOTES_SHOWN else ""
    return shown + more


def _footnotes(df: pd.DataFrame) -> tuple[int, list[str]] | None:
    """The rows to keep and the notes below the table read into `df`, as World Bank and
    Statistics Canada export it (after the data, often after a blank line: `Source: …`,
    `Note: …`, `Symbol legend:` in the first column, the others empty), else None.

    The notes are the last rows (at most MAX_FOOTNOTE_ROWS, fully blank ones among and above
    them included) whose first field alone holds anything, text that is not a number or a
    date. They are taken for notes only when the first of them starts like one (a label and
    a colon, or a footnote mark; or, over numbers or dates, a sentence) and either the first
    column holds numbers or dates above them (a note cannot be one of its values), or every
    row above has a value besides the first (no row of the table is like them). So a table
    whose last rows legitimately have only their first field (`Carol,`) keeps them."""
    if df.shape[1] < 2 or len(df) < 2:
        return None
    tail = df.iloc[-MAX_FOOTNOTE_ROWS:]
    first, others_empty = tail.iloc[:, 0], tail.iloc[:, 1:].isna().all(axis=1)
    start = len(df)
    for value, empty in zip(reversed(first.tolist()), reversed(others_empty.tolist()), strict=True):
        if not empty:
            break
        if not pd.isna(value) and (
            not isinstance(value, str) or _NUMBER_OR_DATE_RE.fullmatch(value.strip())
        ):
            break
        start -= 1
    block = df.iloc[start:, 0]
    notes = [value.strip() for value in block if isinstance(value, str) and value.strip()]
    if not notes:
        return None
    above = df.iloc[:start]
    above = above[above.notna().any(axis=1)]
    if above.empty:
        return None
    column = above.iloc[:, 0].dropna()
    values = column.astype(str).str.strip()
    over_numbers = not values.empty and bool(values.str.fullmatch(_NUMBER_OR_DATE_RE).all())
    sentence = len(notes[0].split()) >= 4 and notes[0].endswith((".", ")"))
    starts_like_a_note = bool(
        _NOTE_LABEL_RE.match(notes[0])
        or _FOOTNOTE_MARK_RE.match(notes[0])
        or (over_numbers and sentence)
    )
    if not starts_like_a_note:
        return None
    if over_numbers or bool(above.iloc[:, 1:].notna().any(axis=1).all()):
        return start, notes
    return None


def _read_csv(
    opened: IO[bytes],
    path: Path,
    delimiter: str | None,
    header: bool | None,
    limit: int,
    warnings: list[Warning],
) -> pd.DataFrame:
    """The CSV file as a DataFrame; `delimiter` and `header` None: read off its first lines."""

    def stream() -> IO[bytes]:
        opened.seek(0)
        bounded = _BoundedReader(_decompressing(opened, path), limit, path.name)
        return io.BufferedReader(bounded, READ_CHUNK_BYTES)

    rows_kept: int | None = None  # the rows above notes below the table (see _footnotes)

    try:
        head = stream().read(max(ENCODING_SAMPLE_BYTES, DELIMITER_SAMPLE_BYTES))
        for magic, what, advice in _FOREIGN_MAGIC:
            if head.startswith(magic):
                raise _unsupported(path.name, what, advice)
        encodings = _sniff_encodings(head[:ENCODING_SAMPLE_BYTES])
        layout = _csv_layout(
            head.decode(encodings[0], errors="replace"),
            complete=len(head) < DELIMITER_SAMPLE_BYTES,
            delimiter=delimiter,
            header=header,
            name=path.name,
            warnings=warnings,
        )
        delimiter = layout.delimiter

        def read(
            encoding: str,
            quoting: _Quoting,
            as_text: list[int] | None = None,
            *,
            header_row: bool = False,
        ) -> pd.DataFrame:
            return pd.read_csv(
                stream(),
                sep=layout.delimiter,
                encoding=encoding,
                header=0 if layout.header and not header_row else None,
                skiprows=layout.preamble_lines,
                skipinitialspace=layout.initial_space,
                quoting=quoting,
                low_memory=False,
                usecols=as_text,
                # A trailing delimiter does not shift the positions of the columns as text.
                index_col=False if as_text is not None or header_row else None,
                dtype=str if as_text is not None or header_row else None,
                # The header's cells as written: an empty one is "", a cell `NA` is "NA".
                keep_default_na=not header_row,
                nrows=1 if header_row else rows_kept,
            )

        for encoding in encodings:
            try:
                df, quoting = _read_quoted(read, encoding, path.name, warnings)
            except UnicodeError:
                continue  # the next encoding; Latin-1, the last, decodes any byte sequence
            break
        else:  # pragma: no cover - Latin-1 decodes every byte
            raise AssertionError("unreachable: Latin-1 decodes every byte")
        if quoting != csv.QUOTE_NONE:
            broken = _broken_quote(df, stream(), encoding, layout)
            if broken is not None:
                df = _read_unquoted(read, encoding, path.name, broken, warnings)
                quoting = csv.QUOTE_NONE

        def read_as_text(positions: list[int]) -> pd.DataFrame:
            return read(encoding, quoting, positions)

        def may_have_leading_zeros() -> bool:
            return _may_have_leading_zeros(stream(), encoding, layout)

        if layout.header:
            df = _header_as_written(df, lambda: read(encoding, quoting, header_row=True))
            regrouped = _two_row_header(df, read_as_text)
            if regrouped is not None:
                names, rows = regrouped
                shown_names = ", ".join(repr(n) for n in names[:8])
                warnings.append(
                    Warning(
                        kind="header_rows",
                        message="the header spans two rows (group labels above the columns' "
                        f"own): the columns were named by both — {shown_names}"
                        + (", …" if len(names) > 8 else ""),
                        details={"columns": names},
                    )
                )
                _encoding_warning(encoding, warnings)
                records = rows.itertuples(index=False)
                texts = (["" if not isinstance(v, str) else v for v in r] for r in records)
                rebuilt = io.BytesIO(_csv_bytes(itertools.chain([names], texts)))
                # (Named without a compression suffix: what is read again is plain text.)
                plain = path.with_name(_file_stem(path)) if _compression_suffix(path) else path
                return _read_csv(rebuilt, plain, ",", True, limit, warnings)
    except pd.errors.EmptyDataError as exc:
        raise HintException(
            "schema", f"{path.name!r} is empty: there is no header row to read"
        ) from exc
    except (pd.errors.ParserError, ValueError) as exc:
        shown = _shown_delimiter(delimiter or ",")
        raise HintException(
            "schema",
            f"could not parse {path.name!r} as CSV with delimiter {shown!r}: "
            f"{_first_lines(exc)}; if the file uses another separator pass delimiter, "
            "or format='parquet' if it is Parquet",
            [{"label": d, "score": 0.5} for d in (",", ";", "\\t", "|") if d != shown],
        ) from exc
    except _DECOMPRESSION_ERRORS as exc:
        raise HintException(
            "schema",
            f"could not read {path.name!r}: {_first_lines(exc) or type(exc).__name__}; the "
            "file is corrupt or truncated, or not compressed the way its extension says",
        ) from exc
    eurostat = (
        _eurostat_key(df.columns[0])
        if layout.header and delimiter == "\t" and df.shape[1] > 1
        else None
    )
    trimmed: list[Warning] = []  # (Eurostat's period names end in a space: said in its warning)
    if layout.header:
        df = _trimmed_column_names(df, warnings if eurostat is None else trimmed)
    else:
        df.columns = pd.Index([f"column_{i + 1}" for i in range(df.shape[1])])
    _check_column_names(df, path.name)
    df = _without_implicit_index(df, path.name, warnings)
    df = _without_empty_unnamed_last_column(df, warnings)
    footer = _footnotes(df)
    if footer is not None:
        rows_kept, notes = footer
        # Read again without them, so the columns are typed by their values alone (a column of
        # years is numbers, not text because of `Source: …` below it).
        try:
            again = read(encoding, quoting)
            again = _without_implicit_index(again, path.name, [])
            again = _without_empty_unnamed_last_column(again, [])
        except (pd.errors.ParserError, ValueError, HintException) as exc:  # read once already
            logger.warning("could not re-read %s without its notes: %s", path.name, exc)
            again = df.iloc[:0]
        if again.shape == (rows_kept, df.shape[1]):
            again.columns = df.columns
            df = again
        else:  # not expected: the same file, fewer rows
            df = df.iloc[:rows_kept].copy()
        warnings.append(
            Warning(
                kind="footnotes",
                message=f"dropped {len(notes)} line(s) of notes below the table: "
                + _quoted_notes(notes),
                details={"lines": len(notes), "notes": notes[:MAX_NOTES_KEPT]},
            )
        )
    wide = None
    if eurostat is not None:
        wide = _eurostat_table(df, eurostat, read_as_text, warnings)
        if wide is None:
            warnings.extend(trimmed)
    if wide is not None:
        df = wide
    else:
        df = _numbers_as_written(df, read_as_text, may_have_leading_zeros, warnings)
        df = _huge_integers_as_text(df, warnings)
        df = _nullable_booleans(df)
        df = _parse_iso_dates(df, warnings)
        df = _parse_written_dates(df, warnings)
        df = _written_numbers(df, delimiter, warnings)
        df = _numbers_with_markers(df, warnings)
        df = _gsod_missing(df, warnings)
        _sentinel_warning(df, warnings)
        _total_row_warning(df, warnings)
    _encoding_warning(encoding, warnings)
    return df


def _csv_bytes(rows: Iterable[Sequence[str]]) -> bytes:
    """`rows` as UTF-8 CSV text, to be read again by _read_csv."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode("utf-8")


def _encoding_warning(encoding: str, warnings: list[Warning]) -> None:
    if encoding in ("cp1252", "latin-1"):
        label = "Windows-1252" if encoding == "cp1252" else "Latin-1"
        warnings.append(
            Warning(kind="encoding", message=f"the file is not valid UTF-8; read as {label}")
        )


# A year as a column label ("Population" over 2022, 2023).
_YEAR_RE = re.compile(r"(?:18|19|20)\d\d")


def _header_like(cells: list[Any], grouped: list[bool], tops: list[str]) -> bool:
    """Whether a row's cells could be a header's second row: two labels or more, all under
    grouped columns (see _two_row_header), nothing under the others but their own name again
    (a header cell merged down both rows)."""
    labels = 0
    for cell, in_group, top in zip(cells, grouped, tops, strict=True):
        if cell is None or cell is pd.NA or cell != cell:  # missing (NaN)
            continue
        if isinstance(cell, float) and cell.is_integer():
            cell = int(cell)  # a year pandas read as a number
        shown = str(cell).strip()
        if not shown or (not in_group and shown == top):
            continue
        if not in_group or not _is_label(shown):
            return False
        labels += 1
    return labels >= 2


def _is_label(value: str) -> bool:
    """Whether a cell of a header's second row reads as a label: text, or a year."""
    text = value.strip()
    return bool(text) and (not _is_number_text(text) or _YEAR_RE.fullmatch(text) is not None)


def _is_number_text(value: str) -> bool:
    text = value.strip().replace(",", "")
    return bool(text) and _NUMBER_RE.fullmatch(text) is not None


def _two_row_header(
    df: pd.DataFrame, read_as_text: Callable[[list[int]], pd.DataFrame]
) -> tuple[list[str], pd.DataFrame] | None:
    """A header written over two rows — group labels above, in merged (so blank) or repeated
    cells, the labels of each column below (`2023, , 2024,` over `Q1, Q2, Q1, Q2`, or
    `Population, ` over `2022, 2023`), as statistical tables and spreadsheets are laid out —
    read as one: the column names joined from both rows, and the rows below them as text.
    None unless the header has blank or repeated names, the first row below it has labels
    (text, or years) under the grouped columns only — two or more, and nothing under a column
    of its own (a data row has a value there) — and a labelled column holds numbers below."""
    names = [str(c) for c in df.columns]
    if df.shape[0] < 2 or df.shape[1] < 2:
        return None
    if "" not in names and len(set(names)) == len(names):
        return None
    tops = [n.strip() for n in names]
    grouped = [
        not top
        or (i > 0 and top == tops[i - 1])
        or (i + 1 < len(tops) and tops[i + 1] in ("", top))
        for i, top in enumerate(tops)
    ]
    # Decided on the row as read first: the file is read again (as text) only for a candidate.
    if not _header_like(df.iloc[0].tolist(), grouped, tops):
        return None
    text = read_as_text(list(range(df.shape[1])))
    if text.shape != df.shape:
        return None
    first = text.iloc[0]
    if not _header_like(first.tolist(), grouped, tops):
        return None
    below = text.iloc[1:]
    numeric = False
    for position, label in enumerate(first):
        if not (isinstance(label, str) and label.strip()):
            continue
        values = below.iloc[:, position].dropna()
        values = values[values.str.strip() != ""]
        if not values.empty and values.map(_is_number_text).mean() >= 0.9:
            numeric = True
            break
    if not numeric:
        return None
    joined, group = [], ""
    for position, top in enumerate(names):
        top = top.strip()
        if top:
            group = top
        elif position > 0 and group:
            top = group  # a merged group label covers the blank cells after it
        sub = first.iloc[position]
        sub = sub.strip() if isinstance(sub, str) else ""
        if sub == top:
            sub = ""  # a header cell merged down both rows
        joined.append(" ".join(part for part in (top, sub) if part) or f"column_{position + 1}")
    rows = below.copy()
    rows.columns = pd.Index(range(rows.shape[1]))
    return joined, rows


# The names pandas gives header cells it renames: a repeated name (`a.1`) and an empty one
# (`Unnamed: 2`, by its 0-based position).
_PANDAS_RENAMED_RE = re.compile(r".+\.\d+|Unnamed: \d+(?:\.\d+)?")


def _header_as_written(df: pd.DataFrame, read_header: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """`df` with the names its header row gives, where pandas renamed a repeated one (`a`, `a`
    read as `a`, `a.1`) or an empty one (`a,,c` read as `a`, `Unnamed: 1`, `c`): load_dataset
    renames repeats once, SQL-style (`a_2`), and empty names by their position (`column_2`, as
    for Parquet), with a warning naming only those; and a name written `x.1` or `Unnamed: 3`
    is not one of them. `read_header` reads the header row as a row of text, empty fields as
    empty strings."""
    if not any(_PANDAS_RENAMED_RE.fullmatch(str(c)) for c in df.columns):
        return df
    try:
        written = read_header()
    except (pd.errors.ParserError, ValueError) as exc:  # read once already: not expected
        logger.warning("could not re-read the header row: %s", exc)
        return df
    if written.shape != (1, df.shape[1]):
        return df
    names = [
        name if isinstance(name, str) and str(current) != name else current
        for current, name in zip(df.columns, written.iloc[0], strict=True)
    ]
    df.columns = pd.Index(names)
    return df


# A number written with a decimal comma (how spreadsheets in much of Europe save CSV, with
# semicolons between the fields), or an integer among such numbers.
_DECIMAL_COMMA_RE = r"^[+-]?\d*,\d+$"
_INTEGER_RE = r"^[+-]?\d+$"
# Such a number with dots between its thousands ("1.234,50", "12.000"): how the same
# spreadsheets save large numbers.
_DOT_GROUPED_RE = r"^[+-]?\d{1,3}(?:\.\d{3})+(?:,\d+)?$"
# A number with commas between its thousands ("1,234.50": quoted, in a comma-separated file).
_THOUSANDS_RE = r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$"
# Any number of a column written with decimal commas.
_DECIMAL_COMMA_NUMBER_RE = f"{_DECIMAL_COMMA_RE}|{_DOT_GROUPED_RE}|{_INTEGER_RE}"
# Written for a missing number in published data (UCI's "?", a dash, SAS's ".", Eurostat's
# ":"), beyond the markers pandas already reads as missing (empty, NA, N/A, null, NaN, …).
MISSING_MARKERS = frozenset({"?", "-", "--", ".", ":", "missing"})


# A column rule: given a text column and its stripped non-missing values, the column's new
# values, or None to leave it as it is.
def _convert_text_columns(
    df: pd.DataFrame, rule: _ColumnRule, warnings: list[Warning], warning: Warning
) -> pd.DataFrame:
    """Apply `rule` to every column of strings, given its values stripped of surrounding
    spaces (see _convert_object_columns)."""

    def stripped(col: pd.Series, values: pd.Series) -> Any:
        return rule(col, values.str.strip())

    return _convert_object_columns(df, _is_text, stripped, warnings, warning)


def _numbers_without(col: pd.Series, separator: str, replacement: str) -> Any:
    return pd.to_numeric(col.str.strip().str.replace(separator, replacement, regex=False))


def _thousands_separators(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """Text columns of numbers written with thousands separators ("12,000.00", as spreadsheets
    export them, quoted) as numbers, with a warning."""

    def rule(col: pd.Series, text: pd.Series) -> Any:
        grouped = text.str.fullmatch(_THOUSANDS_RE)
        if not grouped.any() or not (grouped | text.str.fullmatch(_NUMBER_RE.pattern)).all():
            return None
        return _numbers_without(col, ",", "").to_numpy()

    message = "numbers written with thousands separators were read as numbers in: "
    return _convert_text_columns(df, rule, warnings, Warning("thousands_separators", message))


def _missing_markers(
    df: pd.DataFrame, *, decimal_comma: bool, warnings: list[Warning]
) -> pd.DataFrame:
    """Text columns of numbers where some values are a MISSING_MARKERS marker: the markers as
    missing values and the column as numbers (with `decimal_comma`, numbers written with a
    decimal comma stay text here, for _decimal_commas). With a warning naming the columns."""

    def rule(col: pd.Series, text: pd.Series) -> Any:
        marked = text.isin(MISSING_MARKERS)
        if not marked.any() or marked.all():
            return None
        rest = text[~marked]
        if rest.str.fullmatch(_LEADING_ZERO_RE).any():
            return None  # codes such as ZIP codes: their zeros would be lost
        cleared = col.where(~col.str.strip().isin(MISSING_MARKERS))
        if rest.str.fullmatch(_NUMBER_RE.pattern).all():
            return pd.to_numeric(cleared).to_numpy()
        if decimal_comma and rest.str.fullmatch(_DECIMAL_COMMA_NUMBER_RE).all():
            return cleared.to_numpy()
        return None

    message = "values such as '?' or '-' among numbers were read as missing in: "
    warning = Warning("missing_markers", message, {"markers": sorted(MISSING_MARKERS)})
    return _convert_text_columns(df, rule, warnings, warning)


def _decimal_commas(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """Text columns of numbers written with a decimal comma as floats, with a warning. Only for
    files not separated by commas (in a comma-separated file a comma inside a number would have
    to be quoted, and "1,500" there is a thousand). Dots between thousands ("1.234,50") are
    dropped — but only in a column where some number has a decimal comma or two such dots
    ("3.755.251"): alone, "1.234" may as well be a number with a decimal point. A column whose
    every comma is followed by exactly three digits, and that has no dots between thousands, is
    left as text: "1,500" may be a thousand there too."""

    def rule(col: pd.Series, text: pd.Series) -> Any:
        if not text.str.fullmatch(_DECIMAL_COMMA_NUMBER_RE).all():
            return None
        commas = text.str.contains(",", regex=False)
        grouped = text.str.fullmatch(_DOT_GROUPED_RE)
        # Two dots in one number ("3.755.251") can only be between thousands.
        if not commas.any() and not text.str.count(r"\.").gt(1).any():
            return None
        if not grouped.any() and text[commas].str.fullmatch(r"^[+-]?\d*,\d{3}$").all():
            return None
        numbers = col.str.strip().str.replace(".", "", regex=False)
        return pd.to_numeric(numbers.str.replace(",", ".", regex=False)).to_numpy()

    message = "numbers written with a decimal comma were read as numbers in: "
    return _convert_text_columns(df, rule, warnings, Warning("decimal_comma", message))


def _written_numbers(df: pd.DataFrame, delimiter: str, warnings: list[Warning]) -> pd.DataFrame:
    """Text columns that hold numbers as people write them (missing markers, decimal commas in
    a file not separated by commas, thousands separators in one that is, percent and currency
    signs, accounting negatives) as numbers."""
    decimal_comma = delimiter != ","
    df = _missing_markers(df, decimal_comma=decimal_comma, warnings=warnings)
    if decimal_comma:
        df = _decimal_commas(df, warnings)
    return _numbers_with_units(
        df if decimal_comma else _thousands_separators(df, warnings),
        decimal_comma=decimal_comma,
        warnings=warnings,
    )


# A number with a percent sign, a currency sign or code before or after it, or in accounting's
# parentheses for a negative: "12.5%", "$1,234.56", "-€3", "1.234,50 €", "(1,200.00)", "12 USD".
_CURRENCY = r"[$€£¥₹₽₩₺]|US\$|USD|EUR|GBP|JPY|CHF|CAD|AUD|INR|CNY"
_WITH_UNIT_RE = re.compile(
    r"(?P<open>\()?\s*(?P<sign>[+\-−])?\s*(?P<before>" + _CURRENCY + r")?\s*(?P<sign2>[+\-−])?\s*"
    r"(?P<number>[\d.,]*\d[\d.,]*)\s*(?P<after>%|" + _CURRENCY + r")?\s*(?P<close>\))?",
    re.IGNORECASE,
)
_WITH_UNIT_PATTERN = f"^(?:{_WITH_UNIT_RE.pattern})$"
# How the number part is written, by the file's convention (see _written_numbers).
_POINT_NUMBER_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+")
_COMMA_NUMBER_RE = re.compile(r"\d{1,3}(?:\.\d{3})+(?:,\d+)?|\d+(?:,\d*)?|,\d+")


def _numbers_with_units(
    df: pd.DataFrame, *, decimal_comma: bool, warnings: list[Warning]
) -> pd.DataFrame:
    """Text columns whose every value is a number with a percent sign, a currency sign or code,
    or in parentheses (accounting's negative), each the same in the whole column, as numbers
    as written — "12.5%" is 12.5, "(1,200.00)" is -1200 (in a column that has values without
    parentheses too, or a unit) — with a warning naming the column's unit. Numbers follow the
    file's convention (decimal commas in a file not separated by commas, else a decimal point);
    a column where any value does not parse is left as text."""
    units: dict[str, str] = {}
    negatives: list[str] = []
    number_re = _COMMA_NUMBER_RE if decimal_comma else _POINT_NUMBER_RE

    def rule(col: pd.Series, values: pd.Series) -> Any:
        if not _sample(values).str.strip().str.fullmatch(_WITH_UNIT_PATTERN, flags=re.I).all():
            return None  # most text columns: decided on their first values
        text = values.str.strip()
        if not text.str.fullmatch(_WITH_UNIT_PATTERN, flags=re.I).all():
            return None
        # Vectorised string passes, not a regex extract: several times faster on a big file.
        signs = text.str.replace(r"[\d\s.,()+\-−]", "", regex=True).str.upper()
        opened = text.str.startswith("(")
        if signs[signs.ne("")].nunique() > 1 or not (signs.ne("") | opened).any():
            return None  # plain numbers are for the other rules; two units are not one column
        if (opened != text.str.endswith(")")).any() or text.str.count(r"[\-−]").gt(1).any():
            return None  # "(5", "-$-3"
        if signs.eq("").all() and opened.all():
            return None  # "(1)", "(2)": references more often than a column of only debits
        number = text.str.replace(r"[^\d.,]", "", regex=True)
        if not number.str.fullmatch(number_re).all():
            return None
        if decimal_comma:
            number = number.str.replace(".", "", regex=False).str.replace(",", ".", regex=False)
        else:
            number = number.str.replace(",", "", regex=False)
        try:
            read = pd.to_numeric(number)
        except (ValueError, TypeError):
            return None
        negative = text.str.contains(r"[\-−]") | opened
        read = read.where(~negative, -read)
        column: pd.Series[Any] = pd.Series(float("nan"), index=col.index, dtype="float64")
        column.loc[values.index] = read.astype("float64").to_numpy()
        kept = column.dropna()
        if (kept % 1 == 0).all() and kept.abs().le(MAX_EXACT_FLOAT_INTEGER).all():
            # Whole numbers stay integers (nullable where there are blanks).
            column = column.astype("int64" if len(kept) == len(column) else "Int64")
        name = str(col.name)
        unit = signs[signs.ne("")].iloc[0] if signs.ne("").any() else ""
        units[name] = "percent" if unit == "%" else unit
        if opened.any():
            negatives.append(name)
        return column.array

    df = _convert_object_columns(df, _is_text, rule, warnings)
    if units:
        listed = ", ".join(f"{name} ({unit})" if unit else name for name, unit in units.items())
        message = f"numbers written with a unit were read as numbers in: {listed}"
        if negatives:
            message += f"; (parentheses) were read as negative in: {', '.join(negatives)}"
        warnings.append(Warning(kind="units", message=message, details={"columns": units}))
    return df


# --------------------------------------------------------------------------------------------
# Eurostat's TSV (the bulk download and the dissemination API's format=TSV)

# The first header cell of Eurostat's TSV: the dimensions whose codes make up each row's key,
# comma-separated, then a backslash and the dimension across the other columns
# (`freq,unit,na_item,geo\TIME_PERIOD`; `geo\time` in older files).
_EUROSTAT_KEY_RE = re.compile(
    r"\s*(?P<dims>[A-Za-z][\w-]*(?:,[A-Za-z][\w-]*)*)\\(?P<across>[A-Za-z][\w-]*)\s*"
)
# A cell of it: a number, or `:` for not available, then (after a space) the observation's
# flags: status letters (`p`, `e`, `bep`), and in newer files `@` and a confidentiality code.
_EUROSTAT_CELL_RE = re.compile(
    r"(?P<value>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|:)"
    r"(?:\s+(?P<flag>[A-Za-z]{1,8}(?:@[A-Za-z]{1,3})?|@[A-Za-z]{1,3}))?"
)
# Eurostat's observation status codes (and the legacy ones still in older files), and its
# confidentiality codes (after `@`, or `c` before 2025).
EUROSTAT_FLAGS = {
    "b": "break in time series",
    "c": "confidential",
    "d": "definition differs",
    "e": "estimated",
    "f": "forecast",
    "i": "imputed",
    "m": "missing, cannot exist",
    "n": "not significant",
    "p": "provisional",
    "r": "revised",
    "s": "Eurostat estimate",
    "u": "low reliability",
    "z": "not applicable",
    "C": "confidential",
    "N": "not for publication",
    "P": "under secrecy arrangements",
}
FLAG_COLUMN_SUFFIX = "_flag"


@dataclass(frozen=True)
class _EurostatKey:
    """The first header cell of a Eurostat TSV file, read."""

    header: str  # as written: `freq,unit,na_item,geo\TIME_PERIOD`
    dimensions: list[str]  # the row key's: freq, unit, na_item, geo
    across: str  # the other columns': TIME_PERIOD


def _eurostat_key(cell: object) -> _EurostatKey | None:
    """The Eurostat row-key header `cell` names, else None."""
    if not isinstance(cell, str):
        return None
    match = _EUROSTAT_KEY_RE.fullmatch(cell.lstrip("\ufeff"))
    if match is None:
        return None
    return _EurostatKey(cell.strip(), match.group("dims").split(","), match.group("across"))


def _eurostat_header_line(text: str) -> bool:
    """Whether `text` starts with the header line of a Eurostat TSV file: its first field, up
    to a tab, is a row-key header (see _EUROSTAT_KEY_RE)."""
    first, tab, _ = text.partition("\n")[0].partition("\t")
    return bool(tab) and _eurostat_key(first) is not None


def _flag_legend(counts: dict[str, int]) -> str:
    """`'p' 3, 'c' 1 (p provisional, c confidential)`: the flags found with their counts, then
    what the letters in them mean."""
    found = ", ".join(f"{flag!r} {n}" for flag, n in counts.items())
    letters: dict[str, str] = {}
    for flag in counts:
        for letter in flag.replace("@", ""):
            if letter in EUROSTAT_FLAGS:
                letters.setdefault(letter, EUROSTAT_FLAGS[letter])
    meanings = ", ".join(f"{letter} {meaning}" for letter, meaning in letters.items())
    return f"{found} ({meanings})" if meanings else found


def _eurostat_table(
    df: pd.DataFrame,
    key: _EurostatKey,
    read_as_text: Callable[[list[int]], pd.DataFrame],
    warnings: list[Warning],
) -> pd.DataFrame | None:
    """A table in Eurostat's TSV layout (see _EUROSTAT_KEY_RE) as an analyst would have it:
    the row key split into a text column per dimension (codes such as `B1GQ`, `AT`); the
    other columns, one per period (`2021`, `2021-Q1`, names without Eurostat's trailing
    space), as numbers, `:` (not available) as null; and the flags after the values (`p`,
    `e`, `c`…) moved to a column `<period>_flag` beside each period column that has any, so
    SQL computes on the values and can still tell a provisional or confidential one. None
    when the rows do not fit the layout (a key with another number of codes, a cell that is
    not a number or `:` and flags), the file then read as any other."""
    keys = df.iloc[:, 0]
    if df.shape[1] < 2 or keys.isna().any():
        return None
    codes = [str(k).strip().split(",") for k in keys]
    if any(len(code) != len(key.dimensions) for code in codes):
        return None
    try:
        texts = read_as_text(list(range(1, df.shape[1])))
    except (pd.errors.ParserError, ValueError) as exc:  # read once already: not expected
        logger.warning("could not re-read the Eurostat columns as text: %s", exc)
        return None
    if texts.shape != (len(df), df.shape[1] - 1):
        return None
    values: list[pd.Series] = []
    flags: list[pd.Series] = []
    for _, text in texts.items():
        cells = text.str.strip()
        written = cells.dropna()
        written = written[written != ""]
        if not bool(written.str.fullmatch(_EUROSTAT_CELL_RE).all()):
            return None
        parts = cells.str.extract(f"^(?:{_EUROSTAT_CELL_RE.pattern})$")
        values.append(parts["value"].where(parts["value"] != ":"))
        flags.append(parts["flag"].where(parts["flag"].notna() & (parts["flag"] != "")))
    numbers = pd.concat(values).dropna()
    integers = numbers.empty or bool(numbers.str.fullmatch(_INTEGER_RE).all())
    columns: list[pd.Series] = []
    for i, dimension in enumerate(key.dimensions):
        columns.append(pd.Series([code[i].strip() for code in codes], dtype="str", name=dimension))
    periods = [str(name).strip() for name in df.columns[1:]]
    flag_columns: list[str] = []
    counts: dict[str, int] = {}
    for period, value, flag in zip(periods, values, flags, strict=True):
        number = _exact_integers(value) if integers else pd.to_numeric(value).to_numpy()
        columns.append(pd.Series(number, name=period).reset_index(drop=True))
        if flag.notna().any():
            flag_columns.append(period + FLAG_COLUMN_SUFFIX)
            column = pd.Series(flag.to_numpy(), dtype="str", name=flag_columns[-1])
            columns.append(column.reset_index(drop=True))
            for code, n in flag.value_counts().items():
                counts[str(code)] = counts.get(str(code), 0) + int(n)
    table = pd.concat([c.reset_index(drop=True) for c in columns], axis=1)
    shown = periods[0] if len(periods) == 1 else f"{periods[0]} … {periods[-1]}"
    message = (
        f"Eurostat's TSV layout: the first column ({key.header}) was "
        + ("split into " if len(key.dimensions) > 1 else "named ")
        + f"{', '.join(key.dimensions)}; the {len(periods)} other column(s) ({shown}) are "
        f"{key.across} values, read as numbers with ':' (not available) as null"
    )
    if flag_columns:
        listed = ", ".join(flag_columns[:MAX_NOTES_SHOWN])
        hidden = len(flag_columns) - MAX_NOTES_SHOWN
        more = f", … {hidden} more" if hidden > 0 else ""
        message += (
            f"; the flags after the values were moved to a column <period>{FLAG_COLUMN_SUFFIX} "
            f"beside each period that has any ({listed}{more}): {_flag_legend(counts)}"
        )
    message += f"; UNPIVOT the period columns for one row per {key.across}"
    warnings.append(
        Warning(
            kind="eurostat",
            message=message,
            details={
                "dimensions": key.dimensions,
                "across": key.across,
                "periods": len(periods),
                "flag_columns": flag_columns,
                "flags": counts,
            },
        )
    )
    return table


# --------------------------------------------------------------------------------------------
# Numbers with markers (NOAA's climate data)

# Written instead of a number in NOAA's climate data (Local Climatological Data, and the
# like), and what each means. (The MISSING_MARKERS `?`, `-`… mean missing here too.)
NUMBER_MARKERS = {
    "T": "trace: too small to measure",
    "M": "missing",
    "VRB": "variable wind direction",
}
# Written right after a number there: `27.2s` a suspect value, `0.00T` a trace.
NUMBER_SUFFIXES = {"s": "suspect (after a number)", "T": "trace"}
_SUFFIXED_NUMBER_RE = re.compile(f"(?P<number>{_NUMBER_RE.pattern})(?P<suffix>[sT])")
# A column is read as numbers with markers when numbers (with or without a suffix) are at
# least this share of its values, and every other value is a marker. (Its markers are kept
# beside it, so even a column misread this way loses nothing.) A trace is common: a tenth or
# more of the days in a wet climate.
MIN_MARKED_NUMBER_SHARE = 0.5
# A column of numbers and a few other short words (`NR`, `K`) is kept as text, and named in a
# warning, when the numbers make up at least this share of its values and there are at most
# MAX_UNKNOWN_MARKERS different words.
MIN_UNMARKED_NUMBER_SHARE = 0.9
MAX_UNKNOWN_MARKERS = 3
_SHORT_WORD_RE = re.compile(r"[A-Za-z]{1,5}|[*#]{1,3}")
MARKER_COLUMN_SUFFIX = "_marker"
# The first values of a text column looked at before the whole column is (see
# _may_be_marked_numbers): names and ids are passed over after these.
MARKER_SAMPLE_VALUES = 200


def _may_be_marked_numbers(text: pd.Series) -> bool:
    """Whether every value of `text` (stripped) is a number, a number with a suffix, a marker
    or a short word: a column with any other value is neither numbers with markers nor numbers
    with a few words (a quick test of its first values, before the whole column is)."""
    return bool(
        (
            text.str.fullmatch(_NUMBER_RE.pattern)
            | text.str.fullmatch(_SUFFIXED_NUMBER_RE.pattern)
            | text.isin(NUMBER_MARKERS.keys() | MISSING_MARKERS)
            | text.str.fullmatch(_SHORT_WORD_RE.pattern)
        ).all()
    )


def _markers_of(text: pd.Series) -> tuple[pd.Series, pd.Series] | None:
    """For a column of text `text` (stripped, none missing or empty) that is numbers, at least
    MIN_MARKED_NUMBER_SHARE of it, and NOAA's markers (see NUMBER_MARKERS and NUMBER_SUFFIXES),
    at least one: the numbers as text (None for a marker alone) and each value's marker (None
    for a plain number). None for any other column, or one of codes with leading zeros."""
    plain = text.str.fullmatch(_NUMBER_RE.pattern)
    suffixed = text.str.extract(f"^(?:{_SUFFIXED_NUMBER_RE.pattern})$")
    has_suffix = suffixed["number"].notna()
    alone = text.isin(NUMBER_MARKERS.keys() | MISSING_MARKERS)
    if not bool((plain | has_suffix | alone).all()) or not bool((has_suffix | alone).any()):
        return None
    numbers = text.where(plain, suffixed["number"])
    if bool(numbers.dropna().str.fullmatch(_LEADING_ZERO_RE).any()):
        return None  # codes whose zeros matter (see _numbers_as_written)
    if (plain | has_suffix).sum() < MIN_MARKED_NUMBER_SHARE * len(text):
        return None
    return numbers, text.where(alone, suffixed["suffix"]).where(~plain)


def _unknown_markers(text: pd.Series) -> dict[str, int] | None:
    """For a column of text `text` (stripped, none missing) that is numbers but for a few
    short words: those words and how often each occurs; else None."""
    plain = text.str.fullmatch(_NUMBER_RE.pattern)
    others = text[~plain]
    if others.empty or plain.sum() < MIN_UNMARKED_NUMBER_SHARE * len(text):
        return None
    if not bool(others.str.fullmatch(_SHORT_WORD_RE).all()):
        return None
    counts = others.value_counts()
    if len(counts) > MAX_UNKNOWN_MARKERS:
        return None
    return {str(word): int(n) for word, n in counts.items()}


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{marker!r} {n}" for marker, n in counts.items())


def _numbers_with_markers(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """Text columns of numbers with NOAA's markers among them (`T` a trace of precipitation,
    `M` missing, `VRB` a variable wind direction, `27.2s` a suspect value, `0.00T` a trace) as
    numbers: a marker alone as null, a number with a suffix as the number; each marker kept in
    a column `<name>_marker` beside its column, so a trace can still be told from a missing
    value. With a warning naming the markers found and how often. A column of numbers and a
    few other short words (`NR`, `K`) is kept as text, named in a warning, as SQL's TRY_CAST
    reads its numbers. Other text (station ids such as `USW00094728`, names) is left alone."""
    columns: list[pd.Series] = []
    converted: dict[str, dict[str, int]] = {}
    unknown: dict[str, dict[str, int]] = {}
    for position in range(df.shape[1]):
        col = df.iloc[:, position]
        columns.append(col)
        if not (pd.api.types.is_string_dtype(col.dtype) or col.dtype == object):
            continue
        values = col.dropna()
        if values.empty or (col.dtype == object and not all(isinstance(v, str) for v in values)):
            continue
        text = values.str.strip()
        text = text[text != ""]
        if text.empty or not _may_be_marked_numbers(text.iloc[:MARKER_SAMPLE_VALUES]):
            continue
        found = _markers_of(text)
        if found is None:
            words = _unknown_markers(text)
            if words is not None:
                unknown[str(col.name)] = words
            continue
        numbers, markers = found
        full = numbers.reindex(col.index)
        if bool(numbers.dropna().str.fullmatch(_INTEGER_RE).all()):
            converted_col: Any = _exact_integers(full.astype("str"))
        else:
            converted_col = pd.to_numeric(full).to_numpy()
        columns[-1] = pd.Series(converted_col, index=col.index, name=col.name)
        name = f"{col.name}{MARKER_COLUMN_SUFFIX}"
        columns.append(pd.Series(markers.reindex(col.index), dtype="str", name=name))
        converted[str(col.name)] = {str(m): int(n) for m, n in markers.value_counts().items()}
    if converted:
        df = pd.concat(columns, axis=1)
        listed = "; ".join(f"{name}: {_counted(counts)}" for name, counts in converted.items())
        legend = {
            marker: NUMBER_MARKERS.get(marker) or NUMBER_SUFFIXES.get(marker) or "missing"
            for counts in converted.values()
            for marker in counts
        }
        meanings = ", ".join(f"{marker} {meaning}" for marker, meaning in legend.items())
        warnings.append(
            Warning(
                kind="number_markers",
                message="numbers with markers among them were read as numbers in "
                f"{listed} ({meanings}): a marker alone is null and a "
                "marker after a number is dropped from it; each column's markers are kept in "
                f"a column <name>{MARKER_COLUMN_SUFFIX} beside it (e.g. count a trace as 0 "
                f"with CASE WHEN <name>{MARKER_COLUMN_SUFFIX} = 'T' THEN 0 ELSE <name> END)",
                details={
                    "columns": converted,
                    "marker_columns": [f"{n}{MARKER_COLUMN_SUFFIX}" for n in converted],
                },
            )
        )
    if unknown:
        listed = "; ".join(f"{name}: {_counted(counts)}" for name, counts in unknown.items())
        warnings.append(
            Warning(
                kind="text_among_numbers",
                message="columns of numbers with other values among them were kept as text: "
                f"{listed}; TRY_CAST(<column> AS DOUBLE) in SQL reads the numbers (the other "
                "values as null)",
                details={"columns": unknown},
            )
        )
    return df


# NOAA's Global Summary of the Day (GSOD) CSV: the columns that tell it, and the value each
# of its measurements has when missing (documented in its readme).
GSOD_COLUMNS = frozenset(
    {"STATION", "DATE", "TEMP", "TEMP_ATTRIBUTES", "DEWP", "SLP", "STP", "VISIB", "WDSP"}
    | {"MXSPD", "GUST", "MAX", "MIN", "PRCP", "SNDP", "FRSHTT"}
)
GSOD_MISSING = {
    "TEMP": 9999.9,
    "DEWP": 9999.9,
    "SLP": 9999.9,
    "STP": 9999.9,
    "MAX": 9999.9,
    "MIN": 9999.9,
    "VISIB": 999.9,
    "WDSP": 999.9,
    "MXSPD": 999.9,
    "GUST": 999.9,
    "SNDP": 999.9,
    "PRCP": 99.99,
}
# Numbers commonly written for a missing value (NOAA, NASA, many instruments): a warning names
# a column where one is repeated at its extreme, far from its other values.
SENTINELS = (-99999.0, -9999.0, -999.0, -99.99, 99.99, 999.9, 9999.0, 9999.9, 99999.0)


def _gsod_missing(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """In NOAA's Global Summary of the Day (its columns, GSOD_COLUMNS, tell it), the values
    it documents as missing (9999.9 for temperatures and pressures, 999.9 for visibility,
    winds and snow depth, 99.99 for precipitation) as null, with a warning: left as numbers,
    a missing gust counted as one of 999.9 knots in every average and maximum."""
    if not GSOD_COLUMNS.issubset(str(c) for c in df.columns):
        return df
    cleared: dict[str, int] = {}
    for position, name in enumerate(df.columns):
        missing = GSOD_MISSING.get(str(name))
        col = df.iloc[:, position]
        if missing is None or not pd.api.types.is_float_dtype(col.dtype):
            continue
        marked = col == missing
        if bool(marked.any()):
            df.isetitem(position, col.where(~marked).to_numpy())
            cleared[str(name)] = int(marked.sum())
    if cleared:
        listed = ", ".join(f"{name} ({n} × {GSOD_MISSING[name]:g})" for name, n in cleared.items())
        warnings.append(
            Warning(
                kind="missing_sentinels",
                message="NOAA's Global Summary of the Day writes 9999.9, 999.9 or 99.99 for a "
                f"missing measurement; those were read as null in: {listed}",
                details={"columns": cleared},
            )
        )
    return df


def _sentinel_warning(df: pd.DataFrame, warnings: list[Warning]) -> None:
    """Warn of number columns where a value commonly written for a missing one (SENTINELS:
    -9999, 999.9…) occurs more than once at the column's extreme, at least twice as far from
    zero as every other value (an elevation of -9999 among ones of a few hundred metres). They
    are kept: only the file's documentation can say they mean missing."""
    found: dict[str, dict[str, int]] = {}
    for position in range(df.shape[1]):
        col = df.iloc[:, position]
        if pd.api.types.is_bool_dtype(col.dtype) or not pd.api.types.is_numeric_dtype(col.dtype):
            continue
        values = col.dropna()
        if values.empty:
            continue
        extremes = {float(values.min()), float(values.max())}
        for sentinel in (s for s in SENTINELS if s in extremes):
            marked = values == sentinel
            count = int(marked.sum())
            if count < 2 or count == len(values):
                continue
            if float(values[~marked].abs().max()) * 2 <= abs(sentinel):
                found.setdefault(str(df.columns[position]), {})[f"{sentinel:g}"] = count
    if found:
        listed = "; ".join(
            f"{name}: " + ", ".join(f"{value} ×{n}" for value, n in counts.items())
            for name, counts in found.items()
        )
        warnings.append(
            Warning(
                kind="possible_sentinels",
                message="values often written for a missing measurement repeat far from the "
                f"other values in {listed}; they were kept as numbers — if the source "
                "documents them as missing, use NULLIF(<column>, <value>) in SQL",
                details={"columns": found},
            )
        )


# The label of a row of column totals, as spreadsheets and statistical tables write it.
_TOTAL_LABEL_RE = re.compile(
    r"(?:grand\s+)?totals?|sum|all|overall|gesamt|summe|insgesamt|total\s+general|totaal"
    r"|totale|suma|итого|合计|総計|合計",
    re.IGNORECASE,
)
# How close a total's cell must be to the sum of the cells above it (published totals are
# often rounded from unrounded parts).
TOTAL_ROW_TOLERANCE = 0.005


def _total_row_warning(df: pd.DataFrame, warnings: list[Warning]) -> None:
    """Warn of a last (or first) row labelled like a total ("Total", "Grand total", "Summe")
    whose numbers are the sums of the other rows': it was kept, as in the file, but SUM() or
    AVG() over the column would count it with the rows it totals."""
    if df.shape[0] < 3:
        return
    numeric = [
        position
        for position in range(df.shape[1])
        if pd.api.types.is_numeric_dtype(df.iloc[:, position].dtype)
        and not pd.api.types.is_bool_dtype(df.iloc[:, position].dtype)
    ]
    if not numeric:
        return
    for row in (df.shape[0] - 1, 0):
        label = None
        for position in range(df.shape[1]):
            cell = df.iat[row, position]
            if isinstance(cell, str) and _TOTAL_LABEL_RE.fullmatch(cell.strip()):
                label = (str(df.columns[position]), cell.strip())
                break
        if label is None:
            continue
        rest = df.drop(df.index[row])
        totalled = []
        for position in numeric:
            number: Any = df.iat[row, position]
            if pd.isna(number):
                continue
            parts = pd.to_numeric(rest.iloc[:, position], errors="coerce").dropna()
            if parts.empty:
                continue
            expected = float(parts.sum())
            if abs(float(number) - expected) > TOTAL_ROW_TOLERANCE * max(abs(expected), 1.0):
                return  # a number that is not the column's total: a row like the others
            totalled.append(str(df.columns[position]))
        if not totalled:
            continue
        column, text = label
        where = "last" if row == df.shape[0] - 1 else "first"
        literal = _sql_literal(text)
        warnings.append(
            Warning(
                kind="total_row",
                message=f"the {where} row ({column} = {text!r}) holds the totals of the other "
                f"rows in {', '.join(totalled)}; it was kept as in the file — exclude it when "
                f"aggregating: WHERE {_sql_identifier(column)} IS DISTINCT FROM {literal}",
                details={"row": where, "column": column, "label": text, "columns": totalled},
            )
        )
        return


_ISO_DATETIME_RE = (
    r"^\d{4}-\d{2}-\d{2}"
    r"(?:[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:?\d{2})?)?$"
)


# How a datetime with its UTC offset ends.
_ISO_OFFSET_RE = r"(?:Z|[+-]\d{2}:?\d{2})$"


def _parse_iso_dates(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """String columns whose every value is an ISO-8601 date/datetime as datetime64 (CSV has no
    types; these are the unambiguous ones). Times that all carry a UTC offset but not the same
    one (local time across a daylight-saving change, or several zones) are converted to UTC,
    with a warning; a column where some times have an offset and others not stays text."""

    def parse(col: pd.Series, values: pd.Series, **options: Any) -> Any:
        if not _sample(values).str.fullmatch(_ISO_DATETIME_RE).all():
            return None  # most text columns: decided on their first values
        if not values.str.fullmatch(_ISO_DATETIME_RE).all():
            return None
        try:
            return pd.to_datetime(col, format="ISO8601", **options)
        except (ValueError, OverflowError, TypeError) as exc:
            logger.debug("column %r looks like dates but does not parse: %s", col.name, exc)
            return None

    def one_offset(col: pd.Series, values: pd.Series) -> Any:
        return parse(col, values)

    def offsets_to_utc(col: pd.Series, values: pd.Series) -> Any:
        if not values.str.contains(_ISO_OFFSET_RE).all():
            return None
        return parse(col, values, utc=True)

    df = _convert_object_columns(df, _is_text, one_offset, warnings)
    message = (
        "times with different UTC offsets (a daylight-saving change, or several zones) were "
        "converted to UTC in: "
    )
    return _convert_object_columns(
        df, _is_text, offsets_to_utc, warnings, Warning("mixed_offsets", message)
    )


# A date as written outside ISO 8601: day and month in either order, then a four-digit year,
# separated by dots, slashes or dashes ("31.12.2023", "11/8/2016", "08-11-2016"), or the year
# first with slashes ("2024/01/31"); then optionally a time of day, on a 24-hour clock or with
# AM/PM ("14:30", "2:30:05 PM", "14:30:05.250").
_WRITTEN_DATE_RE = (
    r"^(?:(?P<first>\d{1,2})(?P<sep>[./-])(?P<second>\d{1,2})(?P=sep)(?P<year>\d{4})"
    r"|(?P<y>\d{4})/(?P<m>\d{1,2})/(?P<d>\d{1,2}))"
    r"(?:[ T](?P<hour>\d{1,2}):(?P<minute>\d{2})(?::(?P<sec>\d{2})(?:\.(?P<fraction>\d{1,9}))?)?"
    r"(?:\s*(?P<ampm>[AaPp][Mm]))?)?$"
)
_WRITTEN_DATE = re.compile(_WRITTEN_DATE_RE)
# The times of day a written date may carry, as strptime formats after the date's.
_CLOCKS = (
    "",
    " %H:%M",
    " %H:%M:%S",
    " %H:%M:%S.%f",
    " %I:%M %p",
    " %I:%M:%S %p",
    " %I:%M:%S.%f %p",
)


@dataclass(frozen=True)
class _WrittenDates:
    """A column of written dates, read: the values (None: day and month cannot be told apart)
    and the order they were written in ("day.month.year")."""

    values: pd.Series | None
    order: str
    # strptime's format argument in SQL that reads them (one per order when unclear): a
    # format literal, or a list of two when only some values carry a time
    formats: tuple[str, ...]


def _read_as(text: pd.Series, date_format: str) -> pd.Series | None:
    """`text` as datetimes written in `date_format` with any of _CLOCKS after it; None unless
    every value reads (a 31st of February, hour 25 or 13 PM reads in none)."""
    pieces = []
    left = text
    for clock in _CLOCKS:
        read = pd.to_datetime(left, format=date_format + clock, errors="coerce")
        done = read.notna()
        pieces.append(read[done])
        left = left[~done]
        if left.empty:
            return pd.concat(pieces).reindex(text.index)
    return None


def _written_dates(values: pd.Series) -> _WrittenDates | None:
    """`values` (non-missing text) as dates when every one is a written date of one form, the
    order of day and month told by the values — whichever order reads every value, when only
    one does; dates with dots are day-first when both do (as everywhere they are written so).
    None when they are not all valid dates of one form."""
    text = values.str.strip()
    if not _sample(text).str.fullmatch(_WRITTEN_DATE_RE).all():
        return None  # most text columns: decided on their first values
    if not text.str.fullmatch(_WRITTEN_DATE_RE).all():
        return None
    text = text.str.replace("T", " ", regex=False)
    first = _WRITTEN_DATE.fullmatch(str(text.iloc[0]))
    assert first is not None  # every value matched
    timed = text[text.str.contains(":", regex=False)]
    clock = ""
    if not timed.empty:
        shown = _WRITTEN_DATE.fullmatch(str(timed.iloc[0]))
        assert shown is not None
        twelve = shown.group("ampm") is not None
        clock = " %I:%M" if twelve else " %H:%M"
        clock += ":%S" if shown.group("sec") else ""
        clock += " %p" if twelve else ""
    with_times = " with times" if not timed.empty else ""

    def sql(date_format: str) -> str:
        if clock and len(timed) < len(text):  # strptime tries a list's formats in turn
            return f"['{date_format + clock}', '{date_format}']"
        return f"'{date_format + clock}'"

    if first.group("y") is not None:
        read = _read_as(text, "%Y/%m/%d")
        if read is None:
            return None
        return _WrittenDates(read, "year/month/day" + with_times, (sql("%Y/%m/%d"),))
    sep = first.group("sep")
    day_first, month_first = f"%d{sep}%m{sep}%Y", f"%m{sep}%d{sep}%Y"
    by_day, by_month = _read_as(text, day_first), _read_as(text, month_first)
    if by_day is not None and (by_month is None or sep == "."):
        return _WrittenDates(by_day, f"day{sep}month{sep}year" + with_times, (sql(day_first),))
    if by_month is not None and by_day is None:
        order = f"month{sep}day{sep}year" + with_times
        return _WrittenDates(by_month, order, (sql(month_first),))
    if by_day is not None:
        forms = (sql(day_first), sql(month_first))
        return _WrittenDates(None, f"day{sep}month or month{sep}day", forms)
    return None


def _parse_written_dates(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """Text columns of dates written day-first or month-first (see _written_dates) as
    datetime64, with a warning naming each column's order; a column whose order no value
    tells stays text, with a warning giving the SQL that reads it either way."""
    read: dict[str, str] = {}
    unclear: dict[str, str] = {}

    def rule(col: pd.Series, values: pd.Series) -> Any:
        dates = _written_dates(values)
        if dates is None:
            return None
        name = str(col.name)
        if dates.values is None:
            day_first, month_first = (
                f"strptime({_sql_identifier(name)}, {form})" for form in dates.formats
            )
            unclear[name] = f"{day_first} (day first) or {month_first} (month first)"
            return None
        column = pd.Series(pd.NaT, index=col.index, dtype=dates.values.dtype)
        column.loc[values.index] = dates.values
        read[name] = dates.order
        return column.to_numpy()

    df = _convert_object_columns(df, _is_text, rule, warnings)
    if read:
        listed = ", ".join(f"{name} ({order})" for name, order in read.items())
        warnings.append(
            Warning(
                kind="written_dates",
                message=f"dates written as text were read as dates in: {listed}",
                details={"columns": read},
            )
        )
    if unclear:
        listed = "; ".join(f"{name}: {sql}" for name, sql in unclear.items())
        warnings.append(
            Warning(
                kind="ambiguous_dates",
                message="dates whose day and month no value tells apart (none above 12) were "
                f"kept as text; read them in SQL with {listed}",
                details={"columns": unclear},
            )
        )
    return df


# --------------------------------------------------------------------------------------------
# Excel workbooks

# What Excel shows in a cell whose formula failed; read as a missing value.
EXCEL_ERRORS = frozenset(
    {"#N/A", "#DIV/0!", "#VALUE!", "#REF!", "#NAME?", "#NUM!", "#NULL!", "#GETTING_DATA", "#SPILL!"}
)
# An archive member decompressed beyond this many times the dataset limit is refused before
# it is parsed (the shared strings are held in memory whole): a ZIP bomb dressed as a workbook.
EXCEL_EXPANSION_FACTOR = 4
# How often (in rows) reading a sheet looks whether its call was cancelled: a sheet of a
# million styled but empty rows writes nothing the byte limit would stop.
EXCEL_CANCEL_CHECK_ROWS = 1000


def _check_workbook_archive(opened: IO[bytes], path: Path, limit: int) -> None:
    """Refuse a workbook whose archive says it decompresses to more than the limit allows."""
    try:
        with zipfile.ZipFile(opened) as archive:
            declared = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise HintException(
            "schema", f"could not read {path.name!r} as an Excel workbook: {_first_lines(exc)}"
        ) from exc
    finally:
        opened.seek(0)
    if declared > EXCEL_EXPANSION_FACTOR * limit:
        raise _too_large(path.name, f"its parts decompress to {declared} bytes", limit)


def _cell_text(value: Any) -> str:
    """A cell's value as Excel's own CSV export would write it, dates and times in ISO 8601."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        if value.is_integer() and abs(value) <= MAX_EXACT_FLOAT_INTEGER:
            return str(int(value))
        return repr(value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None and value.time() == datetime.time():
            return value.date().isoformat()
        return value.isoformat(sep=" ")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)


def _chosen_sheet(book: Any, sheet: str | None, path: Path, warnings: list[Warning]) -> Any:
    """The worksheet `sheet` names (its title, or its 1-based position), or without one the
    first visible sheet that looks like a table (see _looks_tabular), with a warning naming the
    others."""
    sheets = list(book.worksheets)
    titles = [str(ws.title) for ws in sheets]
    if not sheets:
        raise HintException("schema", f"{path.name!r} has no worksheets")
    if sheet is not None:
        wanted = sheet.strip()
        for ws in sheets:
            if ws.title == wanted:
                return ws
        for ws in sheets:
            if str(ws.title).strip().casefold() == wanted.casefold():
                return ws
        if wanted.isdigit() and 1 <= int(wanted) <= len(sheets):
            return sheets[int(wanted) - 1]
        raise HintException(
            "schema",
            f"{path.name!r} has no sheet {wanted!r}; its sheets are: "
            + ", ".join(repr(t) for t in titles[:30]),
            _ranked([(_score(wanted, t), t, {"sheet": t}) for t in titles], limit=3),
        )
    visible = [ws for ws in sheets if getattr(ws, "sheet_state", "visible") == "visible"]
    chosen = next(
        (ws for ws in visible if _looks_tabular(ws)), visible[0] if visible else sheets[0]
    )
    others = [str(ws.title) for ws in visible if ws is not chosen]
    if others:
        warnings.append(
            Warning(
                kind="sheets",
                message=f"read sheet {chosen.title!r}; the workbook also has "
                + ", ".join(repr(t) for t in others[:20])
                + " — pass sheet to load another",
                details={"sheet": str(chosen.title), "others": others[:100]},
            )
        )
    return chosen


def _looks_tabular(ws: Any, rows: int = 200) -> bool:
    """Whether one of the worksheet's first `rows` rows has values in two cells or more (a
    contents or notes sheet, text down one column, has not); a sheet read in a child process
    says (see sheet_reader.py, whose TABULAR_ROWS is the same 200)."""
    if isinstance(ws, _ChildSheet):
        return ws.tabular
    for row in ws.iter_rows(max_row=rows, values_only=True):
        raise_if_cancelled()
        if sum(cell is not None and cell != "" for cell in row) >= 2:
            return True
    return False


_MERGE_CELL_RE = re.compile(
    rb'<(?:\w+:)?mergeCell\s+ref="([A-Z]{1,3})(\d{1,7}):([A-Z]{1,3})(\d{1,7})"'
)
MAX_MERGED_RANGES = 100_000


def _column_number(letters: bytes) -> int:
    number = 0
    for letter in letters:
        number = number * 26 + letter - 64
    return number


# A formula cell saved without its value (`<c r="C2"><f>A2*B2</f></c>`): written by a program
# that does not calculate (a script's library), it reads as empty.
_EMPTY_VALUE = rb"(?:<(?:\w+:)?v\s*/>|<(?:\w+:)?v>\s*</(?:\w+:)?v>)?"
_UNCALCULATED_RE = re.compile(
    rb"(?:</(?:\w+:)?f>|<(?:\w+:)?f\b[^>]*/>)\s*" + _EMPTY_VALUE + rb"\s*</(?:\w+:)?c>"
)
# Bytes of a sheet's XML kept from one chunk to the next, so a tag cut between them is seen.
_XML_OVERLAP = 4096


@dataclass
class _SheetFacts:
    """What a worksheet's XML says that openpyxl's read-only rows do not."""

    merged: list[tuple[int, int, int, int]]  # (first row, first column, last row, last column)
    uncalculated: int  # formula cells saved without a value


def _sheet_facts(ws: Any) -> _SheetFacts:
    """The worksheet's merged ranges and uncalculated formulas, read off its XML part in
    chunks; none when the part cannot be read so."""
    if isinstance(ws, _ChildSheet):  # calamine's own list (it keeps formulas' values only)
        return _SheetFacts(ws.merged(), 0)
    merged: set[tuple[int, int, int, int]] = set()
    uncalculated = 0
    carry = b""
    try:
        with ws._get_source() as source:  # openpyxl's own reader of the sheet's part
            while chunk := source.read(READ_CHUNK_BYTES):
                text = carry + chunk
                for match in _MERGE_CELL_RE.finditer(text):
                    if match.end() > len(carry) and len(merged) < MAX_MERGED_RANGES:
                        c1, r1, c2, r2 = match.groups()
                        merged.add((int(r1), _column_number(c1), int(r2), _column_number(c2)))
                uncalculated += sum(
                    1 for m in _UNCALCULATED_RE.finditer(text) if m.end() > len(carry)
                )
                carry = text[-_XML_OVERLAP:]
    except (AttributeError, OSError, zipfile.BadZipFile, KeyError) as exc:
        logger.info("could not read sheet %r's XML: %s", getattr(ws, "title", "?"), exc)
        return _SheetFacts([], 0)
    return _SheetFacts(sorted(merged), uncalculated)


def _sheet_as_csv(ws: Any, path: Path, limit: int, warnings: list[Warning]) -> bytes:
    """The worksheet as UTF-8 CSV, every row as wide as the widest (as Excel's own export
    writes it), blank rows kept but not those after the last value; at most `limit` bytes.
    Cells holding an Excel error (#N/A, #DIV/0!…) are written empty, counted in a warning. A
    merged cell's value is repeated into every cell it covers (a category merged down the
    rows it labels, a group label across its columns), with a warning."""
    if hasattr(ws, "reset_dimensions"):
        ws.reset_dimensions()  # the file's own dimension tag may be wrong (or hostile)
    starts: dict[int, list[tuple[int, int, int]]] = {}
    facts = _sheet_facts(ws)
    merged = facts.merged
    for r1, c1, r2, c2 in merged:
        starts.setdefault(r1, []).append((c1, c2, r2))
    active: list[tuple[int, int, int, Any]] = []  # (first column, last, last row, value)
    rows: list[list[str]] = []
    width = 0
    size = 0
    errors: dict[str, int] = {}
    pending_blank = 0
    for number, row_values in enumerate(ws.iter_rows(values_only=True)):
        if number % EXCEL_CANCEL_CHECK_ROWS == 0:
            raise_if_cancelled()  # a cancelled (or timed-out) call stops reading the sheet
        values = list(row_values)
        if merged:
            values = _with_merges(values, number + 1, starts, active)
        cells = []
        for value in values:
            if isinstance(value, str) and value in EXCEL_ERRORS:
                errors[value] = errors.get(value, 0) + 1
                value = None
            cells.append(_cell_text(value))
        while cells and cells[-1] == "":
            cells.pop()
        if not cells:
            pending_blank += 1
            continue
        rows.extend([] for _ in range(pending_blank))
        pending_blank = 0
        rows.append(cells)
        width = max(width, len(cells))
        size += sum(len(cell) + 1 for cell in cells)
        if size > limit:
            raise _too_large(path.name, f"over {limit} bytes of cells", limit)
    text = _csv_bytes(cells + [""] * (width - len(cells)) if cells else [] for cells in rows)
    if merged:
        warnings.append(
            Warning(
                kind="merged_cells",
                message=f"{len(merged)} merged cell range(s): each one's value was repeated "
                "into every cell it covers",
                details={"ranges": len(merged)},
            )
        )
    if facts.uncalculated:
        warnings.append(
            Warning(
                kind="uncalculated_formulas",
                message=f"{facts.uncalculated} formula cell(s) were saved without a value "
                "(the workbook was written by a program that does not calculate): they read "
                "as empty; open and save it in a spreadsheet program to have them calculated",
                details={"cells": facts.uncalculated},
            )
        )
    if errors:
        counted = ", ".join(f"{error} ×{n}" for error, n in sorted(errors.items()))
        warnings.append(
            Warning(
                kind="excel_errors",
                message=f"cells showing an Excel error were read as missing: {counted}",
                details={"errors": errors},
            )
        )
    return text


def _with_merges(
    values: list[Any],
    row: int,
    starts: dict[int, list[tuple[int, int, int]]],
    active: list[tuple[int, int, int, Any]],
) -> list[Any]:
    """Row `row`'s values with the merged ranges over it filled from their first cell
    (`active` carries the ranges begun above, and is updated)."""
    for c1, c2, r2 in starts.get(row, ()):
        active.append((c1, c2, r2, values[c1 - 1] if c1 <= len(values) else None))
    active[:] = [entry for entry in active if entry[2] >= row]
    for c1, c2, _, value in active:
        if value is None:
            continue
        if len(values) < c2:
            values.extend([None] * (c2 - len(values)))
        for column in range(c1, c2 + 1):
            values[column - 1] = value
    return values


# The spreadsheet reader's child process (sheet_reader.py): its memory cap (at least this, or
# this many times the dataset limit), and how many run at once in a registry.
SHEET_READER_MIN_MEMORY = 768 << 20
SHEET_READER_MEMORY_FACTOR = 6
SHEET_READERS = 2
_sheet_readers = threading.BoundedSemaphore(SHEET_READERS)
_SHEET_READER = Path(__file__).with_name("sheet_reader.py")


def _decoded_cell(value: Any) -> Any:
    if isinstance(value, dict):
        if "datetime" in value:
            return datetime.datetime.fromisoformat(value["datetime"])
        if "date" in value:
            return datetime.date.fromisoformat(value["date"])
        if "time" in value:
            return datetime.time.fromisoformat(value["time"])
        if "timedelta" in value:
            return datetime.timedelta(seconds=float(value["timedelta"]))
        return None
    return None if value == "" else value


class _ChildSheet:
    """A worksheet of the child reader's, as the spreadsheet reading expects one of openpyxl's
    read-only sheets to be (title, visibility, rows of values — streamed from the child)."""

    def __init__(self, reader: _SheetReader, position: int, title: str, visible: bool) -> None:
        self._reader = reader
        self._position = position
        self.title = title
        self.sheet_state = "visible" if visible else "hidden"
        self.tabular = False

    def iter_rows(self, max_row: int | None = None, values_only: bool = True) -> Iterator[Any]:
        rows = self._reader.rows(self._position)
        return itertools.islice(rows, max_row) if max_row is not None else rows

    def merged(self) -> list[tuple[int, int, int, int]]:
        return self._reader.merged(self._position)


class _SheetReader:
    """A spreadsheet read by calamine in a child process capped in memory (see
    sheet_reader.py): a file whose grid would take more is refused as too large, and the
    registry keeps its memory. The call's cancellation kills the child, as does close()."""

    def __init__(self, opened: IO[bytes], path: Path, limit: int, what: str) -> None:
        import subprocess

        self._path, self._limit, self._what = path, limit, what
        self._memory = max(SHEET_READER_MIN_MEMORY, SHEET_READER_MEMORY_FACTOR * limit)
        fd = opened.fileno()
        self._child = subprocess.Popen(
            [
                sys.executable,
                "-I",
                str(_SHEET_READER),
                str(fd),
                str(self._memory),
                str(2 * limit),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=(fd,),
            close_fds=True,
        )
        assert self._child.stdout is not None
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._child.stdout, selectors.EVENT_READ)
        self._buffered = b""
        self._asked: int | None = None
        self._merged: list[tuple[int, int, int, int]] = []
        self.worksheets: list[_ChildSheet] = []

    def __enter__(self) -> _SheetReader:
        try:
            listing = self._next()
            self.worksheets = [
                _ChildSheet(self, k, str(s["name"]), bool(s["visible"]))
                for k, s in enumerate(listing["sheets"])
            ]
            for ws, s in zip(self.worksheets, listing["sheets"], strict=True):
                ws.tabular = bool(s["tabular"])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._selector.close()
        if self._child.poll() is None:
            self._child.kill()
        self._child.wait()
        for pipe in (self._child.stdin, self._child.stdout):
            if pipe is not None:
                pipe.close()

    def _ask(self, position: int) -> None:
        """Ask for worksheet `position` (one sheet per reader: the one chosen) and read its
        merged ranges, which come before its rows."""
        if self._asked is not None:
            if self._asked != position:
                raise AssertionError("the sheet reader sends one sheet")
            return
        self._asked = position
        assert self._child.stdin is not None
        self._child.stdin.write(f"{position}\n".encode())
        self._child.stdin.flush()
        self._merged = [
            (int(r1), int(c1), int(r2), int(c2)) for r1, c1, r2, c2 in self._next()["merged"]
        ]

    def merged(self, position: int) -> list[tuple[int, int, int, int]]:
        self._ask(position)
        return self._merged

    def rows(self, position: int) -> Iterator[list[Any]]:
        """The rows of worksheet `position`."""
        self._ask(position)
        while True:
            item = self._next()
            if isinstance(item, list):
                yield [_decoded_cell(v) for v in item]
            else:
                return  # {"end": true}

    def _next(self) -> Any:
        """The child's next message; its failures raised as what they mean."""
        assert self._child.stdout is not None
        while b"\n" not in self._buffered:
            raise_if_cancelled()
            if not self._selector.select(timeout=0.2):
                continue
            chunk = os.read(self._child.stdout.fileno(), 1 << 20)
            if not chunk:
                self._failed({})
            self._buffered += chunk
        line, self._buffered = self._buffered.split(b"\n", 1)
        item = json.loads(line)
        if isinstance(item, dict) and not {"sheets", "merged", "end"} & item.keys():
            self._failed(item)
        return item

    def _failed(self, said: dict[str, Any]) -> None:
        try:
            status = self._child.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a child that will not end is killed by close()
            status = None
        name, limit = self._path.name, self._limit
        if said.get("too_large"):
            raise _too_large(name, f"its cells come to over {2 * limit} bytes", limit)
        if said.get("memory") or (status is not None and status < 0):
            raise _too_large(
                name,
                f"reading it takes more than {self._memory >> 20} MiB of memory (a sheet whose "
                "cells span a grid far larger than the data in it)",
                limit,
            )
        reason = str(said.get("error") or f"the reader stopped (status {status})")[:300]
        raise HintException("schema", f"could not read {name!r} as {self._what}: {reason}")


def _read_calamine(
    opened: IO[bytes],
    path: Path,
    sheet: str | None,
    header: bool | None,
    limit: int,
    warnings: list[Warning],
    what: str,
) -> pd.DataFrame:
    """A sheet of an OpenDocument spreadsheet or an Excel 97-2003 workbook (`what` names it)
    as a DataFrame, read with python-calamine (Rust; its XML parser expands no entities) in a
    child process, then as its CSV export, as a workbook is (see _read_excel)."""
    with _sheet_readers, _SheetReader(opened, path, limit, what) as book:
        ws = _chosen_sheet(book, sheet, path, warnings)
        text = _sheet_as_csv(ws, path, limit, warnings)
    return _sheet_frame(text, path, ws.title, header, limit, warnings)


def _sheet_frame(
    text: bytes, path: Path, title: str, header: bool | None, limit: int, warnings: list[Warning]
) -> pd.DataFrame:
    """A sheet written as CSV (see _sheet_as_csv), read as any CSV is."""
    if not text.strip():
        raise HintException("schema", f"sheet {title!r} of {path.name!r} is empty")
    shown = Path(f"{path.name} [{title}]")
    return _read_csv(io.BytesIO(text), shown, ",", header, limit, warnings)


def _read_excel(
    opened: IO[bytes],
    path: Path,
    sheet: str | None,
    header: bool | None,
    limit: int,
    warnings: list[Warning],
) -> pd.DataFrame:
    """A worksheet of the workbook as a DataFrame: its cells' values (formulas as last
    calculated) written as CSV, then read as any CSV is — the notes above and below a table,
    a total row, the types of its text — so a workbook and its CSV export load alike."""
    if _peek(opened).startswith(OLE_MAGIC):  # Excel 97-2003, whatever its name
        # Not compressed: the file's size, checked against the limit already, bounds it.
        what = "an Excel 97-2003 workbook (.xls)"
        return _read_calamine(opened, path, sheet, header, limit, warnings, what)
    _check_workbook_archive(opened, path, limit)
    if path.suffix.lower() in ODS_SUFFIXES:
        what = "an OpenDocument spreadsheet"
        return _read_calamine(opened, path, sheet, header, limit, warnings, what)
    import openpyxl  # imported when a workbook is read: most registries never read one

    try:
        book = openpyxl.load_workbook(opened, read_only=True, data_only=True)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, TypeError, EOFError) as exc:
        raise HintException(
            "schema",
            f"could not read {path.name!r} as an Excel workbook: "
            f"{_first_lines(exc) or type(exc).__name__}; save it again from a spreadsheet "
            "program, or as CSV",
        ) from exc
    except Exception as exc:  # defusedxml's refusals of entity tricks, and parser errors
        raise HintException(
            "schema",
            f"could not read {path.name!r} as an Excel workbook: {type(exc).__name__}: "
            f"{_first_lines(exc)}",
        ) from exc
    try:
        ws = _chosen_sheet(book, sheet, path, warnings)
        try:
            text = _sheet_as_csv(ws, path, limit, warnings)
        except (DatasetTooLarge, HintException):
            raise
        except Exception as exc:  # a malformed sheet part
            raise HintException(
                "schema",
                f"could not read sheet {ws.title!r} of {path.name!r}: {type(exc).__name__}: "
                f"{_first_lines(exc)}",
            ) from exc
        title = str(ws.title)
    finally:
        book.close()
    return _sheet_frame(text, path, title, header, limit, warnings)


# --------------------------------------------------------------------------------------------
# JSON


def _flattened(table: pa.Table) -> pa.Table:
    """`table` with its struct columns spread into columns named `parent.child`, at any depth
    (lists stay lists)."""
    while any(pa.types.is_struct(field.type) for field in table.schema):
        table = table.flatten()
    return table


def _json_records(table: pa.Table, warnings: list[Warning]) -> pa.Table:
    """The records of a document that holds them under one key (`{"count": 2, "data": [...]}`,
    as APIs answer): one row whose only list of objects is the table, with a warning naming the
    key and the fields left out."""
    if table.num_rows != 1:
        return table
    lists = [
        field.name
        for field in table.schema
        if pa.types.is_list(field.type) and pa.types.is_struct(field.type.value_type)
    ]
    if len(lists) != 1:
        return table
    key = lists[0]
    records = pc.list_flatten(table.column(key).combine_chunks())
    others = [name for name in table.column_names if name != key]
    left_out = f"; the document's other fields were not loaded: {', '.join(others)}"
    warnings.append(
        Warning(
            kind="records",
            message=f"read the {len(records)} records under {key!r}" + (left_out if others else ""),
            details={"key": key, "other_fields": others},
        )
    )
    return pa.Table.from_struct_array(records)


def _read_json(opened: IO[bytes], path: Path, limit: int, warnings: list[Warning]) -> pd.DataFrame:
    """A JSON file (an array of records, records one per line, or a document holding its records
    under a key) as a DataFrame, read by DuckDB's JSON reader — types inferred, dates and times
    in strings recognised, nested objects spread into `parent.child` columns. DuckDB reads the
    very file opened (through /proc/self/fd), within a memory limit; more than `limit` bytes
    read is DatasetTooLarge."""
    suffix = path.suffix.lower()
    compression = JSON_COMPRESSIONS.get(suffix, "none")
    if suffix in COMPRESSION_SUFFIXES and suffix not in JSON_COMPRESSIONS:
        raise _unsupported(
            path.name, f"JSON compressed as {suffix}", "decompress it, or use .gz or .zst"
        )
    shown = f"/proc/self/fd/{opened.fileno()}"
    # The largest value DuckDB holds at once: a record, or a whole document that holds its
    # records under a key — at most the file (compressed: the limit), at least its default.
    size = os.fstat(opened.fileno()).st_size
    largest = max(JSON_MIN_OBJECT_BYTES, min(limit if compression != "none" else size + 1, limit))
    memory = JSON_MEMORY_FACTOR * largest + (256 << 20)
    # No spilling to disk either (see DUCKDB_CONFIG): over the memory limit is DatasetTooLarge.
    con = duckdb.connect(
        ":memory:",
        config={"memory_limit": f"{memory >> 20}MB", "threads": 1, "temp_directory": ""},
    )
    watchdog = _Watchdog(con, QUERY_TIMEOUT_CAP_S)  # a cancelled call interrupts the read
    try:
        with watchdog:
            relation = con.sql(
                "SELECT * FROM read_json(?, compression => ?, maximum_object_size => ?)",
                params=[shown, compression, largest],
            )
            reader = relation.to_arrow_reader(PARQUET_BATCH_ROWS)
            batches = _batches_within(reader, path.name, limit, "read")
            table = pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.InterruptException as exc:
        if watchdog.cancelled:
            raise CallCancelled("the load's call was cancelled") from exc
        raise QueryTimeout(
            f"reading {path.name!r} took longer than {QUERY_TIMEOUT_CAP_S:g}s"
        ) from exc
    except duckdb.OutOfMemoryException as exc:
        raise _too_large(path.name, "more than its memory limit to parse", limit) from exc
    except (duckdb.Error, pa.ArrowException) as exc:
        said = (_first_lines(exc).splitlines() or [type(exc).__name__])[0]
        raise HintException(
            "schema",
            f"could not read {path.name!r} as JSON: {said.replace(shown, path.name)}; "
            "load_dataset reads an array of objects, one object per line, or a document "
            "holding an array of objects under a key",
        ) from exc
    finally:
        con.close()
    table = _flattened(_json_records(table, warnings))
    if table.num_columns == 0 or table.num_rows == 0:
        raise HintException(
            "schema", f"could not read {path.name!r} as JSON: it holds no records to load"
        )
    names = _sql_column_names(table.column_names, warnings)
    if names != table.column_names:
        table = table.rename_columns(names)
    return _arrow_to_pandas(table, warnings)


def _batches_within(
    batches: Iterable[pa.RecordBatch], name: str, limit: int, done: str
) -> list[pa.RecordBatch]:
    """The record batches a reader gives, DatasetTooLarge as soon as they pass `limit` bytes
    (`done`: what the reader did to make them, for the message)."""
    kept: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        size += batch.nbytes
        if size > limit:
            raise _too_large(name, f"more than {size} bytes {done}", limit)
        kept.append(batch)
    return kept


def _read_parquet(
    opened: IO[bytes], path: Path, limit: int, warnings: list[Warning]
) -> pd.DataFrame:
    """The Parquet file as a DataFrame. Refused when its footer says it decodes to more than
    `limit` bytes (encoded sizes, or rows × width for fixed-width columns: run-length encoded
    zeros take no space on disk), or when the batches read so far reach it."""
    try:
        parquet = pq.ParquetFile(opened)
        estimate = _parquet_size_estimate(parquet)
        if estimate > limit:
            raise _too_large(path.name, f"about {estimate} bytes decoded", limit)
        batches = _batches_within(
            parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS), path.name, limit, "decoded"
        )
        schema = batches[0].schema if batches else parquet.schema_arrow
        table = pa.Table.from_batches(batches, schema=schema).replace_schema_metadata(
            parquet.schema_arrow.metadata
        )
    except (pa.ArrowException, OSError) as exc:  # not Parquet, truncated, a corrupt page
        raise HintException(
            "schema",
            f"could not read {path.name!r} as Parquet: {_first_lines(exc)}; the file is corrupt "
            "or truncated, or not Parquet (pass format='csv' if it is a CSV file)",
        ) from exc
    # Renamed here, once (load_dataset's renaming then finds nothing to do): Arrow and pandas
    # need unique names, and SQL names that differ even ignoring case.
    names = _sql_column_names(table.column_names, warnings)
    if names != table.column_names:  # (renaming drops the pandas metadata: its index)
        table = table.rename_columns(names)
    table = _maps_as_entries(table, warnings)
    return _index_as_columns(_arrow_to_pandas(table, warnings), warnings)


def _index_as_columns(df: pd.DataFrame, warnings: list[Warning]) -> pd.DataFrame:
    """A pandas index the file stores (`__index_level_0__`, or a named one) as leading
    columns, with a warning: the stored dataset keeps columns only, and would lose it. A range
    index (0, 1, 2, … kept in the metadata alone) holds no data and is dropped."""
    if isinstance(df.index, pd.RangeIndex):
        return df.reset_index(drop=True)
    names = [
        str(name) if name is not None else ("index" if df.index.nlevels == 1 else f"level_{i}")
        for i, name in enumerate(df.index.names)
    ]
    df = df.reset_index(allow_duplicates=True)
    df.columns = pd.Index(sql_names([*names, *df.columns[len(names) :]]))
    warnings.append(
        Warning(
            kind="index_columns",
            message="the file's pandas index was kept as column(s): "
            + ", ".join(str(c) for c in df.columns[: len(names)]),
        )
    )
    return df


def _parquet_size_estimate(parquet: pq.ParquetFile) -> int:
    """A lower bound of the bytes the file decodes to, from its footer alone."""
    meta = parquet.metadata
    widths = [
        (field.type.bit_width + 7) // 8 if pa.types.is_primitive(field.type) else 0
        for field in parquet.schema_arrow
    ]
    total = 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        fixed = group.num_rows * sum(widths)
        total += max(group.total_byte_size, fixed)
    return total


def _sqlite_tables(con: Any) -> tuple[list[str], list[str]]:
    """The database's tables (virtual ones included) and views, in the order created; its own
    sqlite_ tables left out."""
    tables: list[str] = []
    views: list[str] = []
    for kind, name in con.execute(
        "SELECT type, name FROM sqlite_schema WHERE type IN ('table', 'view') "
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid"
    ):
        (tables if kind == "table" else views).append(str(name))
    return tables, views


def _sqlite_column(name: str, values: list[Any], mixed: list[str]) -> pa.Array:
    """A column of SQLite values (each row's own type) as one Arrow type: integers, floats
    (integers among floats as floats), text or bytes; a column mixing text with numbers or
    bytes as text (named in `mixed`)."""
    kinds = {type(v) for v in values if v is not None}
    if not kinds or kinds == {str}:
        return pa.array(values, type=pa.string())
    if kinds == {int}:
        return pa.array(values, type=pa.int64())
    if kinds <= {int, float}:
        return pa.array([float(v) if v is not None else None for v in values], type=pa.float64())
    if kinds == {bytes}:
        return pa.array(values, type=pa.binary())
    mixed.append(name)
    return pa.array(
        [v.hex() if isinstance(v, bytes) else (None if v is None else str(v)) for v in values],
        type=pa.string(),
    )


def _read_sqlite(
    opened: IO[bytes], path: Path, table: str | None, limit: int, warnings: list[Warning]
) -> tuple[pd.DataFrame, str]:
    """A table of the SQLite database on `opened` as a DataFrame, with the table's name: the
    one `table` names, or the only one. Opened read-only and immutable (no lock, no journal
    looked for) from the very file opened; the schema untrusted (trusted_schema off, and
    views are not read: a view is a query the file's author wrote); the read stops at the
    byte limit, and when the call is cancelled."""
    import sqlite3

    uri = f"file:/proc/self/fd/{opened.fileno()}?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    except sqlite3.Error as exc:
        raise HintException(
            "schema", f"could not open {path.name!r} as a SQLite database: {_first_lines(exc)}"
        ) from exc
    cancelled: list[bool] = []

    def progress() -> int:
        try:
            raise_if_cancelled()
        except CallCancelled:
            cancelled.append(True)
            return 1  # interrupts the statement
        return 0

    try:
        con.execute("PRAGMA trusted_schema = OFF")
        con.execute("PRAGMA query_only = ON")
        # No value past the byte limit (a generated column of zeroblob(1e9) would take 1 GB
        # a row); the cancellation looked at every thousand steps of the statement.
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(1, min(limit, 1_000_000_000)))
        con.set_progress_handler(progress, 1000)
        tables, views = _sqlite_tables(con)
        names = [*tables, *views]
        chosen: str | None = None
        if table is not None:
            wanted = table.strip()
            chosen = next((t for t in names if t == wanted), None) or next(
                (t for t in names if t.casefold() == wanted.casefold()), None
            )
            if chosen is None:
                raise HintException(
                    "schema",
                    f"{path.name!r} has no table {wanted!r}; its tables are: "
                    + (", ".join(repr(t) for t in tables[:30]) or "none"),
                    _ranked([(_score(wanted, t), t, {"table": t}) for t in tables], limit=3),
                )
        elif len(tables) == 1:
            chosen = tables[0]
        elif not tables:
            raise HintException("schema", f"the SQLite database {path.name!r} has no tables")
        else:
            raise HintException(
                "fetch",
                f"the SQLite database {path.name!r} holds {len(tables)} tables: name the one to "
                "load with table=... (load each you need under its own name): "
                + ", ".join(repr(t) for t in tables[:30])
                + (f" and {len(tables) - 30} more" if len(tables) > 30 else ""),
                [{"label": f"table={t!r}", "score": 1.0, "action": "add"} for t in tables[:5]],
            )
        if chosen in views:
            raise HintException(
                "schema",
                f"{chosen!r} is a view of {path.name!r}, and views are not loaded (a view is a "
                "query stored in the file): load the tables it reads and query them",
                [{"label": f"table={t!r}", "score": 0.5, "action": "add"} for t in tables[:5]],
            )
        quoted = '"' + chosen.replace('"', '""') + '"'
        cursor = con.execute(f"SELECT * FROM {quoted}")  # a name the database listed, quoted
        header = [str(d[0]) for d in cursor.description]
        columns: list[list[Any]] = [[] for _ in header]
        size = 0
        for row in cursor:  # one row at a time: the limit holds within a batch too
            for column, value in zip(columns, row, strict=True):
                column.append(value)
                size += len(value) if isinstance(value, (str, bytes)) else 8
            if size > limit:
                raise _too_large(path.name, f"table {chosen!r} holds over {limit} bytes", limit)
    except sqlite3.Error as exc:
        if cancelled:
            raise CallCancelled("the call was cancelled while reading the database") from exc
        raise HintException(
            "schema", f"could not read {path.name!r} as a SQLite database: {_first_lines(exc)}"
        ) from exc
    finally:
        con.close()
    mixed: list[str] = []
    table_pa = pa.table(
        [_sqlite_column(n, v, mixed) for n, v in zip(header, columns, strict=True)],
        names=_sql_column_names(header, warnings),
    )
    if mixed:
        warnings.append(
            Warning(
                kind="mixed_types",
                message="column(s) holding text beside numbers or bytes were loaded as text: "
                + ", ".join(mixed[:20]),
                details={"columns": mixed[:100]},
            )
        )
    return _arrow_to_pandas(table_pa, warnings), chosen


def load_dataset(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    """Load a CSV, Parquet or Excel file inside the data roots as a dataset of the
    conversation."""
    raw_path = _required_str(inputs, "path")
    explicit_name = _str_input(inputs, "name", required=False)
    requested_format = _str_input(inputs, "format", required=False) or "auto"
    raw_delimiter = _str_input(inputs, "delimiter", required=False)
    raw_sheet = inputs.get("sheet")
    sheet = (
        str(raw_sheet)
        if isinstance(raw_sheet, int) and not isinstance(raw_sheet, bool)
        else (_str_input(inputs, "sheet", required=False))
    )
    header = inputs.get("header")
    if header is not None and not isinstance(header, bool):
        raise HintException("schema", f"`header` must be true or false, not {header!r}"[:300])
    table_name = _str_input(inputs, "table", required=False)
    if explicit_name is not None:
        _check_identifier(explicit_name, "name")

    roots = _data_roots(context)
    limit = _max_dataset_bytes(context)
    path = _resolve_input_path(raw_path, roots)  # refuses before anything is opened

    warnings: list[Warning] = []
    with _open_regular(path, raw_path, roots) as opened:
        file_format = _detect_format(path, requested_format.lower(), opened, warnings)
        size = os.fstat(opened.fileno()).st_size
        if size > limit:
            raise _too_large(path.name, f"{size} bytes", limit)
        if file_format == "csv":
            delimiter = _delimiter(raw_delimiter, path)
            df = _read_csv(opened, path, delimiter, header, limit, warnings)
        elif file_format == "excel":
            df = _read_excel(opened, path, sheet, header, limit, warnings)
        elif file_format == "json":
            df = _read_json(opened, path, limit, warnings)
        elif file_format == "sqlite":
            df, table_name = _read_sqlite(opened, path, table_name, limit, warnings)
        else:
            df = _read_parquet(opened, path, limit, warnings)
    df = _sql_named_columns(df, warnings)

    # A database's table is named after the table (a file holds many), anything else after
    # the file.
    stem = table_name if file_format == "sqlite" and table_name else _file_stem(path)
    named_by = "table" if file_format == "sqlite" else "file"
    name = explicit_name if explicit_name is not None else sanitize_identifier(stem)
    if explicit_name is None and name != stem:
        warnings.append(
            Warning(
                kind="renamed",
                message=f"saved as dataset {name!r} ({named_by} name {stem!r} is not a SQL name)",
                details={"name": name},
            )
        )
    if any(info.name == name for info in context.list_datasets()):
        warnings.append(Warning(kind="replaced", message=f"replaced the existing dataset {name!r}"))
    context.save_dataset(name, df, source=str(path))
    logger.info("loaded %s as dataset %r (%d rows)", path, name, len(df))
    # The first rows only: the dataset is stored, and the whole of it in the result would
    # travel to the caller and into the conversation's event log.
    preview = df.iloc[:PREVIEW_DEFAULT_LIMIT]
    return _ok(Ok(rows=len(df), schema=measure_schema(df), data=preview, warnings=warnings))


migrate_tool(load_dataset, "load_dataset", is_tabular=True)


# --------------------------------------------------------------------------------------------
# preview_data and describe_entry


def preview_data(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    """A window of a dataset's rows, with its true row count and full-dataset schema."""
    warnings: list[Warning] = []
    name = _required_str(inputs, "name")
    limit = _int_input(
        inputs,
        "limit",
        default=PREVIEW_DEFAULT_LIMIT,
        minimum=1,
        maximum=PREVIEW_MAX_LIMIT,
        warnings=warnings,
    )
    offset = _int_input(inputs, "offset", default=0, minimum=0, maximum=None, warnings=warnings)
    resolved, df = _load_named(context, name)
    total = len(df)
    if offset > 0 and offset >= total:
        raise HintException(
            "fetch",
            f"offset {offset} is past the end of {resolved!r}, which has {total} row(s)",
            [{"label": f"offset={max(0, total - limit)}", "score": 1.0, "action": "narrow"}],
        )
    window = df.iloc[offset : offset + limit]
    return _ok(Ok(rows=total, schema=measure_schema(df), data=window, warnings=warnings))


migrate_tool(preview_data, "preview_data", is_tabular=True)


# Python objects pandas keeps in object columns that are numbers or dates all the same
# (Parquet's DATE and DECIMAL, DuckDB's DATE and TIME).
_ORDERED_OBJECTS = (datetime.date, datetime.time, decimal.Decimal)


def _min_max(col: pd.Series) -> tuple[str | None, str | None]:
    """Min and max of a numeric or date/time column as text; (None, None) otherwise."""
    dtype = col.dtype
    if pd.api.types.is_object_dtype(dtype):
        values = col.dropna()
        kinds = {type(v) for v in values}
        if values.empty or len(kinds) != 1 or not issubclass(kinds.pop(), _ORDERED_OBJECTS):
            return None, None
        try:
            return str(min(values)), str(max(values))
        except (TypeError, decimal.InvalidOperation):  # NaN decimals, aware with naive times
            return None, None
    if pd.api.types.is_bool_dtype(dtype) or not (
        pd.api.types.is_numeric_dtype(dtype)
        or pd.api.types.is_datetime64_any_dtype(dtype)
        or pd.api.types.is_timedelta64_dtype(dtype)
    ):
        return None, None
    values = col.dropna()
    if values.empty:
        return None, None
    return str(values.min()), str(values.max())


TOP_VALUES = 3  # the most frequent values describe_entry shows of a text-like column
TOP_VALUE_CHARS = 40  # each shown at most this long


def _top_values(col: pd.Series, distinct: int | None = None) -> str | None:
    """The most frequent values of a text, categorical or boolean column with their counts
    ("Rome ×3, Oslo ×2"), so a model filters on the values as they are spelt; None for numeric
    and date/time columns (min/max describe those) and for a column with no value. With
    `distinct` (its distinct count, when known) saying every value is unique, its first values
    are shown without counting them all."""
    dtype = col.dtype
    if not (
        pd.api.types.is_object_dtype(dtype)
        or pd.api.types.is_string_dtype(dtype)
        or isinstance(dtype, pd.CategoricalDtype)
        or pd.api.types.is_bool_dtype(dtype)
    ):
        return None
    try:
        values = col.dropna()
        if distinct is not None and distinct == len(values):
            counts = pd.Series(1, index=values.head(TOP_VALUES).to_numpy())
        else:
            counts = values.value_counts().head(TOP_VALUES)
    except TypeError:  # unhashable values (lists, dicts) in an object column
        return None
    if counts.empty:
        return None
    shown = []
    for value, count in counts.items():
        if isinstance(value, (list, tuple, np.ndarray)):
            # A list (JSON's arrays), as the preview writes it, not numpy's "['p' 'q']".
            listed = value.tolist() if isinstance(value, np.ndarray) else list(value)
            text = json.dumps(listed, ensure_ascii=False, default=str, separators=(",", ":"))
        else:
            text = str(value)
        if len(text) > TOP_VALUE_CHARS:
            text = text[: TOP_VALUE_CHARS - 1] + "…"
        shown.append(f"{text} ×{count}")
    return ", ".join(shown)


@uniform_contract(name="describe_entry", is_tabular=True)
def describe_entry(inputs: dict[str, Any], context: ToolContext) -> Envelope:
    """Per-column dtype, null/distinct counts, numeric/date min/max and the most frequent
    values of text-like columns, of a dataset."""
    name = _required_str(inputs, "name")
    _, df = _load_named(context, name)
    schema = measure_schema(df)
    records: list[dict[str, Any]] = []
    for position, spec in enumerate(schema):
        col = df.iloc[:, position]
        low, high = _min_max(col)
        records.append(
            {
                "column": spec.name,
                "dtype": spec.dtype,
                "null_count": spec.null_count,
                "distinct_count": spec.distinct_count,
                "min": low,
                "max": high,
                "top_values": _top_values(col, spec.distinct_count),
            }
        )
    description = pd.DataFrame(
        {
            "column": pd.Series([r["column"] for r in records], dtype="str"),
            "dtype": pd.Series([r["dtype"] for r in records], dtype="str"),
            "null_count": pd.Series([r["null_count"] for r in records], dtype="Int64"),
            "distinct_count": pd.Series([r["distinct_count"] for r in records], dtype="Int64"),
            "min": pd.Series([r["min"] for r in records], dtype="str"),
            "max": pd.Series([r["max"] for r in records], dtype="str"),
            "top_values": pd.Series([r["top_values"] for r in records], dtype="str"),
        }
    )
    return Ok(rows=len(records), schema=schema, data=description)


# --------------------------------------------------------------------------------------------
# query

_REFUSAL_ADVICE: dict[str, tuple[str, ...]] = {
    "CREATE": ("a SELECT computing the table, with save_as=<name> to keep it as a dataset",),
    "INSERT": ("a SELECT combining the rows (e.g. UNION ALL), with save_as=<name>",),
    "UPDATE": ("a SELECT computing the changed rows, with save_as=<name>",),
    "DELETE": ("a SELECT with a WHERE that keeps the wanted rows, with save_as=<name>",),
    "ALTER": ("a SELECT with the renamed/added columns, with save_as=<name>",),
    "DROP": ("nothing: datasets are replaced by saving again under the same name",),
    "COPY": ("load_dataset(path=...) to read a file from the data directories",),
    "EXPORT": ("load_dataset(path=...) to read a file from the data directories",),
    "ATTACH": ("load_dataset(path=...) to read a file from the data directories",),
    "LOAD": ("SQL using built-in functions only; extensions cannot be installed",),
    "PRAGMA": ("DESCRIBE <table> or SHOW TABLES",),
    "MULTI": ("PIVOT ... ON <column> IN (<values>) ... with an explicit value list",),
}


# A quoted string, a quoted identifier, or a comment: where a word is not SQL.
_SQL_NOT_CODE_RE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.DOTALL)


def _sql_identifier(name: str) -> str:
    """`name` as a quoted SQL identifier (DuckDB: double quotes, doubled inside)."""
    return '"' + name.replace('"', '""') + '"'


def _sql_literal(text: str) -> str:
    """`text` as a SQL string literal (single quotes, doubled inside)."""
    return "'" + text.replace("'", "''") + "'"


def _retry_with(sql: str) -> list[dict[str, Any]]:
    """A Hint's one alternative: this SQL, to send instead."""
    return [{"label": clip(sql, MAX_MESSAGE_CHARS), "score": 1.0, "action": "retry"}]


def _quote_names_hint(message: str, fix: tuple[list[str], str], why: str) -> HintException:
    """DuckDB's `message`, and the SQL with the column names `fix` found (which `why`)
    written in double quotes."""
    names, rewritten = fix
    which = ", ".join(repr(n) for n in names)
    return HintException(
        "schema",
        f"{message}\ncolumn name(s) {which} {why}: write them in double quotes, as in the "
        "alternative",
        _retry_with(rewritten),
    )


def _quote_words(sql: str, names: Sequence[str]) -> str:
    """`sql` with every bare occurrence of `names` (case-insensitive words outside strings,
    quoted identifiers and comments) written as a quoted identifier."""
    word = re.compile(
        r"(?<![\w.\"])(" + "|".join(re.escape(n) for n in names) + r")(?![\w\"])", re.IGNORECASE
    )
    exact = {n.lower(): n for n in names}

    def quoted(match: re.Match[str]) -> str:
        return _sql_identifier(exact[match.group(1).lower()])

    return _sub_in_code(sql, word, quoted)


def _sub_in_code(
    sql: str, pattern: re.Pattern[str], replacement: str | Callable[[re.Match[str]], str]
) -> str:
    """`sql` with `pattern` replaced outside strings, quoted identifiers and comments."""
    parts, last = [], 0
    for other in _SQL_NOT_CODE_RE.finditer(sql):
        parts.append(pattern.sub(replacement, sql[last : other.start()]) + other.group(0))
        last = other.end()
    parts.append(pattern.sub(replacement, sql[last:]))
    return "".join(parts)


def _spaced_names_fix(
    con: duckdb.DuckDBPyConnection, sql: str, infos: Sequence[DatasetInfo], *, bind: bool
) -> tuple[list[str], str] | None:
    """The datasets' column names with spaces or symbols (`Order Date`, `Spend (k€)`) that
    `sql` writes unquoted, and the SQL with them in double quotes — when it then parses (and,
    with `bind`, binds); None otherwise. Longer names first: `Order Date Time` before
    `Order Date`."""
    if len(sql) > MAX_ADVISED_SQL_CHARS:
        return None
    names = sorted(
        {
            name
            for info in infos
            for column in info.columns
            if (name := str(column.get("name", ""))) and not _PLAIN_NAME_RE.fullmatch(name)
        },
        key=len,
        reverse=True,
    )[:MAX_SPACED_NAMES]
    found: list[str] = []
    rewritten = sql
    for name in names:
        phrase = r"\s+".join(re.escape(part) for part in name.split())
        if not phrase:
            continue
        pattern = re.compile(rf"(?<![\w.\"]){phrase}(?![\w\"])", re.IGNORECASE)
        # (A replacement string would read the backslashes a quoted name may hold.)
        quoted = _sql_identifier(name)
        new = _sub_in_code(rewritten, pattern, functools.partial(_constant, quoted))
        if new != rewritten:
            found.append(name)
            rewritten = new
    if not found:
        return None
    try:
        con.extract_statements(rewritten)
    except duckdb.Error:
        return None
    if bind and not _binds(con, rewritten):
        return None
    return found, rewritten


def _constant(text: str, _match: re.Match[str]) -> str:
    return text


# A column name SQL reads unquoted (see _spaced_names_fix); and how many of the others are
# tried.
_PLAIN_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_SPACED_NAMES = 50
SPACED_NAMES = "hold spaces or symbols"


def _reserved_column_fix(
    con: duckdb.DuckDBPyConnection, sql: str, infos: Sequence[DatasetInfo]
) -> tuple[list[str], str] | None:
    """For SQL that does not parse: the datasets' columns named like SQL keywords (`at`,
    `order`, `group`…) whose quoting makes it parse, and the SQL so quoted; None when quoting
    them does not help."""
    reserved = _keywords_that_may_need_quotes()
    names = sorted(
        {
            str(column.get("name", ""))
            for info in infos
            for column in info.columns
            if str(column.get("name", "")).lower() in reserved
        }
    )[: MAX_ALTERNATIVES * 4]
    choices = [names, *([n] for n in names)] if len(names) > 1 else [names]
    for chosen in choices if names else []:
        rewritten = _quote_words(sql, chosen)
        if rewritten == sql:
            continue
        try:
            con.extract_statements(rewritten)
        except duckdb.Error:
            continue
        return chosen, rewritten
    return None


# SQL Server's `SELECT TOP n …` and MySQL's `LIMIT offset, count`, which DuckDB does not parse.
_SELECT_TOP_RE = re.compile(
    r"^(?P<head>\s*SELECT\s+(?:DISTINCT\s+)?)TOP\s*(?:\(\s*(?P<p>\d+)\s*\)|(?P<n>\d+))\s+",
    re.IGNORECASE,
)
_LIMIT_PAIR_RE = re.compile(r"\bLIMIT\s+(?P<offset>\d+)\s*,\s*(?P<count>\d+)", re.IGNORECASE)


def _row_limit_fix(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[str, str] | None:
    """For SQL that does not parse because it limits its rows as SQL Server (`SELECT TOP 10`)
    or MySQL (`LIMIT 20, 10`) do: what DuckDB writes instead, and the SQL so written when it
    then parses; None otherwise. Outside strings and comments only; `TOP` only as the
    statement's own, made a LIMIT at its end."""
    if len(sql) > MAX_ADVISED_SQL_CHARS:
        return None
    code = _SQL_NOT_CODE_RE.sub(lambda m: " " * len(m.group(0)), sql)
    rewritten, said = sql, ""
    pair = _LIMIT_PAIR_RE.search(code)
    if pair is not None:
        limit = f"LIMIT {pair.group('count')} OFFSET {pair.group('offset')}"
        rewritten = sql[: pair.start()] + limit + sql[pair.end() :]
        said = "LIMIT count OFFSET skipped, not LIMIT skipped, count"
    else:
        top = _SELECT_TOP_RE.match(code)
        if top is None or re.search(r"\bLIMIT\b", code, re.IGNORECASE):
            return None
        body = (sql[: top.start("head")] + top.group("head") + sql[top.end() :]).rstrip()
        ending = ";" if body.endswith(";") else ""
        rewritten = f"{body.rstrip(';').rstrip()} LIMIT {top.group('p') or top.group('n')}{ending}"
        said = "LIMIT n at the end of the statement, not SELECT TOP n"
    try:
        con.extract_statements(rewritten)
    except duckdb.Error:
        return None
    return said, rewritten


def _row_limit_hint(message: str, con: duckdb.DuckDBPyConnection, sql: str) -> HintException | None:
    """DuckDB's `message` about `sql`, and the SQL with DuckDB's LIMIT (see _row_limit_fix)."""
    limited = _row_limit_fix(con, sql)
    if limited is None:
        return None
    said, rewritten = limited
    return HintException(
        "schema",
        f"{message}\nquery runs DuckDB SQL: {said}, as in the alternative",
        _retry_with(rewritten),
    )


def _check_read_only(
    con: duckdb.DuckDBPyConnection, sql: str, infos: Sequence[DatasetInfo] = ()
) -> None:
    """Refuse anything but a single read statement (parsed by DuckDB, not pattern-matched).
    SQL that does not parse because it names a column called like a reserved word unquoted is
    answered with the quoted SQL as the alternative."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.ParserException as exc:
        message = f"SQL syntax error: {_first_lines(exc)}"
        limited = _row_limit_hint(message, con, sql)
        if limited is not None:
            raise limited from exc
        fix = _reserved_column_fix(con, sql, infos)
        if fix is not None:
            raise _quote_names_hint(message, fix, "are reserved SQL words") from exc
        spaced = _spaced_names_fix(con, sql, infos, bind=False)
        if spaced is not None:
            raise _quote_names_hint(message, spaced, SPACED_NAMES) from exc
        raise HintException("schema", message) from exc
    if not statements:
        raise HintException("schema", "sql contains no statement")
    if len(statements) > 1:
        raise HintException(
            "fetch",
            f"sql contains {len(statements)} statements; query runs exactly one read statement "
            "per call",
            [{"label": "one SELECT per query call", "score": 1.0, "action": "narrow"}],
        )
    try:
        kind = str(statements[0].type.name)
    except ValueError:  # a statement type this duckdb's Python enum lacks (UPDATE EXTENSIONS)
        kind = "UNKNOWN"
    if kind not in READ_STATEMENT_TYPES:
        advice = _REFUSAL_ADVICE.get(
            kind, ("a single SELECT over the conversation's datasets, with save_as to keep it",)
        )
        # Named as written: DuckDB files INSTALL under LOAD, USE under SET, CHECKPOINT under
        # CALL (a WITH ... prefix says nothing: then its type).
        word = re.match(r"\s*([A-Za-z]+)", statements[0].query or "")
        named = word.group(1).upper() if word else ""
        if named == "FORCE":  # FORCE INSTALL, FORCE CHECKPOINT
            second = re.match(r"\s*FORCE\s+([A-Za-z]+)", statements[0].query, re.IGNORECASE)
            named += f" {second.group(1).upper()}" if second else ""
        label = named if named and named != "WITH" else kind
        raise HintException(
            "fetch",
            f"{label} statements are not allowed: query only runs read-only SQL (SELECT, WITH, "
            "VALUES, SHOW, DESCRIBE, SUMMARIZE, EXPLAIN) over this conversation's datasets, "
            "without file or system access",
            [{"label": label, "score": 1.0, "action": "add"} for label in advice],
        )


class _Watchdog:
    """Interrupts a DuckDB connection still running after `timeout_s`, or once the call it
    runs for is cancelled (repeatedly, so an interrupt that lands between two DuckDB calls is
    not lost)."""

    POLL_S = 0.05

    def __init__(self, con: duckdb.DuckDBPyConnection, timeout_s: float) -> None:
        self._con = con
        self._timeout_s = timeout_s
        self._done = threading.Event()
        # Read here, on the handler's thread: the watchdog's own thread has a fresh context.
        self._cancelled = call_cancellation()
        self._thread = threading.Thread(target=self._run, name="query-watchdog", daemon=True)
        self.fired = False
        self.cancelled = False

    def _run(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        cancelled = self._cancelled
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.fired = True
                logger.warning("query exceeded %.1fs; interrupting DuckDB", self._timeout_s)
                break
            wait = left if cancelled is None else min(left, self.POLL_S)
            if self._done.wait(wait):
                return
            if cancelled is not None and cancelled.is_set():
                self.cancelled = True
                logger.info("query's call was cancelled; interrupting DuckDB")
                break
        while not self._done.is_set():
            self._con.interrupt()
            self._done.wait(0.05)

    def __enter__(self) -> _Watchdog:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        self._thread.join()


def _digits(column: pa.ChunkedArray | pa.Array) -> int:
    """Significant digits of a decimal column's largest magnitude (0 when all null)."""
    try:
        largest = pc.max(pc.abs(column)).as_py()
    except (pa.ArrowException, ValueError):
        return 0
    return len(largest.as_tuple().digits) if largest is not None else 0


NANOS_PER_DAY = 86_400 * 10**9


def _interval_text(value: Any) -> str:
    """A month-day-nanosecond interval as DuckDB writes it: `2 months 3 days 04:05:06.5`."""
    parts = [
        f"{count} {unit}{'' if abs(count) == 1 else 's'}"
        for count, unit in ((value.months, "month"), (value.days, "day"))
        if count
    ]
    nanos = value.nanoseconds
    if nanos or not parts:
        sign, nanos = ("-" if nanos < 0 else ""), abs(nanos)
        seconds, fraction = divmod(nanos, 10**9)
        clock = f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        parts.append(clock + (f".{fraction:09d}".rstrip("0") if fraction else ""))
    return " ".join(parts)


def _interval_values(column: pa.ChunkedArray) -> pa.Array:
    """An INTERVAL column (a difference of timestamps, age(), …) as durations when none has
    months (exact; pandas timedeltas, INTERVAL again in SQL), else as DuckDB's text: pandas
    holds intervals as DateOffset objects, whose repr is all the caller saw."""
    values = column.to_pylist()
    nanos = [None if v is None else v.days * NANOS_PER_DAY + v.nanoseconds for v in values]
    if all(v is None or v.months == 0 for v in values) and all(
        n is None or -(2**63) <= n < 2**63 for n in nanos
    ):
        return pa.array(nanos, type=pa.duration("ns"))
    return pa.array([None if v is None else _interval_text(v) for v in values], pa.string())


def _map_entries_type(map_type: pa.MapType) -> pa.DataType:
    """A MAP's type as its entries, a list of {key, value}: pandas has no map, and its list of
    tuples was stored as their Python repr (map_from_entries() makes it a MAP again in SQL)."""
    return pa.list_(pa.struct([map_type.key_field, map_type.item_field]))


def _maps_as_entries(table: pa.Table, warnings: list[Warning]) -> pa.Table:
    """`table` with its MAP columns as lists of {key, value} entries (see _map_entries_type),
    named in a warning."""
    maps = [i for i, field in enumerate(table.schema) if pa.types.is_map(field.type)]
    for i in maps:
        field = table.schema.field(i)
        table = table.set_column(i, field.name, table.column(i).cast(_map_entries_type(field.type)))
    if maps:
        names = [table.column_names[i] for i in maps]
        warnings.append(
            Warning(
                kind="map_entries",
                message="MAP columns are kept as lists of {key, value} entries: "
                + ", ".join(names)
                + "; map_from_entries(<column>) makes a MAP of one in SQL",
                details={"columns": names},
            )
        )
    return table


def _plain_types(table: pa.Table, warnings: list[Warning] | None = None) -> pa.Table:
    """DuckDB DECIMAL/HUGEINT columns (e.g. sum() of integers) as int64/float64, which pandas
    handles as numbers rather than Python Decimal objects. A column that loses digits that
    way (more than 15 significant digits as a float, an integer past int64) is named in a
    warning: it was silently rounded. INTERVAL columns as durations or text."""
    for position, field in enumerate(table.schema):
        if pa.types.is_interval(field.type):
            values = _interval_values(table.column(position))
            table = table.set_column(position, field.name, values)
    fields = []
    changed = False
    for field in table.schema:
        target = field.type
        if pa.types.is_decimal(field.type):
            target = pa.int64() if field.type.scale == 0 else pa.float64()
            changed = True
        elif pa.types.is_map(field.type):
            target = _map_entries_type(field.type)
            changed = True
        fields.append(pa.field(field.name, target, field.nullable))
    if not changed:
        return table
    columns = []
    rounded: list[str] = []
    for column, original, field in zip(table.columns, table.schema, fields, strict=True):
        if field.type == original.type:
            columns.append(column)
            continue
        try:
            columns.append(column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # int64 overflow
            columns.append(column.cast(pa.float64(), safe=False))
            rounded.append(f"{original.name} ({original.type})")
            continue
        if pa.types.is_floating(field.type) and _digits(column) > FLOAT_DIGITS:
            rounded.append(f"{original.name} ({original.type})")
    if rounded and warnings is not None:
        warnings.append(
            Warning(
                kind="precision",
                message=(
                    "returned as floating point, about 15 significant digits: "
                    + ", ".join(rounded)
                    + "; cast to VARCHAR in the SQL to keep every digit"
                ),
            )
        )
    return pa.Table.from_arrays(columns, names=table.column_names)


def _table_alternatives(missing: str, infos: Sequence[DatasetInfo]) -> list[Alternative]:
    return _ranked((_score(missing, info.name), info.name, {"rows": info.rows}) for info in infos)


def _column_alternatives(missing: str, infos: Sequence[DatasetInfo]) -> list[Alternative]:
    """The closest columns over every dataset, as `table.column`; the top three whatever their
    score when none is close."""
    bare = missing.rsplit(".", 1)[-1]
    candidates = [
        (
            _score(bare, str(column.get("name", ""))),
            f"{info.name}.{column.get('name', '')}",
            {"table": info.name, "column": column.get("name"), "dtype": column.get("dtype")},
        )
        for info in infos
        for column in info.columns
    ]
    return _ranked(candidates, min_score=MIN_SUGGESTION_SCORE) or _ranked(candidates, limit=3)


_MISSING_TABLE_RE = re.compile(r"Table with name (?P<name>.+?) does not exist")
_MISSING_COLUMN_RES = (
    re.compile(r'Referenced column "(?P<name>[^"]+)" not found'),
    re.compile(r'does not have a column named "(?P<name>[^"]+)"'),
)


_MISSING_FUNCTION_RE = re.compile(
    r"(?:Scalar|Aggregate|Table) Function with name (?P<name>[\w$]+) does not exist"
)
# Functions of other SQL dialects (SQLite, MySQL, PostgreSQL, SQL Server, Oracle) that models
# write out of habit, which DuckDB lacks: what DuckDB has instead, and the DuckDB function
# to call in its place when that is the same call with another name.
_FOREIGN_FUNCTIONS: dict[str, tuple[str, str | None]] = {
    "iif": ("if(condition, then, else), or CASE WHEN … THEN … ELSE … END", "if"),
    "julianday": ("julian(x), or date_diff('day', start, end) for the days between", "julian"),
    "datetime": (
        "CAST(x AS TIMESTAMP); now() for the current time; x + INTERVAL 1 DAY to shift",
        None,
    ),
    "total": ("coalesce(sum(x), 0)", None),
    "datalength": ("strlen(text) (bytes), length(text) (characters)", "strlen"),
    "getdate": ("now()", "now"),
    "sysdate": ("now()", "now"),
    "curdate": ("today() or current_date", "today"),
    "date_format": ("strftime(x, format), e.g. strftime(x, '%Y-%m')", None),
    "str_to_date": ("strptime(text, format), e.g. strptime(x, '%d/%m/%Y')", None),
    "to_char": ("strftime(x, format) for dates and times, e.g. strftime(x, '%Y-%m')", None),
    "to_date": ("strptime(text, format)::DATE, or CAST(text AS DATE) for ISO dates", None),
    "nvl": ("coalesce(x, y)", "coalesce"),
    "nvl2": ("CASE WHEN x IS NOT NULL THEN a ELSE b END", None),
    "isnull": ("coalesce(x, y), or x IS NULL", None),
    "charindex": ("instr(text, part) (the text first)", None),
    "locate": ("instr(text, part) (the text first)", None),
    "dateadd": ("x + INTERVAL 3 DAY, or date_add(x, INTERVAL 3 DAY)", None),
    "timestampdiff": ("date_diff('day', start, end) (or 'month', 'hour', …)", None),
    "months_between": ("date_diff('month', start, end)", None),
    "unix_timestamp": ("epoch(x)", "epoch"),
    "from_unixtime": ("to_timestamp(seconds)", "to_timestamp"),
    "regexp_like": ("regexp_matches(text, pattern)", "regexp_matches"),
    "char": ("chr(code)", "chr"),
    "substring_index": ("split_part(text, separator, n)", None),
    "mid": ("substr(text, start, length)", "substr"),
    "truncate": ("trunc(x), or round(x, digits)", None),
    "space": ("repeat(' ', n)", None),
    "replicate": ("repeat(text, n)", "repeat"),
    "rand": ("random()", "random"),
    "newid": ("uuid()", "uuid"),
    "eomonth": ("last_day(x)", "last_day"),
    "patindex": ("regexp_matches(text, pattern), or instr(text, part)", None),
}


def _renamed_calls(sql: str, old: str, new: str) -> str:
    """`sql` with every call of function `old` (a word, case-insensitive, followed by an
    opening parenthesis, outside strings, quoted identifiers and comments) calling `new`."""
    parts, last = [], 0
    for token in _SQL_TOKEN_RE.finditer(sql):
        if token.group(0).lower() == old and sql[token.end() :].lstrip().startswith("("):
            parts.append(sql[last : token.start()] + new)
            last = token.end()
    parts.append(sql[last:])
    return "".join(parts)


def _binds(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """Whether `sql` parses and binds over the registered datasets (planned, not run)."""
    try:
        con.execute("EXPLAIN " + sql)
    except duckdb.Error:
        return False
    return True


def _foreign_function_hint(
    exc: BaseException, con: duckdb.DuckDBPyConnection, sql: str
) -> HintException | None:
    """For a call of a function DuckDB lacks but another SQL dialect has: what to write in
    DuckDB, and the SQL with the DuckDB function when it is a renaming that binds."""
    match = _MISSING_FUNCTION_RE.search(str(exc))
    if match is None or len(sql) > MAX_ADVISED_SQL_CHARS:
        return None
    name = match.group("name").lower()
    if name == "top":  # `SELECT TOP (5) x`: read as a call of top() aliased x
        return _row_limit_hint(_first_lines(exc).splitlines()[0], con, sql)
    if name not in _FOREIGN_FUNCTIONS:
        return None
    instead, renamed = _FOREIGN_FUNCTIONS[name]
    message = (
        f"{_first_lines(exc).splitlines()[0]}\n{name}() is another SQL dialect's; query runs "
        f"DuckDB SQL, where it is: {instead}"
    )
    alternatives: list[dict[str, Any]] = []
    if renamed is not None:
        rewritten = _renamed_calls(sql, name, renamed)
        if rewritten != sql and _binds(con, rewritten):
            message += " (as in the alternative)"
            alternatives = _retry_with(rewritten)
    return HintException("schema", message, alternatives)


def _catalog_hint(
    exc: BaseException,
    infos: Sequence[DatasetInfo],
    con: duckdb.DuckDBPyConnection | None = None,
    sql: str = "",
) -> HintException:
    if con is not None:
        foreign = _foreign_function_hint(exc, con, sql)
        if foreign is not None:
            return foreign
    match = _MISSING_TABLE_RE.search(str(exc))
    if match is None:
        return HintException("schema", _first_lines(exc))
    missing = match.group("name").strip('"')
    if not infos:
        return HintException(
            "schema",
            f"no table {missing!r}: this conversation has no datasets yet; load a file with "
            "load_dataset first (files cannot be read from SQL)",
        )
    return HintException(
        "schema",
        f"no table {missing!r}; the tables are this conversation's datasets: "
        + ", ".join(info.name for info in infos[:20]),
        _table_alternatives(missing, infos),
    )


# The tokens after which a value is being compared with (see _quoted_text_fix).
_COMPARED_AFTER = frozenset({"=", "<", ">", "like", "ilike", "glob", "then", "else"})


def _quoted_as_text(sql: str, name: str) -> str | None:
    """`sql` with `"name"` written `'name'` where it is compared with (after `=`, `<>`, `<`,
    `>`, LIKE, THEN or ELSE, or in an IN list); None when it is nowhere so. Elsewhere
    (`SELECT "nmae"`) a double-quoted word that names no column is a misspelt column more
    often than text."""
    quoted, literal = _sql_identifier(name), _sql_literal(name)
    parts, last, previous = [], 0, ""
    in_list: list[bool] = []  # per open parenthesis: whether it opened an IN list
    for token in _SQL_TOKEN_RE.finditer(sql):
        text = token.group(0)
        if text.startswith(("--", "/*")):
            continue
        compared = previous in _COMPARED_AFTER or (
            previous in ("(", ",") and bool(in_list) and in_list[-1]
        )
        if text == quoted and compared:
            parts.append(sql[last : token.start()] + literal)
            last = token.end()
        if text == "(":
            in_list.append(previous == "in")
        elif text == ")" and in_list:
            in_list.pop()
        previous = text.lower()
    return "".join(parts) + sql[last:] if parts else None


def _quoted_text_fix(
    con: duckdb.DuckDBPyConnection, sql: str, name: str
) -> tuple[list[str], str] | None:
    """SQLite and MySQL read a double-quoted word that names no column as text; in DuckDB it
    is always a column. The words so written as values, and the SQL with them in single
    quotes (see _quoted_as_text) — when it then binds; None otherwise. DuckDB reports one
    missing column at a time: each is written so in turn, up to MAX_CHECKED_LITERALS."""
    if len(sql) > MAX_ADVISED_SQL_CHARS:
        return None
    names: list[str] = []
    for _ in range(MAX_CHECKED_LITERALS):
        rewritten = _quoted_as_text(sql, name)
        if rewritten is None:
            return None
        sql = rewritten
        names.append(name)
        try:
            con.execute("EXPLAIN " + sql)
        except duckdb.BinderException as exc:
            missing = _MISSING_COLUMN_RES[0].search(str(exc))
            if missing is None or missing.group("name") in names:
                return None
            name = missing.group("name")
            continue
        except duckdb.Error:
            return None
        return names, sql
    return None


def _binder_hint(
    exc: BaseException,
    infos: Sequence[DatasetInfo],
    con: duckdb.DuckDBPyConnection | None = None,
    sql: str = "",
) -> HintException:
    text = str(exc)
    for pattern in _MISSING_COLUMN_RES:
        match = pattern.search(text)
        if match is not None:
            name = match.group("name")
            spaced = _spaced_names_fix(con, sql, infos, bind=True) if con is not None else None
            if spaced is not None:
                said = f"no column {name!r}: {_first_lines(exc)}"
                return _quote_names_hint(said, spaced, SPACED_NAMES)
            fix = _quoted_text_fix(con, sql, name) if con is not None else None
            if fix is not None:
                texts, rewritten = fix
                literals = ", ".join(_sql_literal(text) for text in texts)
                return HintException(
                    "schema",
                    f"no column {name!r}: {_first_lines(exc)}\nin SQL a word in double quotes "
                    f"is a column name; a text value goes in single quotes: {literals}, as in "
                    "the alternative",
                    _retry_with(rewritten),
                )
            return HintException(
                "schema",
                f"no column {name!r}: {_first_lines(exc)}",
                _column_alternatives(name, infos),
            )
    return HintException("schema", _first_lines(exc))


def _query_timeout(context: ToolContext) -> float:
    if context.settings is None:
        return QUERY_TIMEOUT_CAP_S
    return min(float(context.settings.tool_timeout_s), QUERY_TIMEOUT_CAP_S)


def _execute(
    con: duckdb.DuckDBPyConnection, sql: str, limit: int, save_limit: int | None
) -> tuple[pa.Table, int]:
    """Run `sql`; the kept rows and the true row count, streamed so the rows past what is kept
    are counted without being held. Without save_limit at most the first `limit` rows and about
    QUERY_MAX_RESULT_BYTES are kept; with it every row is, and a result over save_limit bytes
    is a fetch Hint."""
    relation = con.sql(sql)
    if relation is None:  # a statement that returned nothing
        return pa.table({}), 0
    reader = relation.to_arrow_reader(QUERY_BATCH_ROWS)
    kept: list[pa.RecordBatch] = []
    kept_rows = 0
    kept_bytes = 0
    total = 0
    for batch in reader:
        total += batch.num_rows
        if save_limit is not None:
            kept_bytes += batch.nbytes
            if kept_bytes > save_limit:
                raise HintException(
                    "fetch",
                    f"the result is over {save_limit / 2**20:g} MiB, more than a dataset may "
                    "hold (TOOLMESH_MAX_DATASET_BYTES), so it cannot be saved; aggregate, "
                    "filter or select fewer columns",
                    [{"label": "an aggregate or a WHERE", "score": 1.0, "action": "narrow"}],
                )
            kept.append(batch)
        elif kept_rows < limit and kept_bytes < QUERY_MAX_RESULT_BYTES:
            kept.append(batch)
            kept_rows += batch.num_rows
            kept_bytes += batch.nbytes
    table = pa.Table.from_batches(kept, schema=reader.schema)
    if save_limit is None:
        table = table.slice(0, min(limit, _rows_within(table, QUERY_MAX_RESULT_BYTES)))
    return table, total


def _rows_within(table: pa.Table, budget: int) -> int:
    """How many of `table`'s first rows fit in about `budget` bytes (at least one)."""
    if table.nbytes <= budget or table.num_rows <= 1:
        return table.num_rows
    return max(1, table.num_rows * budget // table.nbytes)


def _datasets_read_by(
    con: duckdb.DuckDBPyConnection, sql: str, infos: Sequence[DatasetInfo]
) -> list[DatasetInfo]:
    """The datasets the query names, read from DuckDB's parse tree (loading every dataset of
    the conversation for each query cost time in proportion to all of them); all of them for
    a query that names none or names the catalog (SHOW TABLES, information_schema) or that
    is not a SELECT DuckDB can serialise."""
    try:
        found = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()
        tree = json.loads(found[0][0]) if found else {"error": True}
    except (duckdb.Error, ValueError, RecursionError):
        return list(infos)
    if not isinstance(tree, dict) or tree.get("error"):
        return list(infos)
    named: set[str] = set()
    stack: list[Any] = [tree]
    while stack:  # the parse tree's BASE_TABLE nodes (parsed only: nothing is bound)
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "BASE_TABLE":
                if node.get("schema_name") or node.get("catalog_name"):
                    return list(infos)  # information_schema.tables and the like
                named.add(str(node.get("table_name", "")).lower())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    if not named:
        return list(infos)
    return [info for info in infos if info.name.lower() in named]


# The tokens of SQL, in one left-to-right pass that never rescans: a string or quoted identifier
# (an unclosed one runs to the end), a comment, a word, or any other single character.
_SQL_TOKEN_RE = re.compile(
    r"'(?:[^']|'')*+(?:'|\Z)|\"(?:[^\"]|\"\")*+(?:\"|\Z)|--[^\n]*+|/\*.*?(?:\*/|\Z)"
    r"|[A-Za-z_][\w$]*+|\S",
    re.DOTALL,
)
MAX_CHECKED_LITERALS = 8  # of one empty result's SQL
MAX_CANDIDATE_VALUES = 20_000  # distinct values of a column compared with a missed literal
MAX_ADVISED_SQL_CHARS = 100_000  # longer SQL gets no such advice (its time stays bounded)


def _unquoted(identifier: str) -> str:
    if identifier.startswith('"'):
        return identifier[1:-1].replace('""', '"')
    return identifier


def _compared_literals(sql: str) -> list[tuple[str, str]]:
    """(column, text) pairs a query compares for equality — `column = 'text'`, `'text' =
    column`, `column IN ('a', 'b')`, a column bare, quoted or qualified — in order, each once.
    Linear in the SQL's length, whatever it holds."""
    tokens = [t for t in _SQL_TOKEN_RE.findall(sql) if not t.startswith(("--", "/*"))]

    def text(i: int) -> str | None:
        t = tokens[i] if 0 <= i < len(tokens) else ""
        return t[1:-1].replace("''", "'") if len(t) >= 2 and t[0] == t[-1] == "'" else None

    def word(i: int) -> str | None:
        t = tokens[i] if 0 <= i < len(tokens) else ""
        quoted = len(t) >= 2 and t[0] == t[-1] == '"'
        return _unquoted(t) if quoted or (t[:1].isalpha() or t[:1] == "_") else None

    def column_from(i: int) -> str | None:  # `a`, `t.a`, `s.t."a"` starting at i: its last name
        if word(i) is None:
            return None
        while i + 2 < len(tokens) and tokens[i + 1] == "." and word(i + 2) is not None:
            i += 2
        return word(i)

    found: list[tuple[str, str]] = []
    for i, token in enumerate(tokens):
        if token == "=" and tokens[i - 1 : i] != ["="] and tokens[i + 1 : i + 2] != ["="]:
            right, left = text(i + 1), text(i - 1)
            if right is not None and (column := word(i - 1)) is not None:
                found.append((column, right))
            elif left is not None and (column := column_from(i + 1)) is not None:
                found.append((column, left))
        elif token.upper() == "IN" and tokens[i + 1 : i + 2] == ["("]:
            column = word(i - 1)
            values: list[str] = []
            j = i + 2
            while (value := text(j)) is not None:
                values.append(value)
                j += 1
                if tokens[j : j + 1] != [","]:
                    break
                j += 1
            if column is not None and tokens[j : j + 1] == [")"]:
                found.extend((column, v) for v in values)
    return list(dict.fromkeys(found))


def _folded(text: str) -> str:
    """`text` compared loosely: case, accents and surrounding or repeated spaces ignored."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(plain.split())


def _empty_result_warnings(
    con: duckdb.DuckDBPyConnection, sql: str, tables: Mapping[str, pa.Schema]
) -> list[Warning]:
    """For a query that returned no row: each text it compares a column with that no row of
    the column's dataset holds, with the values it holds that look like it ('Zurich' →
    'Zürich', 'paid ' → 'paid', 'OSLO' → 'Oslo'), so the model fixes the value, not the query."""
    warnings: list[Warning] = []
    if len(sql) > MAX_ADVISED_SQL_CHARS:
        return warnings
    for column, text in _compared_literals(sql)[:MAX_CHECKED_LITERALS]:
        for table, schema in tables.items():
            found = next((f for f in schema if f.name.casefold() == column.casefold()), None)
            if found is None or not (
                pa.types.is_string(found.type) or pa.types.is_large_string(found.type)
            ):
                continue
            name = found.name
            quoted_table, quoted = _sql_identifier(table), _sql_identifier(name)
            try:
                held = con.execute(
                    f"SELECT 1 FROM {quoted_table} WHERE {quoted} = ? LIMIT 1", [text]
                ).fetchone()
                if held is not None:
                    continue
                rows = con.execute(
                    f"SELECT DISTINCT {quoted} FROM {quoted_table} WHERE {quoted} IS NOT NULL "
                    f"LIMIT {MAX_CANDIDATE_VALUES}"
                ).fetchall()
            except duckdb.Error:  # out of time, or a column registered under another name
                return warnings  # advice is best effort: the empty result stands as it is
            values = [str(r[0]) for r in rows]
            loose = _folded(text)
            alike = [v for v in values if _folded(v) == loose]
            by_folded = {_folded(v): v for v in values}
            close = difflib.get_close_matches(loose, list(by_folded), n=3, cutoff=0.6)
            suggestions = list(dict.fromkeys(alike + [by_folded[c] for c in close]))[:3]
            shown = (
                "; did you mean " + " or ".join(repr(v) for v in suggestions) + "?"
                if suggestions
                else ""
            )
            warnings.append(
                Warning(
                    kind="no_match",
                    message=f"no row of {table!r} has {name} = {text!r}{shown}",
                    details={
                        "dataset": table,
                        "column": name,
                        "value": text,
                        "suggestions": suggestions,
                    },
                )
            )
    return warnings


def _register(
    con: duckdb.DuckDBPyConnection, name: str, table: pa.Table, warnings: list[Warning]
) -> None:
    """Make `table` queryable as `name`. A column DuckDB cannot read (a decimal of more than
    38 digits, and the like) made every query of the conversation fail, SELECT 1 included:
    it is left out, with a warning naming it and why. Column names that differ only in case
    are renamed (see sql_names), with a warning."""
    names = sql_names(table.column_names)
    if names != table.column_names:
        renamed = [new for old, new in zip(table.column_names, names, strict=True) if old != new]
        table = table.rename_columns(names)
        warnings.append(
            Warning(
                kind="duplicate_columns",
                message=f"dataset {name!r}: column names that repeat (SQL ignores case) are "
                "read as " + ", ".join(renamed),
            )
        )
    try:
        con.register(name, table)
        return
    except duckdb.Error as exc:
        failure = _first_lines(exc)
    kept = []
    for i, field in enumerate(table.schema):
        try:
            con.register("__probe", table.select([i]))
            kept.append(i)
        except duckdb.Error as exc:
            warnings.append(
                Warning(
                    kind="column_skipped",
                    message=(
                        f"dataset {name!r}: column {field.name!r} ({field.type}) cannot be read "
                        f"by SQL and was left out: {_first_lines(exc)[:200]}"
                    ),
                )
            )
        finally:
            con.unregister("__probe")
    if len(kept) == table.num_columns:  # no single column is to blame
        raise HintException("schema", f"dataset {name!r} cannot be read by SQL: {failure}")
    con.register(name, table.select(kept))


def _time_zones(schema: pa.Schema) -> set[str]:
    """The time zones of `schema`'s zoned timestamp columns."""
    return {
        str(field.type.tz)
        for field in schema
        if pa.types.is_timestamp(field.type) and field.type.tz is not None
    }


def _set_time_zone(
    con: duckdb.DuckDBPyConnection, zones: set[str], warnings: list[Warning]
) -> None:
    """Set the zone DuckDB computes zoned times in (hour(), date_trunc(), casts to DATE…)
    and gives them back in: the datasets' own when their zoned times all have one (taxi trips
    in America/New_York counted by hour of the day in New York, not in UTC), else UTC, named
    in a warning. Without this it was the server's local zone."""
    zone = next(iter(zones)) if len(zones) == 1 else "UTC"
    # Arrow writes a fixed offset as "+05:00", which DuckDB knows as "UTC+05:00".
    tried = [zone, f"UTC{zone}"] if zone[:1] in "+-" else [zone]
    for name in tried:
        try:
            con.execute("SET TimeZone = " + _sql_literal(name))
            break
        except duckdb.Error:
            continue
    else:
        try:
            con.execute("SET TimeZone = 'UTC'")
        except duckdb.Error as exc:  # a DuckDB without time zones (no ICU): leave it
            logger.warning("cannot set DuckDB's time zone: %s", exc)
            return
        zones = zones | {"UTC"}  # the warning below names the zone that could not be used
    if len(zones) > 1:
        shown = ", ".join(sorted(zones - {"UTC"}))
        warnings.append(
            Warning(
                kind="time_zone",
                message=f"the datasets' times are in time zone(s) {shown}: zoned times are "
                "computed and shown in UTC; use AT TIME ZONE '<zone>' for local times",
                details={"zones": sorted(zones)},
            )
        )


def query(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    """Read-only DuckDB SQL over the conversation's datasets; save_as keeps the full result."""
    warnings: list[Warning] = []
    sql = _required_str(inputs, "sql").strip()
    limit = _int_input(
        inputs,
        "limit",
        default=QUERY_DEFAULT_LIMIT,
        minimum=1,
        maximum=QUERY_MAX_LIMIT,
        warnings=warnings,
    )
    save_as = _str_input(inputs, "save_as", required=False)
    if save_as is not None:
        _check_identifier(save_as, "save_as")

    timeout_s = _query_timeout(context)
    save_limit = _max_dataset_bytes(context) if save_as is not None else None
    con = duckdb.connect(":memory:", config=dict(DUCKDB_CONFIG))
    try:
        infos = context.list_datasets()
        _check_read_only(con, sql, infos)  # before any dataset is loaded
        zones: set[str] = set()
        registered: dict[str, pa.Schema] = {}
        for info in _datasets_read_by(con, sql, infos):
            try:
                frame = context.load_dataset(info.name)
            except KeyError:
                logger.info("dataset %r vanished before the query; skipping it", info.name)
                continue
            table = dataframe_to_arrow(frame)
            zones.update(_time_zones(table.schema))
            _register(con, info.name, table, warnings)
            registered[info.name] = table.schema
        _set_time_zone(con, zones, warnings)
        con.execute("SET lock_configuration = true")
        with _Watchdog(con, timeout_s) as watchdog:
            try:
                table, total = _execute(con, sql, limit, save_limit)
                if total == 0 and registered:
                    warnings.extend(_empty_result_warnings(con, sql, registered))
            except duckdb.InterruptException as exc:
                if watchdog.cancelled:
                    raise CallCancelled("the query's call was cancelled") from exc
                if watchdog.fired:
                    raise QueryTimeout(
                        f"the query ran longer than {timeout_s:g}s and was cancelled; "
                        "narrow it (filter, aggregate, fewer joins)"
                    ) from exc
                raise
            except (duckdb.OutOfMemoryException, pa.ArrowMemoryError, OSError) as exc:
                # OSError: DuckDB's Arrow export of a batch over 2 GiB of text, and the like.
                raise QueryResultTooLarge(
                    "the query's result could not be held in memory: "
                    f"{(_first_lines(exc).splitlines() or [type(exc).__name__])[0]}; "
                    "aggregate, filter or select fewer or shorter columns"
                ) from exc
            except duckdb.PermissionException as exc:
                raise QueryPermissionDenied(
                    f"{_first_lines(exc)} (query has no file or system access; load files "
                    "with load_dataset)"
                ) from exc
            except duckdb.CatalogException as exc:
                raise _catalog_hint(exc, infos, con, sql) from exc
            except duckdb.BinderException as exc:
                raise _binder_hint(exc, infos, con, sql) from exc
            except (
                duckdb.ParserException,
                duckdb.ConversionException,
                duckdb.OutOfRangeException,
                duckdb.TypeMismatchException,
                duckdb.InvalidInputException,
                duckdb.NotImplementedException,
            ) as exc:
                raise HintException("schema", _first_lines(exc)) from exc
    finally:
        con.close()

    table = _plain_types(table, warnings)
    names = sql_names(table.column_names)
    if names != table.column_names:
        table = table.rename_columns(names)
        warnings.append(
            Warning(
                kind="duplicate_columns",
                message="the result repeats column names; renamed to " + ", ".join(names),
            )
        )
    full = _arrow_to_pandas(table, warnings)
    shown = min(limit, _rows_within(table, QUERY_MAX_RESULT_BYTES))
    truncated = total > shown
    returned = full.iloc[:shown] if truncated else full

    if save_as is not None:
        if any(info.name == save_as for info in infos):
            warnings.append(
                Warning(kind="replaced", message=f"replaced the existing dataset {save_as!r}")
            )
        context.save_dataset(save_as, full, source=f"query: {sql}"[:2000])
        logger.info("saved query result as dataset %r (%d rows)", save_as, total)

    if truncated:
        saved = f"; the full result is saved as {save_as!r}" if save_as is not None else ""
        advice = (
            f"aggregate or filter in SQL, or raise limit (at most {QUERY_MAX_LIMIT})"
            if shown == limit
            else f"the rows shown are capped at {QUERY_MAX_RESULT_BYTES // 2**20} MiB; select "
            "fewer or shorter columns, or pass save_as to keep the whole result"
        )
        warnings.append(
            Warning(
                kind="truncated",
                message=f"returned the first {shown} of {total} rows{saved}; {advice}",
                details={"total_rows": total, "returned_rows": shown},
            )
        )
    if truncated and save_as is None:
        # Only the returned rows were kept: dtypes are exact, null/distinct counts unknown.
        schema = [ColumnSpec(name=str(c), dtype=str(returned[c].dtype)) for c in returned.columns]
    else:
        schema = measure_schema(full)
    return _ok(Ok(rows=total, schema=schema, data=returned, warnings=warnings))


migrate_tool(query, "query", is_tabular=True)
