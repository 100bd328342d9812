#!/usr/bin/env bash
# `make traces`: a local trace UI (Arize Phoenix, from PyPI, offline, on loopback) and the mesh
# exporting its spans to it. Phoenix lives in its own virtualenv (.venv-phoenix): it pins many
# packages of its own and must not change the mesh's. Ctrl-C stops both.
set -euo pipefail

PHOENIX_VENV=${PHOENIX_VENV:-.venv-phoenix}
PHOENIX_PORT=${PHOENIX_PORT:-6006}
PHOENIX_GRPC_PORT=${PHOENIX_GRPC_PORT:-4319}
DATA_DIR=${TOOLMESH_DATA_DIR:-.toolmesh}

if [[ ! -x "$PHOENIX_VENV/bin/phoenix" ]]; then
  echo "installing arize-phoenix into $PHOENIX_VENV (once)..."
  python3 -m venv "$PHOENIX_VENV"
  "$PHOENIX_VENV/bin/pip" install --quiet --upgrade pip
  "$PHOENIX_VENV/bin/pip" install --quiet arize-phoenix
fi

mkdir -p "$DATA_DIR/phoenix"
PHOENIX_TELEMETRY_ENABLED=false \
PHOENIX_WORKING_DIR="$DATA_DIR/phoenix" \
PHOENIX_HOST=127.0.0.1 \
PHOENIX_PORT="$PHOENIX_PORT" \
PHOENIX_GRPC_PORT="$PHOENIX_GRPC_PORT" \
  "$PHOENIX_VENV/bin/phoenix" serve >"$DATA_DIR/phoenix.log" 2>&1 &
phoenix_pid=$!
trap 'kill "$phoenix_pid" 2>/dev/null || true; wait "$phoenix_pid" 2>/dev/null || true' EXIT

for _ in $(seq 1 120); do
  if curl -fs -o /dev/null "http://127.0.0.1:$PHOENIX_PORT/"; then break; fi
  if ! kill -0 "$phoenix_pid" 2>/dev/null; then
    echo "phoenix exited; see $DATA_DIR/phoenix.log" >&2
    exit 1
  fi
  sleep 1
done
echo "trace UI: http://127.0.0.1:$PHOENIX_PORT  (OTLP/gRPC on 127.0.0.1:$PHOENIX_GRPC_PORT)"

OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$PHOENIX_GRPC_PORT" .venv/bin/toolmesh up
