"""load_dataset reads a table of a SQLite database (as text-to-SQL benchmarks such as Spider
and BIRD ship their data): the table named, or the only one; each column as one type; read
only, never trusting the file's schema (views are not run), within the byte limit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from services.registry.context import ToolContext
from services.registry.datasets import SqlDatasetStore
from services.registry.tools.analysis import DatasetTooLarge, load_dataset, query
from shared.contract import HintException

from .analysis_support import make_context, ok_of, warning_of


def concert_db(path: Path) -> None:
    """Two tables and a view, as a benchmark database has them."""
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, country TEXT,
                             age INT, net_worth REAL, photo BLOB);
        INSERT INTO singer VALUES (1, 'Joe Sharp', 'Netherlands', 52, 30.5, x'0001ff'),
                                  (2, 'Timbaland', 'United States', 32, NULL, NULL),
                                  (3, 'Justin "J" Brown', 'France', NULL, 12, NULL);
        CREATE TABLE "concert info" (concert_id INTEGER, theme TEXT, year TEXT, stadium);
        INSERT INTO "concert info" VALUES (1, 'Free choice', '2014', 'Stark''s Park'),
                                          (2, 'Party All Night', '2015', 42);
        CREATE VIEW older AS SELECT * FROM singer WHERE age > 40;
        """
    )
    con.commit()
    con.close()


def test_a_named_table_loads_typed_under_its_own_name(ctx: ToolContext, files: Path) -> None:
    concert_db(files / "concert_singer.sqlite")

    ok = ok_of(load_dataset({"path": "concert_singer.sqlite", "table": "singer"}, ctx))

    singer = ctx.load_dataset("singer")  # named after the table, not the file
    assert list(singer.columns) == ["singer_id", "name", "country", "age", "net_worth", "photo"]
    assert singer["singer_id"].tolist() == [1, 2, 3]
    assert singer["name"].tolist() == ["Joe Sharp", "Timbaland", 'Justin "J" Brown']
    assert singer["age"].tolist()[:2] == [52, 32] and pd.isna(singer["age"].tolist()[2])
    assert singer["net_worth"].tolist()[0] == 30.5 and singer["net_worth"].tolist()[2] == 12.0
    assert singer["photo"].tolist()[0] == b"\x00\x01\xff"
    assert ok.rows == 3
    counted = ok_of(query({"sql": "SELECT count(*) AS n FROM singer WHERE age > 40"}, ctx))
    assert counted.rows == 1


def test_a_table_whose_name_is_not_sql_and_a_column_of_mixed_types(
    ctx: ToolContext, files: Path
) -> None:
    concert_db(files / "concert.db")

    ok = ok_of(load_dataset({"path": "concert.db", "table": "Concert Info"}, ctx))

    assert warning_of(ok, "renamed").details == {"name": "concert_info"}
    assert warning_of(ok, "mixed_types").details == {"columns": ["stadium"]}
    loaded = ctx.load_dataset("concert_info")
    assert loaded["stadium"].tolist() == ["Stark's Park", "42"]
    assert loaded["year"].tolist() == ["2014", "2015"]  # text stays text, as the file has it


def test_without_a_table_the_only_one_loads_and_several_are_named_in_a_hint(
    ctx: ToolContext, files: Path
) -> None:
    concert_db(files / "concert.sqlite")
    with pytest.raises(HintException) as several:
        load_dataset({"path": "concert.sqlite"}, ctx)
    assert "holds 2 tables" in several.value.message
    assert "'singer'" in several.value.message and "'concert info'" in several.value.message

    one = sqlite3.connect(files / "one.sqlite3")
    one.execute("CREATE TABLE t (a INTEGER)")
    one.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(5)])
    one.commit()
    one.close()
    ok_of(load_dataset({"path": "one.sqlite3", "name": "five"}, ctx))
    assert ctx.load_dataset("five")["a"].tolist() == [0, 1, 2, 3, 4]


