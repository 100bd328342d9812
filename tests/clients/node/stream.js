#!/usr/bin/env node
// A Node client of the dispatcher's server-streaming RPC, built from the repo's .proto files alone:
//
//   node stream.js [--cancel-after N] ADDRESS TOOL_NAME INPUT_JSON CONVERSATION_ID
//
// Calls DispatchToolCallStream and prints every DispatchToolCallStreamResponse as it arrives, one
// JSON line each: {"event": "progress" | "card" | "text_delta" | "export_ready" | "result",
// <event>: <its message>}; the last one carries the result (a DispatchToolCallResponse, bytes as
// base64). Exits 0 when the stream ends. On a gRPC error it prints
// {"code": <numeric status>, "details": <status message>, "reason": <ErrorInfo reason or null>}
// as the last line and exits 3. With --cancel-after N it cancels the call after the N-th message
// (as a frontend's stop button does): N message lines, then the CANCELLED status (code 1), exit 3.
// Usage errors exit 2; anything else (protos not loadable, ...) exits 1.
'use strict';

const { callOptions, dispatcherClient, printError, run, toolCallRequest } = require('./mesh');

const USAGE =
  'usage: stream.js [--cancel-after N] ADDRESS TOOL_NAME INPUT_JSON CONVERSATION_ID\n';

function parseArgs(argv) {
  let cancelAfter = null;
  const rest = [...argv];
  if (rest[0] === '--cancel-after') {
    cancelAfter = Number(rest[1]);
    if (!Number.isInteger(cancelAfter) || cancelAfter < 1) return null;
    rest.splice(0, 2);
  }
  if (rest.length !== 4) return null;
  return { cancelAfter, positional: rest };
}

function main(argv) {
  const args = parseArgs(argv);
  if (args === null) {
    process.stderr.write(USAGE);
    process.exitCode = 2;
    return;
  }
  const [address, name, inputJson, conversationId] = args.positional;
  const client = dispatcherClient(address);
  const request = toolCallRequest(name, inputJson, conversationId);
  const call = client.DispatchToolCallStream(request, callOptions());
  let received = 0;
  call.on('data', (message) => {
    if (args.cancelAfter !== null && received >= args.cancelAfter) return; // cancelled already
    // oneofs: true names the set member of the `event` oneof.
    const kind = message.event;
    process.stdout.write(`${JSON.stringify({ event: kind, [kind]: message[kind] })}\n`);
    received += 1;
    if (args.cancelAfter !== null && received === args.cancelAfter) call.cancel();
  });
  call.on('error', (err) => {
    client.close();
    printError(err);
  });
  call.on('end', () => client.close());
}

run(main);
