#!/usr/bin/env node
// A Node client that calls a tool through the dispatcher and decodes the tables of its result
// (Arrow IPC streams, zstd-compressed) with the apache-arrow npm package; protos as dispatch.js:
//
//   node datasets.js ADDRESS TOOL_NAME INPUT_JSON CONVERSATION_ID
//
// Calls DispatchToolCall and prints one JSON line and exits 0:
//   {"kind": <envelope kind>, "content": <result content>, "rows": <Ok.rows or null>,
//    "table": <Ok.table decoded or null>, "datasets": [<ToolResult.datasets decoded>]}
// A decoded table is {"name", "row_count" (as declared), "fields": [{"name", "type" (the Arrow
// type, e.g. "Int64", "Timestamp<MICROSECOND>"), "nullable"}], "rows": [{column: value}]}, its
// values typed as the column is: integers as JSON integers (64-bit ones exactly, past 2^53 too),
// floats always with a fraction or exponent (2.0, not 2; NaN and infinities as the strings
// "NaN", "Infinity", "-Infinity"), strings, booleans, nulls as null, timestamps as ISO 8601
// text at the column's precision ("Z" appended when the column has a time zone), dates as
// YYYY-MM-DD, binary as base64. On a gRPC error it prints
// {"code": <numeric status>, "details": <status message>, "reason": <ErrorInfo reason or null>}
// and exits 3. Usage errors exit 2; anything else (protos not loadable, a table that does not
// decode, ...) exits 1.
'use strict';

const arrow = require('apache-arrow');
const fzstd = require('fzstd');
const { runUnary } = require('./mesh');

// The mesh writes its IPC streams zstd-compressed; apache-arrow decompresses through a codec
// registered here. fzstd hands back views at any byte offset, and apache-arrow uses each
// decompressed buffer as the column's memory as it is (a Float64Array needs an 8-aligned
// offset), so the codec returns an aligned copy when it must.
arrow.compressionRegistry.set(arrow.CompressionType.ZSTD, {
  decode(data) {
    const out = fzstd.decompress(data);
    return out.byteOffset % 8 === 0 ? out : out.slice();
  },
});

// A float that serializes with a fraction or an exponent, so a JSON reader sees a float.
class JsonFloat {
  constructor(value) {
    this.value = value;
  }

  toText() {
    const x = this.value;
    if (Number.isNaN(x)) return '"NaN"';
    if (!Number.isFinite(x)) return x > 0 ? '"Infinity"' : '"-Infinity"';
    if (Object.is(x, -0)) return '-0.0';
    const text = String(x);
    return /[.eE]/.test(text) ? text : `${text}.0`;
  }
}

// JSON text of plain values, bigints (as exact integers) and JsonFloats.
function jsonText(value) {
  if (value === null || value === undefined) return 'null';
  if (typeof value === 'bigint') return value.toString();
  if (value instanceof JsonFloat) return value.toText();
  if (Array.isArray(value)) return `[${value.map(jsonText).join(',')}]`;
  if (typeof value === 'object') {
    const entries = Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}:${jsonText(v)}`);
    return `{${entries.join(',')}}`;
  }
  return JSON.stringify(value);
}

const PER_SECOND = [1n, 1_000n, 1_000_000n, 1_000_000_000n]; // by arrow.TimeUnit

// ISO 8601 text of a timestamp given as an integer count of `unit` since the epoch (UTC).
function timestampText(raw, unit, timezone) {
  const per = PER_SECOND[unit];
  let seconds = raw / per;
  let fraction = raw % per;
  if (fraction < 0n) {
    fraction += per;
    seconds -= 1n;
  }
  let text = new Date(Number(seconds) * 1000).toISOString().slice(0, -5); // no ".000Z"
  if (unit !== arrow.TimeUnit.SECOND) {
    text += `.${fraction.toString().padStart(3 * unit, '0')}`;
  }
  return timezone ? `${text}Z` : text;
}

// A value as apache-arrow's get() returns it, as JSON-ready data of its Arrow type.
function plainValue(type, value) {
  if (value === null || value === undefined) return null;
  switch (type.typeId) {
    case arrow.Type.Float:
      return new JsonFloat(value);
    case arrow.Type.Timestamp: // get() gives milliseconds: exact for the units it can hold
      return timestampText(BigInt(Math.floor(value)), arrow.TimeUnit.MILLISECOND, type.timezone);
    case arrow.Type.Date:
      return new Date(value instanceof Date ? value.getTime() : value).toISOString().slice(0, 10);
    case arrow.Type.Binary:
    case arrow.Type.LargeBinary:
    case arrow.Type.FixedSizeBinary:
      return Buffer.from(value).toString('base64');
    case arrow.Type.Dictionary:
      return plainValue(type.dictionary, value);
    case arrow.Type.List:
    case arrow.Type.LargeList:
    case arrow.Type.FixedSizeList:
      return [...value].map((item) => plainValue(type.children[0].type, item));
    case arrow.Type.Struct: {
      const out = {};
      for (const child of type.children) {
        out[child.name] = plainValue(child.type, value[child.name]);
      }
      return out;
    }
    default: // integers (bigint when 64-bit), strings, booleans
      return typeof value === 'object' && typeof value.toJSON === 'function'
        ? value.toJSON()
        : value;
  }
}

// The values of one column; timestamps read from their raw integers (get() rounds to ms).
function columnValues(field, vector) {
  const values = [];
  for (const chunk of vector.data) {
    const chunkVector = arrow.makeVector(chunk);
    for (let i = 0; i < chunk.length; i += 1) {
      if (!chunkVector.isValid(i)) {
        values.push(null);
      } else if (field.type.typeId === arrow.Type.Timestamp) {
        values.push(timestampText(BigInt(chunk.values[i]), field.type.unit, field.type.timezone));
      } else {
        values.push(plainValue(field.type, chunkVector.get(i)));
      }
    }
  }
  return values;
}

// A Dataset message (arrow_ipc as base64) decoded.
function decodeDataset(dataset) {
  const bytes = Buffer.from(dataset.arrow_ipc, 'base64');
  // A copy at offset 0: Buffer.from may return a view into a shared pool at any offset.
  const table = arrow.tableFromIPC(new Uint8Array(bytes));
  const fields = table.schema.fields;
  const columns = fields.map((field, i) => columnValues(field, table.getChildAt(i)));
  const rows = [];
  for (let r = 0; r < table.numRows; r += 1) {
    const row = {};
    fields.forEach((field, i) => {
      row[field.name] = columns[i][r];
    });
    rows.push(row);
  }
  return {
    name: dataset.name,
    row_count: Number(dataset.rows),
    fields: fields.map((f) => ({ name: f.name, type: String(f.type), nullable: f.nullable })),
    rows,
  };
}

function summary(result) {
  const envelope = result.envelope || {};
  const ok = envelope.kind === 'ok' ? envelope.ok : null;
  return {
    kind: envelope.kind || null,
    content: result.content,
    rows: ok ? Number(ok.rows) : null,
    table: ok && ok.table ? decodeDataset(ok.table) : null,
    datasets: (result.datasets || []).map(decodeDataset),
  };
}

runUnary('datasets.js', (response) => jsonText(summary(response.result)));
