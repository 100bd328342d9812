"""The in-language pre-check: parse the code (AST, never a grep) and refuse what a custom tool
has no business writing — imports, dunder attribute walks, frame introspection, the dynamic-code
builtins — with a message the model can act on. A courtesy for honest code, not security: the
operating-system layers (see services/sandbox/host.py and worker.py) are what contain hostile
code, and they are tested with this check bypassed."""

from __future__ import annotations

import ast
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from services.sandbox.worker import SAFE_BUILTIN_NAMES
from shared import convert

FORBIDDEN_NAMES = frozenset(
    {
        "__import__", "__builtins__", "__loader__", "__spec__", "eval", "exec", "compile",
        "open", "globals", "locals", "vars", "getattr", "setattr", "delattr", "breakpoint",
        "input", "help", "exit", "quit", "memoryview",
    }
)  # fmt: skip
# Dunder attributes benign code uses; every other `__x__` attribute is refused.
ALLOWED_DUNDERS = frozenset(
    {"__init__", "__name__", "__doc__", "__len__", "__str__", "__repr__", "__eq__", "__hash__"}
)
FRAME_ATTRIBUTES = frozenset(
    {
        "f_globals", "f_locals", "f_back", "f_builtins", "f_code", "gi_frame", "gi_code",
        "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next", "func_globals",
        "mro",
    }
)  # fmt: skip
NAMESPACE = ("df", "pd", "np", "inputs", "result", "call_tool")
MAX_CODE_BYTES = convert.MAX_CUSTOM_CODE_BYTES  # far more than a tool needs, less than a stall
# Verdicts kept, by the code's digest: a tool's executions after its first are not parsed again.
_VERDICTS_KEPT = 256
_verdicts: OrderedDict[bytes, Problem | None] = OrderedDict()


@dataclass(frozen=True)
class Problem:
    """Why the code is refused; `syntax` problems are schema hints, others rejections."""

    message: str
    line: int
    column: int
    syntax: bool = False


def check(code: str) -> Problem | None:
    """None when the code may run; otherwise the first problem, with its position."""
    data = code.encode("utf-8", "surrogatepass")
    if len(data) > MAX_CODE_BYTES:
        return Problem(
            f"the code is {len(data)} bytes, over the {MAX_CODE_BYTES}-byte limit of a custom "
            "tool (keep data out of the code: pass it in the inputs or as df)",
            1,
            0,
        )
    key = hashlib.blake2b(data, digest_size=16).digest()
    if key in _verdicts:
        _verdicts.move_to_end(key)
        return _verdicts[key]
    verdict = _check(code)
    _verdicts[key] = verdict
    if len(_verdicts) > _VERDICTS_KEPT:
        _verdicts.popitem(last=False)
    return verdict


def _check(code: str) -> Problem | None:
    if not code.strip():
        return Problem("the tool has no code", 1, 0, syntax=True)
    try:
        tree = ast.parse(code, "<tool>", "exec")
    except SyntaxError as exc:
        line, col = exc.lineno or 1, exc.offset or 0
        return Problem(f"syntax error at line {line}, column {col}: {exc.msg}", line, col, True)
    except ValueError as exc:  # e.g. null bytes in the source
        return Problem(f"the code cannot be parsed: {exc}", 1, 0, syntax=True)
    except (RecursionError, MemoryError):  # e.g. `x = 1+1+…` with a hundred thousand terms
        return Problem(
            "the code is nested too deeply to parse (split long expressions into statements)",
            1,
            0,
            syntax=True,
        )
    for node in ast.walk(tree):
        problem = _node_problem(node)
        if problem is not None:
            return problem
    return None


def _at(node: ast.AST, message: str) -> Problem:
    line, col = getattr(node, "lineno", 1), getattr(node, "col_offset", 0)
    return Problem(f"line {line}: {message}", line, col)


def _node_problem(node: ast.AST) -> Problem | None:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return _at(
            node,
            "imports are not available in custom tools; pd (pandas), np (numpy), df, inputs "
            "and call_tool are already defined",
        )
    if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
        return _at(node, f"{node.id!r} is not available in custom tools")
    if isinstance(node, ast.Attribute):
        attr = node.attr
        if attr.startswith("__") and attr.endswith("__") and attr not in ALLOWED_DUNDERS:
            return _at(node, f"the attribute {attr!r} is not available in custom tools")
        if attr in FRAME_ATTRIBUTES:
            return _at(node, f"frame and code introspection ({attr!r}) is not available")
    if isinstance(node, ast.Global | ast.Nonlocal) and "__builtins__" in node.names:
        return _at(node, "'__builtins__' is not available in custom tools")
    return None


def builtins_summary() -> str:
    """The builtins a custom tool has, for prompts and docs."""
    return ", ".join(n for n in SAFE_BUILTIN_NAMES if not n.startswith("_"))