def test_an_unknown_table_is_a_hint_with_the_closest_and_a_view_is_not_run(
    ctx: ToolContext, files: Path
) -> None:
    concert_db(files / "concert.sqlite")

    with pytest.raises(HintException) as unknown:
        load_dataset({"path": "concert.sqlite", "table": "singers"}, ctx)
    assert "no table 'singers'" in unknown.value.message
    assert unknown.value.alternatives[0].label == "singer"

    with pytest.raises(HintException) as view:
        load_dataset({"path": "concert.sqlite", "table": "older"}, ctx)
    assert "is a view" in view.value.message
    assert ctx.list_datasets() == []


def test_a_database_under_another_name_is_known_by_its_first_bytes(
    ctx: ToolContext, files: Path
) -> None:
    concert_db(files / "export.dat")
    ok_of(load_dataset({"path": "export.dat", "table": "singer"}, ctx))

    concert_db(files / "export.csv")  # named CSV: said, not read as a one-column CSV of bytes
    with pytest.raises(HintException) as refused:
        load_dataset({"path": "export.csv"}, ctx)
    assert "SQLite database" in refused.value.message
    assert "format='sqlite'" in refused.value.message
    ok_of(
        load_dataset(
            {"path": "export.csv", "format": "sqlite", "table": "singer", "name": "s"}, ctx
        )
    )
    assert len(ctx.load_dataset("s")) == 3


def test_a_corrupt_or_hostile_database_is_a_hint_and_leaves_nothing_behind(
    ctx: ToolContext, files: Path
) -> None:
    (files / "broken.sqlite").write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    with pytest.raises(HintException, match=r"could not (open|read) 'broken\.sqlite'"):
        load_dataset({"path": "broken.sqlite", "table": "t"}, ctx)

    # A trigger or view can call functions only a trusted schema may: the file's own SQL is
    # never run, and the database file is not written (no journal, no lock file beside it).
    hostile = files / "hostile.db"
    con = sqlite3.connect(hostile)
    con.executescript(
        "CREATE TABLE t (a INTEGER); INSERT INTO t VALUES (1);"
        "CREATE VIEW v AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
        "SELECT n FROM r;"
    )
    con.commit()
    con.close()
    before = sorted(p.name for p in files.iterdir())
    with pytest.raises(HintException, match="is a view"):
        load_dataset({"path": "hostile.db", "table": "v"}, ctx)
    ok_of(load_dataset({"path": "hostile.db", "table": "t"}, ctx))
    assert sorted(p.name for p in files.iterdir()) == before


def test_a_table_decoding_to_more_than_the_limit_is_refused(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    # SQLite stores a 0 or a 1 in no bytes at all: a 1.5 MB file of them is ~8 MB of values.
    con = sqlite3.connect(files / "flags.sqlite")
    con.execute(f"CREATE TABLE t ({', '.join(f'c{i} INTEGER' for i in range(10))})")
    con.executemany(f"INSERT INTO t VALUES ({', '.join('01' * 5)})", [() for _ in range(100_000)])
    con.commit()
    con.close()
    assert (files / "flags.sqlite").stat().st_size < 2 << 20
    small = make_context(tmp_path, store, max_dataset_bytes=2 << 20)

    with pytest.raises(DatasetTooLarge, match=r"table 't' holds over"):
        load_dataset({"path": "flags.sqlite"}, small)
    assert small.list_datasets() == []


def test_a_generated_column_cannot_make_values_past_the_limit(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    """The file's schema computes a generated column as it is read: each row's value is held
    to the byte limit (zeroblob(1e9) would be 1 GB a row), and so is the table."""
    con = sqlite3.connect(files / "gen.sqlite")
    con.executescript(
        "CREATE TABLE t (a INTEGER, b BLOB GENERATED ALWAYS AS (zeroblob(1000000000)) VIRTUAL,"
        " c BLOB GENERATED ALWAYS AS (zeroblob(a)) VIRTUAL);"
        "INSERT INTO t (a) VALUES (1), (2);"
    )
    con.commit()
    con.close()
    small = make_context(tmp_path, store, max_dataset_bytes=1 << 20)

    with pytest.raises(HintException, match="too big"):
        load_dataset({"path": "gen.sqlite"}, small)
    assert small.list_datasets() == []
