"""The schema names an object column by what it holds — a model reading `when object` could
not tell it held dates (Parquet DATE, JSON dates), lists (JSON arrays) or exact decimals."""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pandas as pd
import pytest

from shared.contract import measure_schema
from shared.contract.envelope import shown_dtype


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        ([datetime.date(2024, 1, 5), None], "date"),
        ([datetime.time(9, 30), datetime.time(10, 0)], "time"),
        ([decimal.Decimal("1.10"), decimal.Decimal("2")], "decimal"),
        ([True, None, False], "bool"),
        ([b"\x00", b"a"], "bytes"),
        (["a", None, "b"], "str"),
        ([[1, 2], [], np.array([3])], "list"),
        ([{"a": 1}, {"b": 2}], "struct"),
        ([1, "a", datetime.date(2024, 1, 1)], "object"),  # a mix keeps pandas' name
        ([None, None], "object"),
    ],
)
def test_an_object_column_is_named_by_what_it_holds(values: list[object], shown: str) -> None:
    assert shown_dtype(pd.Series(values, dtype=object)) == shown


def test_typed_columns_keep_pandas_names_in_the_measured_schema() -> None:
    frame = pd.DataFrame(
        {
            "n": pd.Series([1, None], dtype="Int64"),
            "t": pd.to_datetime(["2024-01-01", None]),
            "d": pd.Series([datetime.date(2024, 1, 1), None], dtype=object),
        }
    )

    assert [(c.name, c.dtype) for c in measure_schema(frame)] == [
        ("n", "Int64"),
        ("t", str(frame["t"].dtype)),
        ("d", "date"),
    ]
