"""What a worker's Arrow IPC table would cost the host to decode, read from the stream's message
headers before any buffer is touched.

A table's bytes say little about its decoded size: a column of type null holds no buffer at all
(a 600-byte stream of 10^8 nulls became an 800 MB object column in the host), and a compressed
buffer states its own decompressed length. Honest workers write uncompressed streams, so a
compressed one is refused, and a table is refused when its cells (every array's length, nested
children and dictionaries included) exceed a budget, or its columns a fixed cap (a column of
no rows holds no cells, yet every service handling the result pays for it); one that passes is
then validated in full (offsets and indices within their buffers) before anything converts it.
Each message header is a flatbuffer (format/Message.fbs); only the few fields needed here are
read."""

from __future__ import annotations

import struct

import pyarrow as pa

_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3  # MessageHeader union tags
_FIELD_NODE = struct.Struct("<qq")  # FieldNode: length, null_count
# The most columns a table may have: each costs every service that handles the result (its
# schema is measured and encoded column by column), whatever its cells.
MAX_TABLE_COLUMNS = 1000


class _Compressed(Exception):
    """A record batch whose buffers are compressed."""


class _Flatbuffer:
    """Just enough of the flatbuffers wire format to read one table's scalar and offset fields;
    anything out of range raises struct.error or ValueError."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def _u(self, fmt: str, pos: int) -> int:
        if pos < 0:
            raise ValueError("offset out of range")
        return int(struct.unpack_from(fmt, self.data, pos)[0])

    def root(self) -> int:
        return self._u("<I", 0)

    def field(self, table: int, index: int) -> int | None:
        """Where field `index` of the table at `table` is, or None when absent."""
        vtable = table - struct.unpack_from("<i", self.data, table)[0]
        if 4 + 2 * index + 2 > self._u("<H", vtable):
            return None
        offset = self._u("<H", vtable + 4 + 2 * index)
        return table + offset if offset else None

    def scalar(self, table: int, index: int, fmt: str) -> int:
        pos = self.field(table, index)
        return 0 if pos is None else self._u(fmt, pos)

    def table(self, table: int, index: int) -> int | None:
        pos = self.field(table, index)
        return None if pos is None else pos + self._u("<I", pos)

    def vector(self, table: int, index: int) -> tuple[int, int]:
        """(start, length) of a vector field; (0, 0) when absent."""
        pos = self.table(table, index)  # a vector is reached by an offset, like a table
        return (0, 0) if pos is None else (pos + 4, self._u("<I", pos))


def _batch_cells(fb: _Flatbuffer, batch: int) -> int:
    """Rows plus the length of every array of a RecordBatch table; raises _Compressed when
    its buffers are compressed."""
    if fb.field(batch, 3) is not None:  # RecordBatch.compression
        raise _Compressed
    rows = fb.scalar(batch, 0, "<q")
    start, count = fb.vector(batch, 1)
    nodes = memoryview(fb.data)[start : start + count * _FIELD_NODE.size]
    if len(nodes) != count * _FIELD_NODE.size:
        raise ValueError("field nodes out of range")
    lengths = [length for length, _nulls in _FIELD_NODE.iter_unpack(nodes)]
    if rows < 0 or any(length < 0 for length in lengths):
        raise ValueError("negative length")
    return rows + sum(lengths)


def _foreign_type(data_type: pa.DataType) -> str | None:
    """The first type within `data_type` that pyarrow never makes from a DataFrame, or None.
    Run-end encoding packs any number of rows into a few bytes (a 496-byte stream of 520,000
    intervals took the host seconds to convert, with every other call waiting), and views and
    unions are no more a DataFrame's than it is."""
    stack = [data_type]
    while stack:
        t = stack.pop()
        if isinstance(t, pa.ExtensionType):
            stack.append(t.storage_type)
            continue
        if (
            pa.types.is_run_end_encoded(t)
            or pa.types.is_union(t)
            or pa.types.is_string_view(t)
            or pa.types.is_binary_view(t)
            or pa.types.is_list_view(t)
            or pa.types.is_large_list_view(t)
        ):
            return str(t)[:100]
        if pa.types.is_dictionary(t):
            stack.extend((t.index_type, t.value_type))
        else:
            stack.extend(t.field(i).type for i in range(t.num_fields))
    return None


def table_problem(data: bytes, max_cells: int) -> tuple[str, str] | None:
    """Why the host should not decode this Arrow IPC stream, as (err_kind, message), or None."""
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(data))
    cells = 0
    try:
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            fb = _Flatbuffer(message.metadata.to_pybytes())
            root = fb.root()
            kind = fb.scalar(root, 1, "<B")  # Message.header_type
            header = fb.table(root, 2)  # Message.header
            if kind == _SCHEMA:
                continue
            if header is None or kind not in (_RECORD_BATCH, _DICTIONARY_BATCH):
                return "bad_result", f"its table holds an Arrow message of type {kind}"
            batch = header if kind == _RECORD_BATCH else fb.table(header, 1)
            if batch is None:
                return "bad_result", "its table holds a dictionary batch without data"
            cells += _batch_cells(fb, batch)
            if cells > max_cells:
                return "output_limit", (
                    f"its table has more than {max_cells} cells (rows and values; the limit is "
                    "one a byte of the output limit)"
                )
        # Affordable now, and uncompressed: zero-copy. Arrow's reader checks the messages, not
        # the arrays, and converting an array whose offsets point outside its buffers crashed
        # the host (a segfault in to_pandas): every offset and index is checked first.
        stream = pa.ipc.open_stream(data)
        if len(stream.schema) > MAX_TABLE_COLUMNS:  # columns of no rows hold no cells at all
            return "output_limit", (
                f"its table has {len(stream.schema)} columns, more than the {MAX_TABLE_COLUMNS} "
                "a result may have"
            )
        table = stream.read_all()
        for field in table.schema:
            foreign = _foreign_type(field.type)
            if foreign is not None:
                return "bad_result", (
                    f"its table's column {field.name[:100]!r} is of Arrow type {foreign}, "
                    "which a DataFrame never converts to"
                )
        table.validate(full=True)
    except _Compressed:
        return "bad_result", "its table is a compressed Arrow stream (write it uncompressed)"
    except (pa.ArrowException, OSError, ValueError, struct.error) as exc:
        return "bad_result", f"its table is not a well-formed Arrow IPC stream ({str(exc)[:200]})"
    return None
