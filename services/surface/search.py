"""The tool search index: BM25 over a tool's name, description and input-schema field names,
fused with the cosine similarity of sentence embeddings (services.surface.embedding). Without an
embedder (or for a tool without a vector) the lexical score alone ranks.

Fusion is a weighted sum of min-max normalised scores: the lexical score keeps exact names and
rare words decisive, the embedding carries paraphrases that share few words with the
description ("post a note in the team chat" -> slack_send_message)."""

from __future__ import annotations

import math
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from services.surface.embedding import Embedder

# Tuned on tests/data/surface_eval (see the README's evaluation table).
EMBEDDING_WEIGHT = 0.8
BM25_K1 = 1.2
BM25_B = 0.75
NAME_REPEAT = 3  # the name's words count this many times in the lexical document
QUERY_CACHE_SIZE = 256
MASK_CACHE_SIZE = 64

_SPLIT = re.compile(r"[^a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "please",
        "should",
        "so",
        "some",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "this",
        "to",
        "use",
        "was",
        "we",
        "what",
        "when",
        "which",
        "who",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)


def _stem(word: str) -> str:
    """A light suffix stemmer: enough to meet 'invoices'/'invoice', 'sending'/'send'."""
    for suffix, keep in (
        ("ies", "y"),
        ("sses", "ss"),
        ("ing", ""),
        ("ed", ""),
        ("es", ""),
        ("s", ""),
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            stem = word[: -len(suffix)] + keep
            if suffix == "es" and not stem.endswith(("ch", "sh", "x", "z", "ss")):
                stem = word[:-1]
            return stem
    return word


def terms(text: str) -> list[str]:
    """Lexical terms of a text: camelCase and snake_case split, lowercased, stop words out,
    lightly stemmed."""
    spaced = _CAMEL.sub(" ", text).lower()
    return [_stem(w) for w in _SPLIT.split(spaced) if w and w not in STOPWORDS]


def schema_field_names(schema: Mapping[str, Any] | None, limit: int = 64) -> list[str]:
    """Property names of a JSON Schema, nested objects and array items included."""
    out: list[str] = []
    stack: list[Any] = [schema or {}]
    while stack and len(out) < limit:
        node = stack.pop()
        if not isinstance(node, Mapping):
            continue
        props = node.get("properties")
        if isinstance(props, Mapping):
            for key, sub in props.items():
                if key != "reasoning":
                    out.append(str(key))
                stack.append(sub)
        items = node.get("items")
        if isinstance(items, Mapping):
            stack.append(items)
    return out[:limit]


def embedding_text(name: str, description: str) -> str:
    """What a tool's embedding is computed from: its name as words, then its description. The
    registry clears the stored embedding when the description changes."""
    return f"{name.replace('_', ' ').replace('-', ' ')}: {description}"


@dataclass(frozen=True)
class IndexedTool:
    """One tool as the index sees it."""

    name: str
    description: str
    fields: tuple[str, ...] = ()
    vector: npt.NDArray[np.float32] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Match:
    """A ranked tool."""

    name: str
    score: float
    description: str


class SearchIndex:
    """An immutable index over a set of tools; build a new one when the catalog changes."""

    def __init__(
        self,
        tools: Sequence[IndexedTool],
        embedder: Embedder | None = None,
        *,
        embedding_weight: float = EMBEDDING_WEIGHT,
    ) -> None:
        self.tools = list(tools)
        self.position = {t.name: i for i, t in enumerate(self.tools)}
        self._embedder = embedder
        self.embedding_weight = embedding_weight
        self._build_lexical()
        self._vectors: npt.NDArray[np.float32] | None = None
        self._has_vector = np.zeros(len(self.tools), dtype=bool)
        if embedder is not None and self.tools:
            matrix = np.zeros((len(self.tools), embedder.dim), dtype=np.float32)
            for i, t in enumerate(self.tools):
                if t.vector is not None and t.vector.shape == (embedder.dim,):
                    matrix[i] = t.vector
                    self._has_vector[i] = True
            self._vectors = matrix
        self._hybrid = self._vectors is not None and bool(self._has_vector.any())
        self._all = np.ones(len(self.tools), dtype=bool)
        self._all.flags.writeable = False
        # search() runs on worker threads: the caches below change under this lock.
        self._cache_lock = threading.Lock()
        self._masks: dict[frozenset[str], npt.NDArray[np.bool_]] = {}
        self._query_cache: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()

    @property
    def hybrid(self) -> bool:
        """Whether embeddings take part in ranking."""
        return self._hybrid

    def _build_lexical(self) -> None:
        """Per term, the tools that contain it and their whole BM25 contribution: with k1, b
        and the document lengths fixed for the index, a query's score is a sum of these."""
        postings: dict[str, list[tuple[int, int]]] = {}
        lengths = []
        for i, t in enumerate(self.tools):
            doc = terms(t.name) * NAME_REPEAT + terms(t.description)
            for f in t.fields:
                doc += terms(f)
            lengths.append(len(doc))
            for term, tf in Counter(doc).items():
                postings.setdefault(term, []).append((i, tf))
        n = len(self.tools)
        length = np.array(lengths, dtype=np.float64)
        avg_len = float(length.mean()) if lengths else 0.0
        norm = BM25_K1 * (1 - BM25_B + BM25_B * length / max(avg_len, 1e-9))
        self._postings: dict[str, tuple[npt.NDArray[np.intp], npt.NDArray[np.float32]]] = {}
        for term, p in postings.items():
            idf = math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5))
            rows = np.array([i for i, _ in p], dtype=np.intp)
            freq = np.array([f for _, f in p], dtype=np.float64)
            weights = idf * freq * (BM25_K1 + 1) / (freq + norm[rows])
            self._postings[term] = (rows, weights.astype(np.float32))

    def bm25(self, query: str) -> npt.NDArray[np.float32]:
        scores = np.zeros(len(self.tools), dtype=np.float32)
        for term in dict.fromkeys(terms(query)):
            posting = self._postings.get(term)
            if posting is not None:
                rows, weights = posting
                scores[rows] += weights  # a tool appears once per posting list
        return scores

    def _mask(self, allowed: Collection[str] | None) -> npt.NDArray[np.bool_]:
        """The tools among `allowed` as a boolean mask; cached per allowed set (the core hands
        over the same frozenset per caller kind and catalog snapshot)."""
        if allowed is None:
            return self._all
        key = allowed if isinstance(allowed, frozenset) else frozenset(allowed)
        mask = self._masks.get(key)
        if mask is None:
            mask = np.zeros(len(self.tools), dtype=bool)
            mask[[self.position[name] for name in key if name in self.position]] = True
            mask.flags.writeable = False
            with self._cache_lock:
                if len(self._masks) >= MASK_CACHE_SIZE:
                    self._masks.clear()
                self._masks[key] = mask
        return mask

    def _query_vector(self, query: str) -> npt.NDArray[np.float32]:
        assert self._embedder is not None
        with self._cache_lock:
            cached = self._query_cache.get(query)
            if cached is not None:
                self._query_cache.move_to_end(query)
                return cached
        vec = self._embedder.embed([query])[0]
        with self._cache_lock:
            self._query_cache[query] = vec
            if len(self._query_cache) > QUERY_CACHE_SIZE:
                self._query_cache.popitem(last=False)
        return vec

    def _meaningful(self, query: str) -> bool:
        """Whether the query holds a content word the embedder can read: a word its vocabulary
        holds whole, stop words aside (an embedder that cannot tell: any lexical term)."""
        known = getattr(self._embedder, "known_words", None)
        if not callable(known):
            return bool(terms(query))
        return any(w not in STOPWORDS for w in known(query))

    def search(
        self,
        query: str,
        limit: int,
        allowed: Collection[str] | None = None,
        *,
        lexical_only: bool = False,
    ) -> list[Match]:
        """The `limit` best tools for `query`, among `allowed` names when given. A tool with no
        lexical or semantic relation to the query is never returned."""
        if not self.tools or limit <= 0:
            return []
        mask = self._mask(allowed)
        lexical = self.bm25(query)
        relevant = lexical > 0
        if self.hybrid and not lexical_only and not relevant.any() and not self._meaningful(query):
            # No word of the query occurs in any tool and the model knows none of them either
            # ("???", "the a of", "asdfghjkl", emoji): its embedding is noise, and ranking by
            # it would page in arbitrary tools.
            return []
        if self.hybrid and not lexical_only:
            assert self._vectors is not None
            semantic = self._vectors @ self._query_vector(query)
            semantic = np.where(self._has_vector, semantic, 0.0).astype(np.float32)
            lexical_part = _minmax(lexical, mask)
            hybrid = (
                self.embedding_weight * _minmax(semantic, mask)
                + (1 - self.embedding_weight) * lexical_part
            )
            # A tool not embedded yet is ranked by its lexical score alone.
            fused = np.where(self._has_vector, hybrid, lexical_part)
            relevant |= semantic > 0.1
        else:
            fused = _minmax(lexical, mask)
        candidates = np.flatnonzero(mask & relevant)
        if candidates.size == 0:
            return []
        best = candidates[np.argsort(-fused[candidates], kind="stable")][:limit]
        return [
            Match(self.tools[i].name, round(float(fused[i]), 4), self.tools[i].description)
            for i in best
        ]


def _minmax(values: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_]) -> npt.NDArray[Any]:
    if not mask.any():
        return values
    lo, hi = float(values[mask].min()), float(values[mask].max())
    if hi - lo < 1e-9:
        return np.where(values > 0, 1.0, 0.0)
    return (values - lo) / (hi - lo)


def build_index(
    tools: Iterable[IndexedTool], embedder: Embedder | None, **kwargs: Any
) -> SearchIndex:
    """An index over `tools`, embedding those that arrive without a vector."""
    tools = list(tools)
    if embedder is not None:
        missing = [i for i, t in enumerate(tools) if t.vector is None]
        if missing:
            vectors = embedder.embed(
                [embedding_text(tools[i].name, tools[i].description) for i in missing]
            )
            for row, i in enumerate(missing):
                t = tools[i]
                tools[i] = IndexedTool(t.name, t.description, t.fields, vectors[row])
    return SearchIndex(tools, embedder, **kwargs)
