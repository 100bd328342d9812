"""LLM access and cost accounting without the mesh: model configs in the database, the client
against a loopback fake Messages API, cost arithmetic, budgets and the usage statistics."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.registry.context import ToolContext
from shared.cli.stats import parse_since
from shared.config import Settings
from shared.contract import Err
from shared.contract.result import exception_to_envelope
from shared.costs import BudgetExceeded, CostAccount
from shared.db.engine import make_engine, session_factory
from shared.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from shared.llm.client import LlmClientCache, Usage, cost_usd, create_llm_client_for_role
from shared.llm.config import (
    DEFAULT_MODEL_CONFIGS,
    ModelConfig,
    ModelConfigStore,
    get_model_for_role,
    pick_for_role,
)
from shared.telemetry.stats import stats_frame, usage_stats
from shared.telemetry.usage import SqlUsageLog, UsageEntry
from tests.support.fake_anthropic import FakeAnthropic, Reply, overloaded

SONNET = DEFAULT_MODEL_CONFIGS[0]


@pytest.fixture
def fake() -> FakeAnthropic:
    server = FakeAnthropic().start()
    yield server  # type: ignore[misc]
    server.stop()


@pytest.fixture
def sessions(database_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(database_url)
    yield session_factory(engine)
    engine.dispose()


def env_for(fake: FakeAnthropic) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": fake.base_url}


def test_cost_is_usage_times_the_configs_prices_per_million() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=2_000, cache_read_tokens=10_000)
    assert cost_usd(usage, SONNET) == pytest.approx(3.0 + 0.03 + 0.003)
    assert cost_usd(Usage(), SONNET) == 0


def test_a_role_falls_back_to_default_and_fails_clearly_without_one() -> None:
    assert get_model_for_role("tool_auditor").model == "claude-haiku-4-5"
    assert get_model_for_role("some_new_role").model == SONNET.model  # serves "default"
    lonely = [ModelConfig(model="m", provider="anthropic", max_output_tokens=5, roles=("x",))]
    with pytest.raises(NotFound, match="no model config serves role 'y'"):
        pick_for_role(lonely, "y")


def test_replicas_seeding_at_once_all_start_and_seed_the_defaults_once(database_url: str) -> None:
    """Surface replicas started together seed the same empty table at the same moment."""
    engines = [make_engine(database_url) for _ in range(6)]
    stores = [ModelConfigStore(session_factory(e)) for e in engines]
    barrier = threading.Barrier(len(stores))

    def seed(store: ModelConfigStore) -> int:
        barrier.wait()
        return store.seed_defaults()

    try:
        with ThreadPoolExecutor(len(stores)) as pool:
            inserted = list(pool.map(seed, stores))
        assert sum(inserted) == len(DEFAULT_MODEL_CONFIGS)
        assert sorted(inserted)[:-1] == [0] * (len(stores) - 1)
        assert len(stores[0].list()) == len(DEFAULT_MODEL_CONFIGS)
    finally:
        for e in engines:
            e.dispose()


def test_model_configs_are_stored_seeded_once_and_validated(sessions) -> None:  # type: ignore[no-untyped-def]
    store = ModelConfigStore(sessions)
    assert store.seed_defaults() == len(DEFAULT_MODEL_CONFIGS)
    assert store.seed_defaults() == 0
    cheap = ModelConfig(
        model="claude-haiku-4-5",
        provider="anthropic",
        max_output_tokens=1024,
        roles=("call_llm",),
        input_price_per_mtok=0.5,
    )
    store.upsert(cheap)
    assert store.get("claude-haiku-4-5") == cheap
    assert store.for_role("call_llm") == cheap  # listed by model name: haiku before sonnet
    with pytest.raises(InvalidArgument) as caught:
        store.upsert(ModelConfig(model=" ", provider="cohere", max_output_tokens=0))
    assert {f for f, _ in caught.value.field_violations} == {
        "model",
        "provider",
        "max_output_tokens",
    }
    with pytest.raises(NotFound):
        store.get("nope")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"input_price_per_mtok": float("nan")}, "input_price_per_mtok"),  # was INTERNAL
        ({"output_price_per_mtok": float("inf")}, "output_price_per_mtok"),  # was stored
        ({"model": "m" * 129}, "model"),
        ({"model": "claude\x00"}, "model"),
        ({"roles": ("call_llm", "")}, "roles"),
        ({"capabilities": frozenset({"web\nsearch"})}, "capabilities"),
        ({"capabilities": frozenset(f"c{i}" for i in range(65))}, "capabilities"),
    ],
)
def test_a_model_config_with_an_unusable_value_is_refused_naming_the_field(
    changes: dict[str, object], field: str
) -> None:
    fields: dict[str, object] = {"model": "m", "provider": "anthropic", "max_output_tokens": 5}
    fields.update(changes)
    with pytest.raises(InvalidArgument) as caught:
        ModelConfig(**fields).validate()  # type: ignore[arg-type]
    assert [f for f, _ in caught.value.field_violations] == [field]


def test_no_credentials_is_a_failed_precondition_naming_the_variable() -> None:
    with pytest.raises(FailedPrecondition, match="ANTHROPIC_API_KEY"):
        create_llm_client_for_role("call_llm", env={})


async def test_the_client_calls_the_api_with_the_roles_model_and_token_ceiling(
    fake: FakeAnthropic,
) -> None:
    fake.script(Reply(text="hi", input_tokens=40, output_tokens=2, cache_read_tokens=100))
    client = create_llm_client_for_role("call_llm", env=env_for(fake))
    try:
        reply = await client.complete(
            [{"role": "user", "content": "q"}], system="sys", max_output_tokens=10**9
        )
    finally:
        await client.aclose()
    body = fake.requests[-1].body
    assert body["model"] == SONNET.model
    assert body["max_tokens"] == SONNET.max_output_tokens  # capped by the config
    assert body["system"] == "sys"
    assert reply.text == "hi" and reply.usage == Usage(40, 2, 100, 0)
    assert reply.cost_usd == pytest.approx(cost_usd(Usage(40, 2, 100, 0), SONNET))
    sent = fake.requests[-1].headers
    assert "k" in (sent.get("x-api-key") or sent.get("authorization") or "")


async def test_tool_use_blocks_come_back_and_errors_are_toolmesh_errors(
    fake: FakeAnthropic,
) -> None:
    fake.script(Reply(tool_uses=[{"name": "ping", "input": {"echo": 1}}]))
    client = create_llm_client_for_role("call_llm", env=env_for(fake), max_retries=0)
    try:
        reply = await client.complete([{"role": "user", "content": "use a tool"}])
        assert reply.stop_reason == "tool_use"
        assert reply.tool_uses[0]["name"] == "ping" and reply.tool_uses[0]["input"] == {"echo": 1}
        fake.script(overloaded())
        with pytest.raises(Unavailable, match="529"):
            await client.complete([{"role": "user", "content": "x"}])
        fake.script(Reply(status=400, error_type="invalid_request_error"))
        with pytest.raises(InvalidArgument, match="rejected the request"):
            await client.complete([{"role": "user", "content": "x"}])
        with pytest.raises(InvalidArgument):
            await client.complete([{"role": "user", "content": "x"}], max_output_tokens=0)
    finally:
        await client.aclose()


async def test_the_client_cache_reuses_a_client_until_the_config_changes(
    sessions, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    store = ModelConfigStore(sessions)
    store.seed_defaults()
    cache = LlmClientCache(store, ttl_s=0)
    first = cache.for_role("call_llm")
    assert cache.for_role("call_llm") is first
    store.upsert(
        ModelConfig(
            model="claude-sonnet-4-5",
            provider="anthropic",
            max_output_tokens=99,
            roles=("call_llm",),
        )
    )
    changed = cache.for_role("call_llm")
    assert changed is not first and changed.config.max_output_tokens == 99
    await cache.aclose()


async def test_the_llm_limits_are_settings_every_cached_client_gets(
    sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    defaults = Settings.from_env({})
    assert (defaults.llm_timeout_s, defaults.llm_deadline_s, defaults.llm_max_retries) == (
        120.0,
        300.0,
        2,
    )
    settings = Settings.from_env(
        {
            "TOOLMESH_LLM_TIMEOUT_S": "30",
            "TOOLMESH_LLM_DEADLINE_S": "900",
            "TOOLMESH_LLM_MAX_RETRIES": "0",
        }
    )
    store = ModelConfigStore(sessions)
    store.seed_defaults()
    cache = LlmClientCache(
        store,
        timeout_s=settings.llm_timeout_s,
        deadline_s=settings.llm_deadline_s,
        max_retries=settings.llm_max_retries,
    )
    try:
        for role in ("call_llm", "tool_auditor"):
            client = cache.for_role(role)
            assert (client.timeout_s, client.deadline_s, client.max_retries) == (30.0, 900.0, 0)
    finally:
        await cache.aclose()
    for key, bad in (
        ("TOOLMESH_LLM_TIMEOUT_S", "0"),
        ("TOOLMESH_LLM_TIMEOUT_S", "3601"),
        ("TOOLMESH_LLM_DEADLINE_S", "nan"),
        ("TOOLMESH_LLM_DEADLINE_S", "86401"),
        ("TOOLMESH_LLM_MAX_RETRIES", "11"),
        ("TOOLMESH_LLM_MAX_RETRIES", "-1"),
        ("TOOLMESH_LLM_MAX_RETRIES", "two"),
    ):
        with pytest.raises(ValueError, match=key):
            Settings.from_env({key: bad})


def test_a_cost_account_refuses_and_stops_at_its_limit() -> None:
    account = CostAccount(limit=0.01, spent_before=0.004)
    account.check()
    account.charge_leaf(0.005)
    assert account.remaining() == pytest.approx(0.001)
    with pytest.raises(BudgetExceeded) as caught:
        account.charge_nested(0.002, "sub-call")
    assert account.total == pytest.approx(0.007)  # charged even when it crosses
    assert "sub-call" in str(caught.value) and "$0.011000 of a $0.010000" in str(caught.value)
    with pytest.raises(BudgetExceeded):
        account.check()
    envelope = exception_to_envelope(caught.value)
    assert isinstance(envelope, Err) and envelope.err_kind == "budget_exceeded"
    unlimited = CostAccount()
    unlimited.charge_leaf(100.0)
    assert unlimited.remaining() is None and not unlimited.exhausted()


def test_a_context_takes_its_budget_from_the_call() -> None:
    ctx = ToolContext(tool_name="t", tenant_id="a", budget_limit=0.5, budget_spent=0.2)
    assert ctx.cost.limit == 0.5 and ctx.cost.spent == pytest.approx(0.2)
    assert ToolContext(tool_name="t", tenant_id="a").cost.limit is None


def test_usage_stats_group_calls_and_costs(sessions) -> None:  # type: ignore[no-untyped-def]
    log = SqlUsageLog(sessions)
    for tool, cost in (("call_llm", 0.25), ("call_llm", 0.5), ("search", 1.0)):
        log.record(
            UsageEntry(
                tenant_id="t1",
                conversation_id="c1",
                tool_name=tool,
                kind="llm",
                cost_usd=cost,
                input_tokens=10,
                output_tokens=5,
            )
        )
    log.record(
        UsageEntry(tenant_id="t2", conversation_id="c1", tool_name="x", kind="tool", cost_usd=9.0)
    )
    assert log.conversation_spent("t1", "c1") == pytest.approx(1.75)
    assert log.conversation_spent("t1", "other") == 0
    stats, _ = usage_stats(sessions, group_by="tool", tenant_id="t1")
    by = {s.key: s for s in stats}
    assert by["call_llm"].cost_usd == pytest.approx(0.75) and by["call_llm"].llm_calls == 2
    assert by["call_llm"].tokens == 30 and by["call_llm"].calls == 0
    assert "x" not in by
    frame = stats_frame(stats, "tool")
    assert list(frame["tool"]) == ["search", "call_llm"]  # most cost first among equal calls
    future, _ = usage_stats(sessions, since=datetime.now(UTC) + timedelta(hours=1))
    assert future == [] and stats_frame(future, "tenant").empty
    with pytest.raises(InvalidArgument, match="group_by"):
        usage_stats(sessions, group_by="planet")


def test_since_accepts_durations_and_dates() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert parse_since("30m", now) == now - timedelta(minutes=30)
    assert parse_since("7d", now) == now - timedelta(days=7)
    assert parse_since("2026-12-01", now) == datetime(2026, 12, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="duration like"):
        parse_since("yesterday", now)


def test_usage_stats_group_cost_by_the_model_that_answered(sessions) -> None:  # type: ignore[no-untyped-def]
    """SREs asked which model the money went to; before, only tool, tenant, user or
    conversation."""
    log = SqlUsageLog(sessions)
    for model, cost in (("claude-haiku-4-5", 0.25), ("claude-haiku-4-5", 0.5), ("big", 2.0)):
        log.record(
            UsageEntry(
                tenant_id="t1",
                conversation_id="c1",
                tool_name="call_llm",
                kind="llm",
                model=model,
                cost_usd=cost,
                input_tokens=10,
                output_tokens=5,
            )
        )

    stats, _ = usage_stats(sessions, group_by="model")

    by = {s.key: s for s in stats}
    assert set(by) == {"claude-haiku-4-5", "big"}
    assert by["claude-haiku-4-5"].cost_usd == pytest.approx(0.75)
    assert by["claude-haiku-4-5"].llm_calls == 2 and by["big"].tokens == 15
    assert list(stats_frame(stats, "model")["model"]) == ["big", "claude-haiku-4-5"]
