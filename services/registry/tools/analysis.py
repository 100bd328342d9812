"""Handlers of the "analysis" system tools: load_dataset (a CSV/Parquet file inside the data roots
into a conversation dataset), preview_data, describe_entry and query (read-only DuckDB SQL over
the conversation's datasets). Each is a sync `(inputs, context)` handler run in a worker thread;
recoverable mistakes raise HintException, real failures raise the exceptions below.

All four are tabular under the Uniform Tool Contract. load_dataset, preview_data and query are
spec-only (`migrate_tool`: they return a ToolResult, and the registry wraps them);
describe_entry is source-decorated (`@uniform_contract`: it returns Ok, and a direct caller gets
the envelope — a Hint rather than a raised HintException)."""

from __future__ import annotations

import difflib
import functools
import logging
import os
import re
import threading
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from services.registry.context import DatasetInfo, ToolContext
from services.registry.datasets import dataframe_to_arrow, unique_names
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

logger = logging.getLogger(__name__)

IDENTIFIER_RE = re.compile(r"[a-z_][a-z0-9_]*")
MAX_IDENTIFIER_LENGTH = 64

PREVIEW_DEFAULT_LIMIT = 10
PREVIEW_MAX_LIMIT = 200
QUERY_DEFAULT_LIMIT = 1000
QUERY_MAX_LIMIT = 10_000
QUERY_TIMEOUT_CAP_S = 60.0
QUERY_BATCH_ROWS = 8192
DUCKDB_CONFIG: dict[str, Any] = {
    "enable_external_access": False,
    "threads": 2,
    "memory_limit": "1GB",
}
# Statement types DuckDB reports for reads: SELECT covers WITH, VALUES, FROM-first, SHOW,
# DESCRIBE and SUMMARIZE.
READ_STATEMENT_TYPES = frozenset({"SELECT", "EXPLAIN"})

MAX_WALK_FILES = 2000
MAX_ALTERNATIVES = 5
MIN_SUGGESTION_SCORE = 0.3
CSV_SUFFIXES = frozenset({".csv", ".tsv", ".txt"})
PARQUET_SUFFIXES = frozenset({".parquet", ".pq"})
COMPRESSION_SUFFIXES = frozenset({".gz", ".bz2", ".zip", ".xz", ".zst"})
DELIMITER_ALIASES = {"\\t": "\t", "tab": "\t", "\\|": "|"}
MAX_MESSAGE_LINES = 6
MAX_MESSAGE_CHARS = 800

FileFormat = Literal["csv", "parquet"]


class PathOutsideDataRoots(Exception):
    """load_dataset was asked for a path that does not resolve inside the data roots."""


class QueryPermissionDenied(Exception):
    """DuckDB refused a file or system access the query attempted."""


class QueryTimeout(Exception):
    """The query ran past its time limit and was interrupted."""


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


# --------------------------------------------------------------------------------------------
# load_dataset


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


def _resolve(path: Path, raw: str) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # symlink loop, NUL byte, …
        raise HintException("schema", f"path {raw!r} cannot be resolved: {exc}") from exc


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
        if not resolved.exists():
            for root in roots[1:]:
                other = _resolve(root / candidate, raw)
                if other.exists() and _inside(other, roots):
                    resolved = other
                    break
    if not _inside(resolved, roots):
        allowed = ", ".join(str(root) for root in roots)
        logger.warning("load_dataset refused %r: resolves outside the data roots", raw)
        raise PathOutsideDataRoots(
            f"refused to read {raw!r}: it resolves outside the allowed data directories "
            f"({allowed}); load_dataset only reads files inside them (symlinks are followed "
            "before checking)"
        )
    return resolved


def _format_suffixes(path: Path) -> list[str]:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSION_SUFFIXES:
        suffixes = suffixes[:-1]
    return suffixes


def _file_stem(path: Path) -> str:
    name = path.name
    for suffix in reversed(path.suffixes):
        low = suffix.lower()
        if low in COMPRESSION_SUFFIXES or low in CSV_SUFFIXES or low in PARQUET_SUFFIXES:
            name = name[: -len(suffix)]
        else:
            break
    return name or path.name


def _supported(path: Path) -> bool:
    suffixes = _format_suffixes(path)
    return bool(suffixes) and (suffixes[-1] in CSV_SUFFIXES or suffixes[-1] in PARQUET_SUFFIXES)


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
                if _supported(path):
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


