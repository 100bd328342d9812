// What the Node scripts of this folder (dispatch.js, stream.js, datasets.js) share: the
// dispatcher client built from the repo's .proto files alone (no generated code), the request
// they send, and the JSON line printed for a gRPC error:
//
//   {"code": <numeric status>, "details": <status message>, "reason": <ErrorInfo reason or null>}
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
// A tool's result may be up to 32 MB serialised, over grpc-js's default 4 MB receive limit.
const CLIENT_OPTIONS = { 'grpc.max_receive_message_length': 64 << 20 };

function includeDirs() {
  const extra = (process.env.TOOLMESH_PROTO_INCLUDE || '').split(path.delimiter).filter(Boolean);
  return [PROTOS, ...extra];
}

// A DispatcherService client of `address` (plaintext).
function dispatcherClient(address) {
  const defs = protoLoader.loadSync('toolmesh/dispatcher/v1/dispatcher.proto', {
    ...LOADER_OPTIONS,
    includeDirs: [PROTOS],
  });
  const { DispatcherService } = grpc.loadPackageDefinition(defs).toolmesh.dispatcher.v1;
  return new DispatcherService(address, grpc.credentials.createInsecure(), CLIENT_OPTIONS);
}

// The request of DispatchToolCall and DispatchToolCallStream (the same fields).
function toolCallRequest(name, inputJson, conversationId) {
  return {
    tool_use: { name, input_json: inputJson },
    context: { tenant_id: 'node-tenant', conversation_id: conversationId },
  };
}

function callOptions() {
  return { deadline: new Date(Date.now() + DEADLINE_MS) };
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

// Prints the JSON line of a gRPC error and sets exit code 3.
function printError(err) {
  let reason = null;
  try {
    reason = errorReason(err);
  } catch (decodeError) {
    process.stderr.write(`could not decode the status details: ${decodeError}\n`);
  }
  process.stdout.write(`${JSON.stringify({ code: err.code, details: err.details, reason })}\n`);
  process.exitCode = 3;
}

// Runs a one-answer client: `node <script> ADDRESS TOOL_NAME INPUT_JSON CONVERSATION_ID` makes
// one DispatchToolCall and prints `render(response)` as one line (exit 0); a gRPC error is the
// error line (exit 3), a usage error exit 2, a response `render` cannot turn into text exit 1.
function runUnary(script, render) {
  run((argv) => {
    if (argv.length !== 4) {
      process.stderr.write(`usage: ${script} ADDRESS TOOL_NAME INPUT_JSON CONVERSATION_ID\n`);
      process.exitCode = 2;
      return;
    }
    const [address, name, inputJson, conversationId] = argv;
    const client = dispatcherClient(address);
    const request = toolCallRequest(name, inputJson, conversationId);
    client.DispatchToolCall(request, callOptions(), (err, response) => {
      client.close();
      if (err) {
        printError(err);
        return;
      }
      let line;
      try {
        line = render(response);
      } catch (renderError) {
        const shown = renderError && renderError.stack ? renderError.stack : renderError;
        process.stderr.write(`${shown}\n`);
        process.exitCode = 1;
        return;
      }
      process.stdout.write(`${line}\n`);
    });
  });
}

// Runs `main` with the command line's arguments: an exception is exit code 1.
function run(main) {
  try {
    main(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
    process.exitCode = 1;
  }
}

module.exports = { callOptions, dispatcherClient, printError, run, runUnary, toolCallRequest };
