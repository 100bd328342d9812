"""A hand-written MCP server speaking JSON-RPC over stdio, so tests control every byte: it can
crash, hang, start slowly, never answer initialize, change its inventory between starts and
answer with malformed content. Run: python -m tests.mcp_servers.raw_server [options].

Options:
  --never-init        read requests but never answer (a server that never completes initialize)
  --slow-start S      sleep S seconds before serving
  --inventory FILE    JSON list of extra tools ({"name", "description", "inputSchema"}), read at
                      start, each answering "<name> v<version>" where version is the tool's
                      "version" key (default 1); any other key ("title", "annotations", …) is
                      listed exactly as written, well-formed or not
  --marker-dir DIR    write `start-<pid>` at start, `hang-<request id>` when a hang begins and
                      `cancelled-<request id>` when it is cancelled, so tests can count starts
                      and observe cancellation
  --announce-changes  declare tools.listChanged and list a `reload` tool that reads the
                      inventory file again and sends `notifications/tools/list_changed`
                      (`times` of them, default 1) before it answers; with `slow_list` S, the
                      next tools/list answers only after S seconds, and with `params` the
                      notifications carry these params
  --change-after-first-list  after answering the first tools/list, add a tool `late` and send
                      `notifications/tools/list_changed` (a server whose tools change while the
                      bridge is still registering the first listing)

The `log` tool takes `logger` and `data` to send instead of its defaults. The `flood` tool sends
`count` progress notifications (default 10,000) as fast as it can, each message padded to
`pad` characters, then answers; with --marker-dir it writes `flood-<request id>` once the
answer is written, so a test knows the whole flood has left the server.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

TINY_PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d4944415478da63f8ffff3f0005fe02fea7d6a4f40000000049454e44ae426082"
    )
).decode()

BUILTIN_TOOLS: list[dict[str, Any]] = [
    {
        "name": "echo",
        "description": "Echo a message.",
        "inputSchema": {
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
    },
    {
        "name": "meta",
        "description": "Return the request's _meta as JSON text.",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "hang",
        "description": "Never answer (until cancelled).",
        "inputSchema": {"type": "object"},
    },
    {"name": "crash", "description": "Exit the process.", "inputSchema": {"type": "object"}},
    {
        "name": "log",
        "description": "Send `count` log messages (notifications/message) at `level`, then answer.",
        "inputSchema": {
            "type": "object",
            "properties": {"count": {"type": "integer"}, "level": {"type": "string"}},
        },
    },
    {
        "name": "malformed",
        "description": "Answer with content the protocol does not allow.",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "not_unicode",
        "description": "Answer with text holding an unpaired UTF-16 surrogate (a JSON escape).",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "bad_base64",
        "description": "Answer with an image whose data is not base64.",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "fail",
        "description": "Answer with isError.",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "huge",
        "description": "Answer with `mb` megabytes of text.",
        "inputSchema": {"type": "object", "properties": {"mb": {"type": "integer"}}},
    },
    {
        "name": "image",
        "description": "Answer with a tiny PNG and a text.",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "progress",
        "description": "Send three progress notifications (when asked for them), then answer.",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "flood",
        "description": "Send `count` progress notifications as fast as possible, then answer.",
        "inputSchema": {
            "type": "object",
            "properties": {"count": {"type": "integer"}, "pad": {"type": "integer"}},
        },
    },
    {
        "name": "a.very.long.tool.name.that.goes.on.and.on.past.the.sixty.four.character.limit",
        "description": "A tool whose name is over 64 characters.",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "bad_utf8",
        "description": "Answer with a byte that is not UTF-8 inside the result's text.",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "server_error",
        "description": "Answer with a JSON-RPC error of code `code` (default -32000).",
        "inputSchema": {"type": "object", "properties": {"code": {"type": "integer"}}},
    },
    {
        "name": "null_result",
        "description": 'Answer with "result": null.',
        "inputSchema": {"type": "object"},
    },
    {
        "name": "deep_result",
        "description": "Answer with a result nested 5000 levels deep.",
        "inputSchema": {"type": "object"},
    },
    {"name": "dup.name", "description": "Becomes dup_name.", "inputSchema": {"type": "object"}},
    {"name": "dup_name", "description": "Already dup_name.", "inputSchema": {"type": "object"}},
]

RELOAD_TOOL: dict[str, Any] = {
    "name": "reload",
    "description": "Read the inventory file again and announce the change.",
    "inputSchema": {
        "type": "object",
        "properties": {"times": {"type": "integer"}, "slow_list": {"type": "number"}},
    },
}

_out_lock = threading.Lock()
_cancelled: dict[Any, threading.Event] = {}


def send(message: dict[str, Any]) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def result(request_id: Any, value: dict[str, Any]) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": value})


def error(request_id: Any, code: int, message: str) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})


def text(value: str, is_error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}], "isError": is_error}


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.extra: list[dict[str, Any]] = []
        self.slow_list = 0.0
        self.listed = False
        if args.inventory:
            self.extra = json.loads(Path(args.inventory).read_text())
        self.marker = Path(args.marker_dir) if args.marker_dir else None
        if self.marker is not None:
            self.marker.mkdir(parents=True, exist_ok=True)
            (self.marker / f"start-{os.getpid()}").write_text("")

    def tools(self) -> list[dict[str, Any]]:
        extra = [{k: v for k, v in t.items() if k != "version"} for t in self.extra]
        reload = [RELOAD_TOOL] if self.args.announce_changes else []
        return BUILTIN_TOOLS + reload + extra

    def reload(self, request_id: Any, arguments: dict[str, Any]) -> None:
        self.extra = json.loads(Path(self.args.inventory).read_text())
        self.slow_list = float(arguments.get("slow_list", 0))
        notification: dict[str, Any] = {
            "jsonrpc": "2.0",
            "method": "notifications/tools/list_changed",
        }
        if "params" in arguments:
            notification["params"] = arguments["params"]
        for _ in range(int(arguments.get("times", 1))):
            send(notification)
        result(request_id, text(f"reloaded {len(self.extra)} tools"))

    def flood(self, request_id: Any, params: dict[str, Any]) -> None:
        arguments = params.get("arguments") or {}
        token = (params.get("_meta") or {}).get("progressToken")
        count = int(arguments.get("count", 10_000))
        pad = "x" * int(arguments.get("pad", 0))
        for step in range(1, count + 1) if token is not None else ():
            notification = {"progressToken": token, "progress": step, "total": count}
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": {**notification, "message": f"flood {step} {pad}"},
                }
            )
        result(request_id, text(f"flooded {count}" if token is not None else "no token"))
        if self.marker is not None:
            (self.marker / f"flood-{request_id}").write_text("")

    def call(self, request_id: Any, params: dict[str, Any]) -> None:
        name = params.get("name")
        arguments = params.get("arguments") or {}
        if name == "echo":
            result(request_id, text(f"Echo: {arguments.get('message', '')}"))
        elif name == "meta":
            result(request_id, text(json.dumps(params.get("_meta") or {})))
        elif name == "hang":
            if self.marker is not None:
                (self.marker / f"hang-{request_id}").write_text("")
            event = _cancelled.setdefault(request_id, threading.Event())
            event.wait(600)
            if self.marker is not None:
                (self.marker / f"cancelled-{request_id}").write_text("")
        elif name == "crash":
            os._exit(3)
        elif name == "log":
            level = arguments.get("level", "error")
            for i in range(int(arguments.get("count", 1))):
                params = {
                    "level": level,
                    "logger": arguments.get("logger", "widgets"),
                    "data": arguments.get("data", {"message": f"m{i}"}),
                }
                send({"jsonrpc": "2.0", "method": "notifications/message", "params": params})
            result(request_id, text("logged"))
        elif name == "reload" and self.args.announce_changes:
            self.reload(request_id, arguments)
        elif name == "malformed":
            result(request_id, {"content": [{"type": "image"}], "isError": "perhaps"})
        elif name == "not_unicode":
            # json.dumps escapes it as \udc80: valid JSON, but not Unicode text once decoded.
            result(request_id, text("before \udc80 after"))
        elif name == "bad_base64":
            data = {"type": "image", "data": "!!not base64!!", "mimeType": "image/png"}
            result(request_id, {"content": [data]})
        elif name == "huge":
            result(request_id, text("z" * (int(arguments.get("mb", 1)) * 1024 * 1024)))
        elif name == "bad_utf8":
            line = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": text("caf@")})
            with _out_lock:
                sys.stdout.buffer.write(line.encode().replace(b"caf@", b"caf\xe9") + b"\n")
                sys.stdout.buffer.flush()
        elif name == "null_result":
            send({"jsonrpc": "2.0", "id": request_id, "result": None})
        elif name == "deep_result":
            head = json.dumps({"jsonrpc": "2.0", "id": request_id})[:-1]
            with _out_lock:
                sys.stdout.write(head + ', "result": ' + "[" * 5000 + "]" * 5000 + "}\n")
                sys.stdout.flush()
        elif name == "server_error":
            error(request_id, int(arguments.get("code", -32000)), "the widget backend is down")
        elif name == "fail":
            result(request_id, text("the widget is broken", is_error=True))
        elif name == "image":
            png = {"type": "image", "data": TINY_PNG, "mimeType": "image/png"}
            result(request_id, {"content": [{"type": "text", "text": "a pixel"}, png]})
        elif name == "progress":
            token = (params.get("_meta") or {}).get("progressToken")
            for step in range(1, 4) if token is not None else ():
                notification = {"progressToken": token, "progress": step, "total": 3}
                send(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": {**notification, "message": f"step {step}"},
                    }
                )
            result(request_id, text("done" if token is not None else "done, no token"))
        elif name == "flood":
            self.flood(request_id, params)
        else:
            for tool in self.extra:
                if tool["name"] == name:
                    result(request_id, text(f"{name} v{tool.get('version', 1)}"))
                    return
            result(request_id, text(f"unknown tool {name}", is_error=True))

    def handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if request_id is None:  # a notification
            if method == "notifications/cancelled":
                event = _cancelled.setdefault(params.get("requestId"), threading.Event())
                event.set()
            return
        if method == "initialize":
            result(
                request_id,
                {
                    "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                    "capabilities": {
                        "tools": {
                            "listChanged": self.args.announce_changes
                            or self.args.change_after_first_list
                        }
                    },
                    "serverInfo": {"name": "raw-test-server", "version": "1.0"},
                },
            )
        elif method == "tools/list":
            if self.slow_list:
                delay, self.slow_list = self.slow_list, 0.0
                time.sleep(delay)
            result(request_id, {"tools": self.tools()})
            if self.args.change_after_first_list and not self.listed:
                late = {"name": "late", "description": "Added after the first listing."}
                self.extra.append({**late, "inputSchema": {"type": "object"}})
                send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            self.listed = True
        elif method == "tools/call":
            threading.Thread(target=self.call, args=(request_id, params), daemon=True).start()
        elif method == "ping":
            result(request_id, {})
        else:
            error(request_id, -32601, f"method not found: {method}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--never-init", action="store_true")
    parser.add_argument("--slow-start", type=float, default=0.0)
    parser.add_argument("--inventory", default="")
    parser.add_argument("--marker-dir", default="")
    parser.add_argument("--announce-changes", action="store_true")
    parser.add_argument("--change-after-first-list", action="store_true")
    args = parser.parse_args()
    if args.slow_start:
        time.sleep(args.slow_start)
    server = Server(args)
    for line in sys.stdin:
        if args.never_init or not line.strip():
            continue
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        server.handle(message)


if __name__ == "__main__":
    main()
