"""Schemas of the "analysis" system tools — load_dataset, preview_data, describe_entry and query —
in the order they appear in the model's tool list. Handlers live in
services/registry/tools/analysis.py."""

from __future__ import annotations

from typing import Any

_HANDLERS = "services.registry.tools.analysis"

_DATASET_NAME = {
    "type": "string",
    "minLength": 1,
    "maxLength": 128,
    "description": (
        "Name of a dataset of this conversation, as given or reported by load_dataset or "
        "query(save_as=...)."
    ),
}

TOOLS: list[dict[str, Any]] = [
    {
        "name": "load_dataset",
        "description": (
            "Load a CSV, Parquet, Excel (.xlsx, .xls), OpenDocument (.ods) or JSON file, or a "
            "table of a SQLite database, from the platform's data directories into a named table "
            "(a dataset) of this conversation, so preview_data, describe_entry and query can use "
            "it. Use this first whenever the user refers to a data file. The dataset is named "
            "after the file (lowercased, non [a-z0-9_] characters replaced by _, e.g. "
            "'Sales 2024.csv' -> sales_2024) unless `name` is given; loading again under the "
            "same name replaces it. Returns the row count, the measured schema and a short "
            "preview. Only files inside the configured data directories can be read."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "minLength": 1,
                    "description": (
                        "File path, relative to the data directory (e.g. 'sales/2024.csv'), or "
                        "an absolute path inside it."
                    ),
                },
                "name": {
                    "type": "string",
                    "pattern": "^[a-z_][a-z0-9_]*$",
                    "maxLength": 64,
                    "description": (
                        "Dataset name to save under: lowercase letters, digits and underscores, "
                        "not starting with a digit. Defaults to the sanitised file name."
                    ),
                },
                "format": {
                    "type": "string",
                    "enum": ["auto", "csv", "parquet", "excel", "json", "sqlite"],
                    "default": "auto",
                    "description": (
                        "File format; 'auto' (default) decides from the extension (.csv, .tsv, "
                        ".txt, optionally compressed, .parquet/.pq, .xlsx/.xlsm/.xls/.ods, "
                        ".json/.jsonl/.ndjson, or .sqlite/.sqlite3/.db)."
                    ),
                },
                "sheet": {
                    "type": ["string", "integer"],
                    "minLength": 1,
                    "maxLength": 100,
                    "minimum": 1,
                    "description": (
                        "Spreadsheets (.xlsx, .xls, .ods): the sheet to load, by name or 1-based "
                        "position (2). Omitted: the first sheet with data (the others are named "
                        "in a warning). Ignored for CSV, Parquet and JSON."
                    ),
                },
                "table": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 128,
                    "description": (
                        "SQLite databases: the table to load (the dataset is named after it "
                        "unless `name` is given). Omitted: the database's only table. Ignored "
                        "for other formats."
                    ),
                },
                "delimiter": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 3,
                    "description": (
                        "CSV field separator, one character ('\\t' means tab). Omitted: tab "
                        "for .tsv, else read off the file's first lines (comma, tab, "
                        "semicolon or pipe; comma when unclear). Ignored for Parquet."
                    ),
                },
                "header": {
                    "type": "boolean",
                    "description": (
                        "Whether the CSV's first row names the columns. Omitted: read off the "
                        "file (a first row of values, as in many classic datasets, names the "
                        "columns column_1, column_2, …). Ignored for Parquet."
                    ),
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        "category": "analysis",
        "handler_path": f"{_HANDLERS}.load_dataset",
        "status_message": "Loading dataset",
        "large_output": False,
    },
    {
        "name": "preview_data",
        "description": (
            "Show a window of rows of a dataset of this conversation, with its true total row "
            "count and measured schema. Use it to look at actual values before writing a query; "
            "page through with offset. For aggregates, filters or joins use query instead."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "name": _DATASET_NAME,
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 200,
                    "default": 10,
                    "description": "Number of rows to show (default 10, at most 200).",
                },
                "offset": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 0,
                    "description": "Index of the first row to show (default 0).",
                },
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        "category": "analysis",
        "handler_path": f"{_HANDLERS}.preview_data",
        "status_message": "Previewing data",
        "large_output": False,
    },
    {
        "name": "describe_entry",
        "description": (
            "Describe a dataset of this conversation column by column: dtype, null count, "
            "distinct count, min/max for numeric and date/time columns, and the most frequent "
            "values (with counts) of text columns. Use it to check column names, types, data "
            "quality and how values are spelt before querying."
        ),
        "input_schema": {
            "type": "object",
            "properties": {"name": _DATASET_NAME},
            "required": ["name"],
            "additionalProperties": False,
        },
        "category": "analysis",
        "handler_path": f"{_HANDLERS}.describe_entry",
        "status_message": "Describing dataset",
        "large_output": False,
    },
    {
        "name": "query",
        "description": (
            "Run one read-only SQL statement (DuckDB dialect) over the datasets of this "
            "conversation; every dataset is a table of the same name. Allowed: SELECT / WITH / "
            "VALUES / FROM-first, SHOW TABLES, DESCRIBE <table>, SUMMARIZE <table>, EXPLAIN. Not "
            "allowed: anything that writes or touches files (CREATE, INSERT, COPY, ATTACH, SET, "
            "PRAGMA, read_csv(...)); to keep a result as a new dataset pass save_as instead, and "
            "to read a file use load_dataset. Returns the true row count, the measured schema "
            "and up to `limit` rows; prefer aggregating in SQL over fetching many rows."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "sql": {
                    "type": "string",
                    "minLength": 1,
                    "description": (
                        "A single DuckDB SQL read statement, e.g. 'SELECT region, sum(amount) "
                        "AS total FROM sales GROUP BY region ORDER BY total DESC'."
                    ),
                },
                "save_as": {
                    "type": "string",
                    "pattern": "^[a-z_][a-z0-9_]*$",
                    "maxLength": 64,
                    "description": (
                        "Save the full result (not only the returned rows) as a dataset of this "
                        "name for later calls; replaces a dataset of the same name."
                    ),
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 10000,
                    "default": 1000,
                    "description": (
                        "Maximum number of rows to return (default 1000, at most 10000). The "
                        "total row count is always reported."
                    ),
                },
            },
            "required": ["sql"],
            "additionalProperties": False,
        },
        "category": "analysis",
        "handler_path": f"{_HANDLERS}.query",
        "status_message": "Querying data",
        "large_output": True,
    },
]
