#!/usr/bin/env node
// A Node client of the dispatcher built from the repo's .proto files alone (no generated code):
//
//   node dispatch.js ADDRESS TOOL_NAME INPUT_JSON CONVERSATION_ID
//
// Prints the DispatchToolCallResponse as one JSON line and exits 0. On a gRPC error it prints
// {"code": <numeric status>, "details": <status message>, "reason": <ErrorInfo reason or null>}
// and exits 3. Usage errors exit 2; anything else (protos not loadable, ...) exits 1.
//
// The ErrorInfo reason is decoded from the grpc-status-details-bin trailer (see mesh.js).
// stream.js streams a call (DispatchToolCallStream); datasets.js decodes a result's Arrow tables.
'use strict';

const { runUnary } = require('./mesh');

runUnary('dispatch.js', (response) => JSON.stringify(response));
