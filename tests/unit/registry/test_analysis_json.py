"""load_dataset on JSON as open-data portals and APIs publish it: an array of records, JSON
Lines (compressed too), a document holding its records under a key beside paging fields,
nested objects — read by DuckDB's JSON reader from the very file opened — and malformed ones."""

from __future__ import annotations

import datetime
import gzip
import json
from pathlib import Path

import pytest

from services.registry.context import ToolContext
from services.registry.datasets import SqlDatasetStore
from services.registry.tools.analysis import (
    DatasetTooLarge,
    describe_entry,
    load_dataset,
    query,
)
from shared.contract import HintException

from .analysis_support import make_context, ok_of, warning_of

RECORDS = [
    {
        "id": 1,
        "name": "Ada",
        "joined": "2024-01-05",
        "address": {"city": "Oslo", "zip": "0150"},
        "tags": ["a", "b"],
        "score": 9.5,
    },
    {
        "id": 2,
        "name": "Bo",
        "joined": "2024-02-10",
        "address": {"city": "Bergen", "zip": "5003"},
        "tags": [],
        "score": None,
    },
]


def test_an_array_of_records_loads_typed_with_nested_objects_as_columns(
    ctx: ToolContext, files: Path
) -> None:
    (files / "people.json").write_text(json.dumps(RECORDS), "utf-8")

    ok = ok_of(load_dataset({"path": "people.json"}, ctx))

    assert ok.rows == 2
    stored = ctx.load_dataset("people")
    assert list(stored.columns) == [
        "id",
        "name",
        "joined",
        "address.city",
        "address.zip",
        "tags",
        "score",
    ]
    assert stored["id"].tolist() == [1, 2]
    assert stored["address.zip"].tolist() == ["0150", "5003"]  # strings stay strings
    assert stored["joined"].tolist() == [datetime.date(2024, 1, 5), datetime.date(2024, 2, 10)]
    sql = (
        'SELECT "address.city" AS city, len(tags) AS n FROM people '
        "WHERE joined > DATE '2024-01-31'"
    )
    assert ok_of(query({"sql": sql}, ctx)).data.to_dict("list") == {"city": ["Bergen"], "n": [0]}


@pytest.mark.parametrize("name", ["events.jsonl", "events.ndjson", "events.jsonl.gz"])
def test_json_lines_load_compressed_or_not(ctx: ToolContext, files: Path, name: str) -> None:
    text = '{"a": 1, "b": "x"}\n{"a": 2, "b": "y", "c": true}\n\n'
    data = gzip.compress(text.encode()) if name.endswith(".gz") else text.encode()
    (files / name).write_bytes(data)

    ok_of(load_dataset({"path": name, "name": "events"}, ctx))

    stored = ctx.load_dataset("events")
    assert stored["a"].tolist() == [1, 2] and stored["b"].tolist() == ["x", "y"]
    assert stored["c"].tolist()[1] is True


def test_records_under_a_key_beside_paging_fields_are_the_table(
    ctx: ToolContext, files: Path
) -> None:
    """An API's answer saved to a file: before, one row holding a list."""
    document = {"count": 2, "next": None, "results": RECORDS}
    (files / "page.json").write_text(json.dumps(document), "utf-8")

    ok = ok_of(load_dataset({"path": "page.json"}, ctx))

    warning = warning_of(ok, "records")
    assert warning.details == {"key": "results", "other_fields": ["count", "next"]}
    assert ctx.load_dataset("page")["name"].tolist() == ["Ada", "Bo"]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[{"a": 1}, {"a": ', "Malformed JSON"),
        ("{'a': 1}", "Malformed JSON"),
        ("", "could not read"),
        ("[]", "holds no records"),
    ],
)
def test_malformed_json_is_a_hint_naming_the_file_and_the_fault(
    ctx: ToolContext, files: Path, text: str, said: str
) -> None:
    (files / "bad.json").write_text(text, "utf-8")

    with pytest.raises(HintException) as refused:
        load_dataset({"path": "bad.json"}, ctx)

    message = refused.value.message
    assert "could not read 'bad.json' as JSON" in message and said in message
    assert "/proc/" not in message  # the file's name, not the descriptor DuckDB was given


def test_a_json_file_over_the_dataset_limit_is_refused(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    small = make_context(tmp_path, store, max_dataset_bytes=64 * 1024)
    rows = "".join(json.dumps({"i": i, "text": "x" * 200}) + "\n" for i in range(2000))
    (files / "big.jsonl.gz").write_bytes(gzip.compress(rows.encode()))  # small on disk

    with pytest.raises(DatasetTooLarge):
        load_dataset({"path": "big.jsonl.gz"}, small)


def test_json_named_csv_is_a_hint_to_pass_format_json_which_then_reads_it(
    ctx: ToolContext, files: Path
) -> None:
    (files / "export.csv").write_text(json.dumps(RECORDS), "utf-8")

    with pytest.raises(HintException) as refused:
        load_dataset({"path": "export.csv"}, ctx)
    assert "format='json'" in refused.value.message

    ok_of(load_dataset({"path": "export.csv", "format": "json"}, ctx))
    assert ctx.load_dataset("export")["name"].tolist() == ["Ada", "Bo"]


def test_list_columns_are_described_as_the_preview_writes_them(
    ctx: ToolContext, files: Path
) -> None:
    """describe_entry's top values showed numpy's "['a' 'b']" for a JSON array."""
    (files / "people.json").write_text(json.dumps(RECORDS), "utf-8")
    ok_of(load_dataset({"path": "people.json"}, ctx))

    described = ok_of(describe_entry({"name": "people"}, ctx)).data.set_index("column")

    assert described.loc["tags", "top_values"] == '["a","b"] ×1, [] ×1'
