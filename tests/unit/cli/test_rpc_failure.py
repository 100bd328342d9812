"""Every CLI command reports a failed RPC the same way: code, reason and message, the field
violations, and "is the mesh running?" only when the service could not be reached."""

from __future__ import annotations

import grpc
import pytest

from shared.cli import EXIT_RPC_ERROR
from shared.cli.render import rpc_failure
from shared.errors import InvalidArgument, ToolmeshError, Unavailable
from shared.rpc_errors import to_status_code, trailing_metadata


class Failed(grpc.RpcError):
    """A failed call as grpc raises it, built from the error a server would have answered."""

    def __init__(self, error: ToolmeshError | None, code: grpc.StatusCode, details: str) -> None:
        self._error, self._code, self._details = error, code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return tuple(trailing_metadata(self._error)) if self._error is not None else ()


def answered(error: ToolmeshError) -> Failed:
    return Failed(error, to_status_code(error), error.message)


def test_an_unreachable_service_gets_the_start_the_mesh_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    refused = Failed(None, grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    assert rpc_failure(refused, "surface", "127.0.0.1:1") == EXIT_RPC_ERROR
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: UNAVAILABLE (UNAVAILABLE): failed to connect to all addresses",
        "is the mesh running? (surface at 127.0.0.1:1; start it with `make up`)",
    ]


def test_an_answer_saying_something_else_is_down_is_not_blamed_on_the_mesh(
    capsys: pytest.CaptureFixture[str],
) -> None:
    down = answered(Unavailable("the database is unavailable", reason="DATABASE_UNAVAILABLE"))
    assert rpc_failure(down, "dispatcher", "127.0.0.1:50052") == EXIT_RPC_ERROR
    err = capsys.readouterr().err
    assert "DATABASE_UNAVAILABLE" in err and "is the mesh running" not in err


def test_field_violations_follow_the_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    bad = answered(
        InvalidArgument(
            "invalid rule", reason="INVALID_RULE", field_violations=[("tool", "is empty")]
        )
    )
    rpc_failure(bad, "dispatcher", "127.0.0.1:50052")
    assert capsys.readouterr().err.splitlines() == [
        "error: INVALID_ARGUMENT (INVALID_RULE): invalid rule",
        "  tool: is empty",
    ]
