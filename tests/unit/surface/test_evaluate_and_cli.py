"""The offline evaluation (`toolmesh surface eval`), the lexical fallback when the model package
is absent, and search_tools when no surface service is configured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.registry.context import ToolContext
from services.registry.tools.surface import search_tools
from services.surface import embedding
from services.surface.evaluate import evaluate
from shared.cli.main import main as toolmesh
from shared.config import Settings
from shared.contract import Err
from shared.errors import InvalidArgument

CATALOG = [
    {
        "name": "send_sms",
        "description": "Send an SMS text message to a phone number.",
        "input_schema": {"properties": {"to": {}}},
    },
    {"name": "weather_now", "description": "Current weather for a city.", "input_schema": {}},
    {"name": "refund", "description": "Refund a card payment.", "input_schema": {}},
]
QUERIES = [
    {"query": "ping my buddy on his cellphone", "expected": ["send_sms"]},
    {"query": "weather in paris", "expected": ["weather_now"]},
    {"query": "card payment refund", "expected": ["refund"]},
]


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    catalog, queries = tmp_path / "catalog.json", tmp_path / "queries.json"
    catalog.write_text(json.dumps(CATALOG))
    queries.write_text(json.dumps(QUERIES))
    return catalog, queries


def test_evaluation_scores_lexical_and_hybrid(files: tuple[Path, Path]) -> None:
    result = evaluate(*files, embedding.load_embedder())
    assert result.lexical.queries == 3
    # "ping my buddy on his cellphone" shares no word with the SMS tool.
    assert result.lexical.recall_at_1 == pytest.approx(2 / 3)
    assert result.hybrid is not None and result.hybrid.recall_at_1 == 1.0
    assert result.hybrid.mrr == 1.0


def test_evaluation_without_a_model_is_lexical_only(files: tuple[Path, Path]) -> None:
    result = evaluate(*files, None)
    assert result.hybrid is None and result.lexical.recall_at_5 == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("catalog", "queries", "message"),
    [
        ("[1]", json.dumps(QUERIES), "needs a string 'name'"),
        (json.dumps(CATALOG), '[{"query": "x", "expected": ["nope"]}]', "not in the catalog"),
        (json.dumps(CATALOG), "{}", "must be a JSON list"),
        ("not json", json.dumps(QUERIES), "not valid JSON"),
    ],
)
def test_bad_evaluation_files_are_clear_errors(
    tmp_path: Path, catalog: str, queries: str, message: str
) -> None:
    (tmp_path / "c.json").write_text(catalog)
    (tmp_path / "q.json").write_text(queries)
    with pytest.raises(InvalidArgument) as info:
        evaluate(tmp_path / "c.json", tmp_path / "q.json", None)
    assert message in info.value.message


def test_eval_command_prints_both_rankings(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = toolmesh(["surface", "eval", "--catalog", str(files[0]), "--queries", str(files[1])])
    out = capsys.readouterr().out
    assert code == 0 and "bm25" in out and "hybrid" in out and "recall@5" in out
    assert toolmesh(["surface", "eval", "--catalog", "/nonexistent", "--queries", "x"]) == 1


def test_missing_model_package_falls_back_to_lexical(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedding, "MODEL_PACKAGE", "no_such_model_package")
    monkeypatch.setattr(embedding, "_CACHED", {})
    assert embedding.bundled_model_dir() is None
    assert embedding.load_embedder() is None


async def test_search_tools_without_a_surface_service_is_an_err(tmp_path: Path) -> None:
    settings = Settings.from_env({"TOOLMESH_DATA_DIR": str(tmp_path), "TOOLMESH_SURFACE_ADDR": ""})
    context = ToolContext(tool_name="search_tools", tenant_id="t", settings=settings)
    result = await search_tools({"query": "send an sms"}, context)
    assert isinstance(result.envelope, Err)
    assert result.envelope.err_kind == "service_not_configured"
