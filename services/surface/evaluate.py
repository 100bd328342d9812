"""Offline evaluation of tool search: index a catalog (a JSON list of {name, description,
input_schema}) into a throw-away index and score queries (a JSON list of {query, expected:
[names]}) by recall@1, recall@5 and MRR — lexical (BM25) alone and hybrid. Never touches the
live registry."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.surface.embedding import Embedder
from services.surface.search import IndexedTool, SearchIndex, build_index, schema_field_names
from shared.errors import InvalidArgument

RANK_DEPTH = 20


@dataclass(frozen=True)
class EvalQuery:
    query: str
    expected: tuple[str, ...]


@dataclass(frozen=True)
class Scores:
    """Recall@1, recall@5 and mean reciprocal rank (over the top RANK_DEPTH) of a run."""

    recall_at_1: float
    recall_at_5: float
    mrr: float
    queries: int

    def line(self, label: str) -> str:
        return (
            f"{label:<8} recall@1 {self.recall_at_1:.3f}  recall@5 {self.recall_at_5:.3f}  "
            f"MRR {self.mrr:.3f}  ({self.queries} queries)"
        )


def _load_json_list(path: Path, what: str) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidArgument(f"cannot read {what} {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{what} {path} is not valid JSON: {exc.msg}") from None
    if not isinstance(data, list):
        raise InvalidArgument(f"{what} {path} must be a JSON list")
    return data


def load_catalog(path: Path) -> list[IndexedTool]:
    tools: list[IndexedTool] = []
    seen: set[str] = set()
    for i, item in enumerate(_load_json_list(path, "catalog")):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidArgument(f"catalog entry {i} needs a string 'name'")
        name = item["name"]
        if name in seen:
            raise InvalidArgument(f"catalog entry {i}: tool {name!r} appears twice")
        seen.add(name)
        schema = item.get("input_schema") if isinstance(item.get("input_schema"), dict) else {}
        tools.append(
            IndexedTool(name, str(item.get("description") or ""), tuple(schema_field_names(schema)))
        )
    return tools


def load_queries(path: Path, known: set[str]) -> list[EvalQuery]:
    queries: list[EvalQuery] = []
    for i, item in enumerate(_load_json_list(path, "queries")):
        if not isinstance(item, dict) or not isinstance(item.get("query"), str):
            raise InvalidArgument(f"query entry {i} needs a string 'query'")
        expected = item.get("expected")
        if not isinstance(expected, list) or not expected:
            raise InvalidArgument(f"query entry {i} needs a non-empty 'expected' list")
        unknown = [n for n in expected if n not in known]
        if unknown:
            raise InvalidArgument(f"query entry {i} expects tools not in the catalog: {unknown}")
        queries.append(EvalQuery(item["query"], tuple(expected)))
    return queries


def score(index: SearchIndex, queries: Sequence[EvalQuery], *, lexical_only: bool) -> Scores:
    hits1 = hits5 = 0
    rr = 0.0
    for q in queries:
        ranked = [m.name for m in index.search(q.query, RANK_DEPTH, lexical_only=lexical_only)]
        rank = next((i + 1 for i, n in enumerate(ranked) if n in q.expected), 0)
        hits1 += rank == 1
        hits5 += 0 < rank <= 5
        rr += 1.0 / rank if rank else 0.0
    n = max(len(queries), 1)
    return Scores(hits1 / n, hits5 / n, rr / n, len(queries))


@dataclass(frozen=True)
class Evaluation:
    lexical: Scores
    hybrid: Scores | None


def evaluate(
    catalog_path: Path, queries_path: Path, embedder: Embedder | None, **index_kwargs: Any
) -> Evaluation:
    tools = load_catalog(catalog_path)
    queries = load_queries(queries_path, {t.name for t in tools})
    index = build_index(tools, embedder, **index_kwargs)
    lexical = score(index, queries, lexical_only=True)
    hybrid = score(index, queries, lexical_only=False) if index.hybrid else None
    return Evaluation(lexical, hybrid)
