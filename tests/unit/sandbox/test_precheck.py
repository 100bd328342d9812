"""The in-language pre-check parses code; it refuses what a custom tool has no business writing
with a message naming the line, and lets benign code through."""

from __future__ import annotations

import pytest

from services.sandbox import precheck
from services.sandbox.core import LimitCaps


@pytest.mark.parametrize(
    "code",
    [
        "result = 'please import this'",  # the word in a string is fine
        "s = '__import__'\nresult = len(s)",
        "class Point:\n    def __init__(self, x):\n        self.x = x\nresult = Point(2).x",
        "result = np.array([1, 2, 3]).std()",
        "result = df.groupby('a').sum() if df is not None else None",
        "result = {'message': ', '.join(sorted(inputs.get('names', [])))}",
        "def f(x):\n    return x * 2\nresult = [f(i) for i in range(3)]",
    ],
)
def test_benign_code_passes(code: str) -> None:
    assert precheck.check(code) is None


@pytest.mark.parametrize(
    ("code", "line", "needle"),
    [
        ("import os", 1, "imports are not available"),
        ("x = 1\nfrom subprocess import run", 2, "imports are not available"),
        ("result = ().__class__.__base__", 1, "the attribute"),
        ("result = eval('1')", 1, "'eval'"),
        ("f = open", 1, "'open'"),
        ("result = __builtins__", 1, "'__builtins__'"),
        ("def g():\n    yield 1\nresult = g().gi_frame", 3, "gi_frame"),
        ("result = getattr(inputs, 'x')", 1, "'getattr'"),
    ],
)
def test_refusals_name_the_line_and_the_problem(code: str, line: int, needle: str) -> None:
    problem = precheck.check(code)
    assert problem is not None and not problem.syntax
    assert problem.line == line
    assert needle in problem.message


def test_a_syntax_error_is_a_syntax_problem_with_line_and_column() -> None:
    problem = precheck.check("x = 1\ny = (2,\n")
    assert problem is not None and problem.syntax
    assert problem.line == 2
    assert "line 2" in problem.message and "column" in problem.message


def test_code_nested_past_the_parsers_recursion_is_a_syntax_problem() -> None:
    problem = precheck.check("x = " + "1+" * 100_000 + "1")  # RecursionError in ast.parse
    assert problem is not None and problem.syntax
    assert "nested too deeply" in problem.message


def test_empty_code_is_refused() -> None:
    problem = precheck.check("   \n")
    assert problem is not None and problem.syntax


def test_limits_take_defaults_for_zero_and_are_capped() -> None:
    caps = LimitCaps(wall_seconds=30, cpu_seconds=10, memory_bytes=100, output_bytes=50)
    limits = caps.resolve(wall_seconds=0, cpu_seconds=99, memory_bytes=10, output_bytes=0)
    assert limits.wall_seconds == 30
    assert limits.cpu_seconds == 10
    assert limits.memory_bytes == 10
    assert limits.output_bytes == 50
