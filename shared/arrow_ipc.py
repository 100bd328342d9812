"""DataFrames on the wire and at rest: Arrow IPC streams (zstd-compressed), never pickle."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc


def dataframe_to_ipc(df: pd.DataFrame, *, compress: bool = True) -> bytes:
    table = pa.Table.from_pandas(df, preserve_index=False)
    options = ipc.IpcWriteOptions(compression="zstd" if compress else None)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def ipc_to_dataframe(data: bytes) -> pd.DataFrame:
    with ipc.open_stream(pa.BufferReader(data)) as reader:
        table = reader.read_all()
    return table.to_pandas()
