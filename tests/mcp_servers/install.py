"""Installing the third-party MCP servers the tests use: `@modelcontextprotocol/server-everything`
with `npm ci` from the committed lock file into tests/mcp_servers/node/ (idempotent, quiet,
non-interactive, serialised across concurrent runs). `mcp-server-time` comes from PyPI with the
dev dependencies."""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NODE_DIR = Path(__file__).parent / "node"
PACKAGE = "@modelcontextprotocol/server-everything"
NPM_TIMEOUT_S = 300


class NotInstallable(RuntimeError):
    """node / npm are not on PATH."""


def _installed_version() -> str | None:
    manifest = NODE_DIR / "node_modules" / PACKAGE / "package.json"
    if not manifest.is_file():
        return None
    return str(json.loads(manifest.read_text()).get("version"))


def _pinned_version() -> str:
    return str(json.loads((NODE_DIR / "package.json").read_text())["dependencies"][PACKAGE])


def server_everything() -> list[str]:
    """The command line (without the transport argument) of server-everything, installed if
    missing or not the pinned version."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise NotInstallable("node and npm must be on PATH for the server-everything tests")
    key = hashlib.sha256(str(NODE_DIR.resolve()).encode()).hexdigest()[:16]
    lock_path = Path(tempfile.gettempdir()) / f"toolmesh-mcp-servers-{key}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed_version() != _pinned_version():
            command = [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--silent"]
            done = subprocess.run(
                command,
                cwd=NODE_DIR,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=NPM_TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    entry = NODE_DIR / "node_modules" / PACKAGE / "dist" / "index.js"
    return [node, str(entry)]


def mcp_server_time() -> str:
    """The `mcp-server-time` console script next to this interpreter."""
    path = Path(sys.executable).parent / "mcp-server-time"
    if not path.exists():
        raise NotInstallable("mcp-server-time is not installed: pip install -e '.[dev]'")
    return str(path)


if __name__ == "__main__":
    print(" ".join(server_everything()))