def _detect_format(path: Path, requested: str) -> FileFormat:
    if requested == "csv":
        return "csv"
    if requested == "parquet":
        return "parquet"
    if requested != "auto":
        raise HintException(
            "schema",
            f"format must be 'auto', 'csv' or 'parquet', not {requested!r}",
            [{"label": "csv", "score": 0.5}, {"label": "parquet", "score": 0.5}],
        )
    suffixes = _format_suffixes(path)
    last = suffixes[-1] if suffixes else ""
    if last in CSV_SUFFIXES:
        return "csv"
    if last in PARQUET_SUFFIXES:
        return "parquet"
    raise HintException(
        "fetch",
        f"cannot tell the format of {path.name!r} from its extension "
        f"({last or 'none'}); load_dataset reads CSV and Parquet files — pass format if the "
        "file is one of those",
        [
            {"label": 'format="csv"', "score": 0.5, "action": "add"},
            {"label": 'format="parquet"', "score": 0.5, "action": "add"},
        ],
    )


def _delimiter(raw: str | None, path: Path) -> str:
    if raw is None:
        return "\t" if ".tsv" in _format_suffixes(path) else ","
    value = DELIMITER_ALIASES.get(raw.lower(), raw)
    if len(value) != 1 or value in {'"', "\n", "\r"}:
        raise HintException(
            "schema",
            f"delimiter must be a single character other than a quote or newline, not {raw!r}",
            [{"label": d, "score": 0.5} for d in (",", ";", "\\t", "|")],
        )
    return value


def _read_csv(path: Path, delimiter: str, warnings: list[Warning]) -> pd.DataFrame:
    shown = "\\t" if delimiter == "\t" else delimiter
    for encoding in ("utf-8", "latin-1"):
        try:
            df = pd.read_csv(path, sep=delimiter, encoding=encoding, low_memory=False)
        except UnicodeDecodeError:
            continue  # retried as Latin-1, which decodes any byte sequence
        except pd.errors.EmptyDataError as exc:
            raise HintException(
                "schema", f"{path.name!r} is empty: there is no header row to read"
            ) from exc
        except (pd.errors.ParserError, ValueError) as exc:
            raise HintException(
                "schema",
                f"could not parse {path.name!r} as CSV with delimiter {shown!r}: "
                f"{_first_lines(exc)}; if the file uses another separator pass delimiter, "
                "or format='parquet' if it is Parquet",
                [{"label": d, "score": 0.5} for d in (",", ";", "\\t", "|") if d != shown],
            ) from exc
        df = _parse_iso_dates(df)
        if encoding != "utf-8":
            warnings.append(
                Warning(kind="encoding", message="the file is not valid UTF-8; read as Latin-1")
            )
        mangled = [
            str(c)
            for c in df.columns
            if (m := re.fullmatch(r"(.+)\.(\d+)", str(c))) and m.group(1) in df.columns
        ]
        if mangled:
            warnings.append(
                Warning(
                    kind="duplicate_columns",
                    message="duplicate column names were renamed: " + ", ".join(mangled),
                    details={"renamed": mangled},
                )
            )
        return df
    raise AssertionError("unreachable: Latin-1 decodes every byte")  # pragma: no cover


_ISO_DATETIME_RE = (
    r"^\d{4}-\d{2}-\d{2}"
    r"(?:[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:?\d{2})?)?$"
)


def _parse_iso_dates(df: pd.DataFrame) -> pd.DataFrame:
    """String columns whose every value is an ISO-8601 date/datetime as datetime64 (CSV has no
    types; these are the unambiguous ones). Columns with mixed offsets stay strings."""
    for name in df.columns:
        col = df[name]
        if not (pd.api.types.is_string_dtype(col.dtype) or col.dtype == object):
            continue
        values = col.dropna()
        if values.empty or not all(isinstance(v, str) for v in values):
            continue
        if not values.str.fullmatch(_ISO_DATETIME_RE).all():
            continue
        try:
            df[name] = pd.to_datetime(col, format="ISO8601")
        except (ValueError, OverflowError, TypeError) as exc:
            logger.debug("column %r looks like dates but does not parse: %s", name, exc)
    return df


def _read_parquet(path: Path, warnings: list[Warning]) -> pd.DataFrame:
    try:
        table = pq.read_table(path)
    except pa.ArrowInvalid as exc:
        raise HintException(
            "schema",
            f"could not read {path.name!r} as Parquet: {_first_lines(exc)}; pass format='csv' "
            "if it is a CSV file",
        ) from exc
    names = unique_names(table.column_names)
    if names != table.column_names:
        renamed = [new for old, new in zip(table.column_names, names, strict=True) if old != new]
        table = table.rename_columns(names)
        warnings.append(
            Warning(
                kind="duplicate_columns",
                message="duplicate column names were renamed: " + ", ".join(renamed),
                details={"renamed": renamed},
            )
        )
    return table.to_pandas()


