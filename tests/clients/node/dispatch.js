#!/usr/bin/env node
// A Node client of the dispatcher built from the repo's .proto files alone (no generated code):
//
//   node dispatch.js ADDRESS TOOL_NAME INPUT_JSON CONVERSATION_ID
//
// Prints the DispatchToolCallResponse as one JSON line and exits 0. On a gRPC error it prints
// {"code": <numeric status>, "details": <status message>, "reason": <ErrorInfo reason or null>}
// and exits 3. Usage errors exit 2; anything else (protos not loadable, ...) exits 1.
//
// The ErrorInfo reason is decoded from the grpc-status-details-bin trailer with
// google/rpc/status.proto and google/rpc/error_details.proto. Neither npm package ships those, so
// they are looked up in the repo's protos/ dir and in the directories listed in
// TOOLMESH_PROTO_INCLUDE (path.delimiter separated; the Python tests point it at
// googleapis-common-protos). When they are not found, reason is null.
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTOS = path.resolve(__dirname, '..', '..', '..', 'protos');
const LOADER_OPTIONS = {
  keepCase: true,
  longs: String,
  enums: String,
  bytes: String, // base64, so the response stays printable as JSON
  defaults: true,
  oneofs: true,
};
const DEADLINE_MS = 60_000;

function includeDirs() {
  const extra = (process.env.TOOLMESH_PROTO_INCLUDE || '').split(path.delimiter).filter(Boolean);
  return [PROTOS, ...extra];
}

// Returns a decoder of grpc-status-details-bin to the ErrorInfo reason, or null when the
// google.rpc protos are not available.
function statusDecoder() {
  const files = ['google/rpc/status.proto', 'google/rpc/error_details.proto'];
  const dirs = includeDirs();
  const found = files.every((f) => dirs.some((d) => fs.existsSync(path.join(d, f))));
  if (!found) return null;
  // json: true expands google.protobuf.Any details whose type is loaded into {'@type', ...fields}.
  const defs = protoLoader.loadSync(files, { ...LOADER_OPTIONS, includeDirs: dirs, json: true });
  const Status = defs['google.rpc.Status'];
  return (buffer) => {
    const status = Status.deserialize(buffer);
    const info = (status.details || []).find(
      (d) => typeof d['@type'] === 'string' && d['@type'].endsWith('/google.rpc.ErrorInfo'),
    );
    return info ? info.reason : null;
  };
}

function errorReason(err) {
  const raw = err.metadata ? err.metadata.get('grpc-status-details-bin') : [];
  if (!raw.length) return null;
  const decode = statusDecoder();
  return decode ? decode(raw[0]) : null;
}

function main(argv) {
  if (argv.length !== 4) {
    process.stderr.write('usage: dispatch.js ADDRESS TOOL_NAME INPUT_JSON CONVERSATION_ID\n');
    process.exitCode = 2;
    return;
  }
  const [address, name, inputJson, conversationId] = argv;
  const defs = protoLoader.loadSync('toolmesh/dispatcher/v1/dispatcher.proto', {
    ...LOADER_OPTIONS,
    includeDirs: [PROTOS],
  });
  const { DispatcherService } = grpc.loadPackageDefinition(defs).toolmesh.dispatcher.v1;
  const client = new DispatcherService(address, grpc.credentials.createInsecure());
  const request = {
    tool_use: { name, input_json: inputJson },
    context: { tenant_id: 'node-tenant', conversation_id: conversationId },
  };
  const deadline = new Date(Date.now() + DEADLINE_MS);
  client.DispatchToolCall(request, { deadline }, (err, response) => {
    client.close();
    if (err) {
      let reason = null;
      try {
        reason = errorReason(err);
      } catch (decodeError) {
        process.stderr.write(`could not decode the status details: ${decodeError}\n`);
      }
      process.stdout.write(`${JSON.stringify({ code: err.code, details: err.details, reason })}\n`);
      process.exitCode = 3;
      return;
    }
    process.stdout.write(`${JSON.stringify(response)}\n`);
  });
}

try {
  main(process.argv.slice(2));
} catch (err) {
  process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
  process.exitCode = 1;
}
