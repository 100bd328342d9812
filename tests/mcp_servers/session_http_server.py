"""A hand-written MCP server over streamable HTTP with sessions (protocol 2025-06-18), so tests
control how it forgets them: a server that restarted, or expired a session, must answer a
request carrying the old `Mcp-Session-Id` with 404 (the spec), and servers on older SDKs answer
400 with a JSON-RPC error about the session instead. Run:
python -m tests.mcp_servers.session_http_server [--forget-status 404|400] [--token T]
[--get-status 404|405] [--echo-description TEXT] PORT

Tools: `echo` answers "<text> #<n>" (n counts the calls this server process ran, so a test sees
whether a call ran once), `forget` forgets every session once it has answered, and `revoke`
makes every later request fail authentication; `hang_up` counts as a call, then ends its
SSE response stream without an answer (a server that died mid-call, a proxy that cut it).
With --token, a request without `Authorization: Bearer T` is answered 401 with an OAuth-style
JSON body (as after `revoke`).
"""

from __future__ import annotations

import argparse
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROTOCOL = "2025-06-18"
TOOLS = [
    {
        "name": "echo",
        "description": "Echo a text, numbered.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    {
        "name": "forget",
        "description": "Forget every session (as a restart would).",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "revoke",
        "description": "Refuse every later request's credentials.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "hang_up",
        "description": "Count a call, then end the response stream unanswered.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


class State:
    def __init__(self, forget_status: int, token: str, get_status: int = 405) -> None:
        self.forget_status = forget_status
        self.get_status = get_status
        self.token = token
        self.revoked = False
        self.sessions: set[str] = set()
        self.calls = 0
        self.lock = threading.Lock()


def handler_for(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: dict[str, Any] | None, **headers: str) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            if body is not None:
                self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(data)

        def _unknown_session(self) -> None:
            if state.forget_status == 404:
                self._send(
                    404,
                    {"jsonrpc": "2.0", "error": {"code": -32001, "message": "Session not found"}},
                )
            else:  # the wording of server-everything's own HTTP transport, with no id
                self._send(
                    400,
                    {
                        "jsonrpc": "2.0",
                        "error": {
                            "code": -32000,
                            "message": "Bad Request: No valid session ID provided",
                        },
                    },
                )

        def do_GET(self) -> None:  # no server-initiated stream; some servers say 404
            if state.get_status == 404:
                self._send(404, {"jsonrpc": "2.0", "error": {"code": -32001, "message": "nope"}})
            else:
                self._send(405, None, allow="POST, DELETE")

        def do_DELETE(self) -> None:
            session = self.headers.get("mcp-session-id", "")
            with state.lock:
                known = session in state.sessions
                state.sessions.discard(session)
            if known:
                self._send(200, None)
            else:
                self._unknown_session()

        def _authorized(self) -> bool:
            sent = self.headers.get("authorization", "")
            if not state.revoked and (not state.token or sent == f"Bearer {state.token}"):
                return True
            body = {"error": "invalid_token", "error_description": "The access token expired"}
            self._send(401, body, www_authenticate='Bearer error="invalid_token"')
            return False

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            message = json.loads(self.rfile.read(length))
            if not self._authorized():
                return
            session = self.headers.get("mcp-session-id", "")
            method = message.get("method")
            if method == "initialize":
                new = uuid.uuid4().hex
                with state.lock:
                    state.sessions.add(new)
                result = {
                    "protocolVersion": PROTOCOL,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "session-http", "version": "1.0"},
                }
                self._send(
                    200,
                    {"jsonrpc": "2.0", "id": message["id"], "result": result},
                    mcp_session_id=new,
                )
                return
            with state.lock:
                known = session in state.sessions
            if not known:
                self._unknown_session()
                return
            if "id" not in message:  # a notification
                self._send(202, None)
                return
            if method == "tools/list":
                self._answer(message, result={"tools": TOOLS})
            elif method == "tools/call":
                self._call(message)
            elif method == "ping":
                self._answer(message, result={})
            else:
                self._answer(message, error={"code": -32601, "message": f"no method {method}"})

        def _answer(self, message: dict[str, Any], **outcome: Any) -> None:
            """A JSON-RPC answer to `message`: result=… or error=…."""
            self._send(200, {"jsonrpc": "2.0", "id": message["id"], **outcome})

        def _call(self, message: dict[str, Any]) -> None:
            params = message.get("params") or {}
            name = params.get("name")
            if name == "echo":
                with state.lock:
                    state.calls += 1
                    n = state.calls
                text = f"{(params.get('arguments') or {}).get('text', '')} #{n}"
            elif name == "revoke":
                state.revoked, text = True, "revoked"
            elif name == "forget":
                text = "forgotten"
            elif name == "hang_up":
                with state.lock:
                    state.calls += 1
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(b": working\n\n")
                self.wfile.flush()
                self.close_connection = True
                return
            else:
                self._answer(message, error={"code": -32602, "message": f"unknown tool {name}"})
                return
            content = [{"type": "text", "text": text}]
            self._answer(message, result={"content": content, "isError": False})
            if name == "forget":  # once it has answered
                with state.lock:
                    state.sessions.clear()

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--forget-status", type=int, choices=(404, 400), default=404)
    parser.add_argument("--token", default="")
    parser.add_argument("--get-status", type=int, choices=(404, 405), default=405)
    parser.add_argument("--echo-description", default="", help="a changed definition of echo")
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    state = State(args.forget_status, args.token, args.get_status)
    if args.echo_description:
        TOOLS[0] = {**TOOLS[0], "description": args.echo_description}
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_for(state))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