def load_dataset(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    """Load a CSV/Parquet file inside the data roots as a dataset of the conversation."""
    raw_path = _required_str(inputs, "path")
    explicit_name = _str_input(inputs, "name", required=False)
    requested_format = _str_input(inputs, "format", required=False) or "auto"
    raw_delimiter = _str_input(inputs, "delimiter", required=False)
    if explicit_name is not None:
        _check_identifier(explicit_name, "name")

    roots = _data_roots(context)
    path = _resolve_input_path(raw_path, roots)  # refuses before anything is read
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise HintException(
            "schema",
            f"{raw_path!r} {what} in the data directories",
            _file_alternatives(raw_path, roots),
        )
    file_format = _detect_format(path, requested_format.lower())

    warnings: list[Warning] = []
    if file_format == "csv":
        df = _read_csv(path, _delimiter(raw_delimiter, path), warnings)
    else:
        df = _read_parquet(path, warnings)

    stem = _file_stem(path)
    name = explicit_name if explicit_name is not None else sanitize_identifier(stem)
    if explicit_name is None and name != stem:
        warnings.append(
            Warning(
                kind="renamed",
                message=f"saved as dataset {name!r} (file name {stem!r} is not a SQL name)",
                details={"name": name},
            )
        )
    if any(info.name == name for info in context.list_datasets()):
        warnings.append(Warning(kind="replaced", message=f"replaced the existing dataset {name!r}"))
    context.save_dataset(name, df, source=str(path))
    logger.info("loaded %s as dataset %r (%d rows)", path, name, len(df))
    return _ok(Ok(rows=len(df), schema=measure_schema(df), data=df, warnings=warnings))


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


def _min_max(col: pd.Series) -> tuple[str | None, str | None]:
    """Min and max of a numeric or date/time column as text; (None, None) otherwise."""
    dtype = col.dtype
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


@uniform_contract(name="describe_entry", is_tabular=True)
def describe_entry(inputs: dict[str, Any], context: ToolContext) -> Envelope:
    """Per-column dtype, null/distinct counts and numeric/date min/max of a dataset."""
    name = _required_str(inputs, "name")
    _, df = _load_named(context, name)
    schema = measure_schema(df)
    records: list[dict[str, Any]] = []
    for position, spec in enumerate(schema):
        low, high = _min_max(df.iloc[:, position])
        records.append(
            {
                "column": spec.name,
                "dtype": spec.dtype,
                "null_count": spec.null_count,
                "distinct_count": spec.distinct_count,
                "min": low,
                "max": high,
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


def _check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse anything but a single read statement (parsed by DuckDB, not pattern-matched)."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.ParserException as exc:
        raise HintException("schema", f"SQL syntax error: {_first_lines(exc)}") from exc
    if not statements:
        raise HintException("schema", "sql contains no statement")
    if len(statements) > 1:
        raise HintException(
            "fetch",
            f"sql contains {len(statements)} statements; query runs exactly one read statement "
            "per call",
            [{"label": "one SELECT per query call", "score": 1.0, "action": "narrow"}],
        )
    kind = str(statements[0].type.name)
    if kind not in READ_STATEMENT_TYPES:
        advice = _REFUSAL_ADVICE.get(
            kind, ("a single SELECT over the conversation's datasets, with save_as to keep it",)
        )
        raise HintException(
            "fetch",
            f"{kind} statements are not allowed: query only runs read-only SQL (SELECT, WITH, "
            "VALUES, SHOW, DESCRIBE, SUMMARIZE, EXPLAIN) over this conversation's datasets, "
            "without file or system access",
            [{"label": label, "score": 1.0, "action": "add"} for label in advice],
        )


class _Watchdog:
    """Interrupts a DuckDB connection still running after `timeout_s` (repeatedly, so an
    interrupt that lands between two DuckDB calls is not lost)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, timeout_s: float) -> None:
        self._con = con
        self._timeout_s = timeout_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="query-watchdog", daemon=True)
        self.fired = False

    def _run(self) -> None:
        if self._done.wait(self._timeout_s):
            return
        self.fired = True
        logger.warning("query exceeded %.1fs; interrupting DuckDB", self._timeout_s)
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


def _plain_types(table: pa.Table) -> pa.Table:
    """DuckDB DECIMAL/HUGEINT columns (e.g. sum() of integers) as int64/float64, which pandas
    handles as numbers rather than Python Decimal objects."""
    fields = []
    changed = False
    for field in table.schema:
        target = field.type
        if pa.types.is_decimal(field.type):
            target = pa.int64() if field.type.scale == 0 else pa.float64()
            changed = True
        fields.append(pa.field(field.name, target, field.nullable))
    if not changed:
        return table
    columns = []
    for column, field in zip(table.columns, fields, strict=True):
        try:
            columns.append(column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # int64 overflow
            columns.append(column.cast(pa.float64(), safe=False))
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


def _catalog_hint(exc: BaseException, infos: Sequence[DatasetInfo]) -> HintException:
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


def _binder_hint(exc: BaseException, infos: Sequence[DatasetInfo]) -> HintException:
    text = str(exc)
    for pattern in _MISSING_COLUMN_RES:
        match = pattern.search(text)
        if match is not None:
            return HintException(
                "schema",
                f"no column {match.group('name')!r}: {_first_lines(exc)}",
                _column_alternatives(match.group("name"), infos),
            )
    return HintException("schema", _first_lines(exc))


def _query_timeout(context: ToolContext) -> float:
    if context.settings is None:
        return QUERY_TIMEOUT_CAP_S
    return min(float(context.settings.tool_timeout_s), QUERY_TIMEOUT_CAP_S)


def _execute(
    con: duckdb.DuckDBPyConnection, sql: str, limit: int, keep_all: bool
) -> tuple[pa.Table, int]:
    """Run `sql`; the kept rows (all when keep_all, else at least the first `limit`) and the
    true row count, streamed so the rows past `limit` are counted without being kept."""
    relation = con.sql(sql)
    if relation is None:  # a statement that returned nothing
        return pa.table({}), 0
    reader = relation.to_arrow_reader(QUERY_BATCH_ROWS)
    kept: list[pa.RecordBatch] = []
    kept_rows = 0
    total = 0
    for batch in reader:
        total += batch.num_rows
        if keep_all or kept_rows < limit:
            kept.append(batch)
            kept_rows += batch.num_rows
    return pa.Table.from_batches(kept, schema=reader.schema), total


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
    con = duckdb.connect(":memory:", config=dict(DUCKDB_CONFIG))
    try:
        _check_read_only(con, sql)  # before any dataset is loaded
        infos = context.list_datasets()
        for info in infos:
            try:
                frame = context.load_dataset(info.name)
            except KeyError:
                logger.info("dataset %r vanished before the query; skipping it", info.name)
                continue
            con.register(info.name, dataframe_to_arrow(frame))
        con.execute("SET lock_configuration = true")
        with _Watchdog(con, timeout_s) as watchdog:
            try:
                table, total = _execute(con, sql, limit, keep_all=save_as is not None)
            except duckdb.InterruptException as exc:
                if watchdog.fired:
                    raise QueryTimeout(
                        f"the query ran longer than {timeout_s:g}s and was cancelled; "
                        "narrow it (filter, aggregate, fewer joins)"
                    ) from exc
                raise
            except duckdb.PermissionException as exc:
                raise QueryPermissionDenied(
                    f"{_first_lines(exc)} (query has no file or system access; load files "
                    "with load_dataset)"
                ) from exc
            except duckdb.CatalogException as exc:
                raise _catalog_hint(exc, infos) from exc
            except duckdb.BinderException as exc:
                raise _binder_hint(exc, infos) from exc
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

    table = _plain_types(table)
    names = unique_names(table.column_names)
    if names != table.column_names:
        table = table.rename_columns(names)
        warnings.append(
            Warning(
                kind="duplicate_columns",
                message="the result repeats column names; renamed to " + ", ".join(names),
            )
        )
    full = table.to_pandas()
    truncated = total > limit
    returned = full.iloc[:limit] if truncated else full

    if save_as is not None:
        if any(info.name == save_as for info in infos):
            warnings.append(
                Warning(kind="replaced", message=f"replaced the existing dataset {save_as!r}")
            )
        context.save_dataset(save_as, full, source=f"query: {sql}"[:2000])
        logger.info("saved query result as dataset %r (%d rows)", save_as, total)

    if truncated:
        saved = f"; the full result is saved as {save_as!r}" if save_as is not None else ""
        warnings.append(
            Warning(
                kind="truncated",
                message=(
                    f"returned the first {limit} of {total} rows{saved}; aggregate or filter "
                    f"in SQL, or raise limit (at most {QUERY_MAX_LIMIT})"
                ),
                details={"total_rows": total, "returned_rows": limit},
            )
        )
    if truncated and save_as is None:
        # Only the returned rows were kept: dtypes are exact, null/distinct counts unknown.
        schema = [ColumnSpec(name=str(c), dtype=str(returned[c].dtype)) for c in returned.columns]
    else:
        schema = measure_schema(full)
    return _ok(Ok(rows=total, schema=schema, data=returned, warnings=warnings))


migrate_tool(query, "query", is_tabular=True)
