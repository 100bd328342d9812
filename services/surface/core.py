"""The surface service's domain core: the per-call tool surface (AssembleTools), search_tools
(rank, page into the working set, count surface misses), the Tier-0 derivation and the model
configs. Imports no grpc; tested without a network.

State lives in the database (working sets, the stored floor, misses), so any replica answers any
call. Each replica caches a catalog snapshot (re-read when the catalog's fingerprint changes,
checked in the background at most every `catalog_ttl_s`) with the provider renderings and the
search index precomputed, and the floor for `floor_ttl_s`."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from opentelemetry import trace

from services.surface.assembly import (
    AGENTIC_ONLY,
    DELEGATE_EXCLUDED,
    MAX_TOOL_SURFACE,
    MODES,
    CatalogTool,
    Surface,
    compose,
    render,
)
from services.surface.embedding import Embedder, decode_vector, encode_vector
from services.surface.search import (
    IndexedTool,
    Match,
    SearchIndex,
    embedding_text,
    schema_field_names,
)
from services.surface.store import SurfaceStore, ToolRecord
from services.surface.tier0 import (
    SEED_KEY,
    STATIC_FLOOR,
    SYSTEM_TOOL_NAMES,
    Derivation,
    compute_scores,
    derive_tier0,
    encode_floor,
    parse_floor,
)
from shared.config import DEFAULT_DB_WAIT_S
from shared.db.engine import db_thread
from shared.errors import InvalidArgument, ToolmeshError
from shared.llm.config import ModelConfig

T = TypeVar("T")
logger = logging.getLogger(__name__)

DEFAULT_SEARCH_LIMIT = 5
MAX_SEARCH_LIMIT = 20
MAX_QUERY_CHARS = 2000
MODEL_CACHE_TTL_S = 5.0
EMBED_BATCH = 16
MAX_ALLOWED_CACHE = 256
# Skipped names remembered so that each is logged once (see _compose).
MAX_LOGGED_MISSING = 4096


class ModelConfigs(Protocol):
    """The model_configs store (shared.llm.config.ModelConfigStore)."""

    def list(self) -> list[ModelConfig]: ...
    def get(self, model: str) -> ModelConfig: ...
    def upsert(self, cfg: ModelConfig) -> ModelConfig: ...


@dataclass
class Catalog:
    """A snapshot of the live catalog and its search index."""

    fingerprint: tuple[Any, ...]
    tools: dict[str, CatalogTool]
    records: list[ToolRecord]
    index: SearchIndex
    missing_vectors: int = 0
    allowed: dict[tuple[str, frozenset[str], str], frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchOutcome:
    """What search_tools found and did."""

    matches: list[Match]
    paged_in: list[str]
    already_available: list[str]
    refusal: str = ""


@dataclass
class _Cached:
    expires: float = 0.0
    value: ModelConfig | None = None


@dataclass
class _FloorCache:
    expires: float = 0.0
    names: tuple[str, ...] = ()
    source: str = "static"


@dataclass
class Caller:
    """Who a surface is for."""

    tenant_id: str
    capabilities: frozenset[str] = frozenset()
    conversation_id: str = ""
    namespace_id: str = ""
    mode: str = "chat"
    model: str = ""


@dataclass
class _State:
    catalog: Catalog | None = None
    checked_at: float = -1e18
    embed_task: asyncio.Task[int] | None = None
    refresh_task: asyncio.Task[None] | None = None
    models: dict[str, _Cached] = field(default_factory=dict)
    logged_missing: set[str] = field(default_factory=set)


class SurfaceCore:
    def __init__(
        self,
        store: SurfaceStore,
        models: ModelConfigs,
        embedder: Embedder | None,
        *,
        catalog_ttl_s: float = 2.0,
        floor_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        db_wait_s: float = DEFAULT_DB_WAIT_S,
    ) -> None:
        """`db_wait_s`: how long one database operation of a call may take before the call
        answers UNAVAILABLE (shared.db.engine.bounded_db_wait; TOOLMESH_DB_WAIT_S)."""
        self._store = store
        self._db_wait_s = db_wait_s
        self._models = models
        self._embedder = embedder
        self._catalog_ttl_s = catalog_ttl_s
        self._floor_ttl_s = floor_ttl_s
        self._clock = clock
        self._now = now
        self._floor = _FloorCache()
        self._state = _State()
        self._lock = asyncio.Lock()

    # --- catalog and index --------------------------------------------------------------------

    @property
    def embedder(self) -> Embedder | None:
        return self._embedder

    async def catalog(self, *, force: bool = False) -> Catalog:
        """The current catalog snapshot, re-read when the stored catalog changed.

        Once a snapshot is loaded, no request waits on the freshness check (an aggregate over
        tool_definitions, embeddings included: milliseconds): when the snapshot is older than
        `catalog_ttl_s`, one background refresh checks while requests keep answering from the
        snapshot. `catalog_ttl_s=0` checks on every call instead, in line."""
        state = self._state
        if not force and state.catalog is not None:
            if not self._catalog_stale():
                return state.catalog
            if self._catalog_ttl_s > 0:
                self._start_refresh()
                return state.catalog
        return await self._refresh(force=force)

    async def _refresh(self, *, force: bool) -> Catalog:
        state = self._state
        async with self._lock:
            if not force and state.catalog is not None and not self._catalog_stale():
                return state.catalog
            fingerprint = await self._db("the catalog's check", self._store.catalog_fingerprint)
            if force or state.catalog is None or state.catalog.fingerprint != fingerprint:
                records = await self._db("the catalog's read", self._store.load_catalog)
                state.catalog = await asyncio.to_thread(self._build, fingerprint, records)
                logger.info(
                    "catalog loaded: %d tools, %d without embeddings",
                    len(records),
                    state.catalog.missing_vectors,
                )
            state.checked_at = self._clock()
            catalog = state.catalog
        if catalog.missing_vectors and self._embedder is not None:
            self._start_embedding()
        return catalog

    async def _db(self, what: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return await db_thread(self._db_wait_s, what, fn, *args, **kwargs)

    def _start_refresh(self) -> None:
        task = self._state.refresh_task
        if task is not None and not task.done():
            return
        self._state.refresh_task = asyncio.get_running_loop().create_task(
            self._refresh_in_background()
        )

    async def _refresh_in_background(self) -> None:
        try:
            await self._refresh(force=False)
        except ToolmeshError as exc:
            # The snapshot stays in use; the next stale request tries again.
            logger.warning("catalog refresh failed: %s", exc.message)

    def _catalog_stale(self) -> bool:
        return self._clock() - self._state.checked_at >= self._catalog_ttl_s

    def _build(self, fingerprint: tuple[Any, ...], records: list[ToolRecord]) -> Catalog:
        tools: dict[str, CatalogTool] = {}
        indexed: list[IndexedTool] = []
        missing = 0
        embedder = self._embedder
        for r in records:
            tools[r.name] = render(
                CatalogTool(
                    name=r.name,
                    description=r.description,
                    input_schema=r.input_schema,
                    tenant_id=r.tenant_id,
                    status=r.status,
                    enabled=r.enabled,
                    category=r.category,
                    required_capabilities=frozenset(r.required_capabilities),
                    replaced_by_model_capability=r.replaced_by_model_capability,
                    id=r.id,
                    version=r.version,
                )
            )
            vector = (
                decode_vector(r.embedding, embedder.model_id, embedder.dim)
                if embedder is not None
                else None
            )
            if embedder is not None and vector is None:
                missing += 1
            indexed.append(
                IndexedTool(
                    r.name, r.description, tuple(schema_field_names(r.input_schema)), vector
                )
            )
        return Catalog(fingerprint, tools, records, SearchIndex(indexed, embedder), missing)

    def _start_embedding(self) -> None:
        task = self._state.embed_task
        if task is not None and not task.done():
            return
        self._state.embed_task = asyncio.get_running_loop().create_task(self.index_embeddings())

    async def index_embeddings(self) -> int:
        """Embed every live tool without a (current) stored vector, store the vectors and
        rebuild the index. Returns how many vectors were stored."""
        embedder = self._embedder
        if embedder is None:
            return 0
        records = await self._db("the catalog's read", self._store.load_catalog)
        todo = [
            r
            for r in records
            if decode_vector(r.embedding, embedder.model_id, embedder.dim) is None
        ]
        # Replicas that start together share the work: each goes in its own random order and
        # skips what another replica stored meanwhile.
        random.shuffle(todo)
        stored = 0
        for start in range(0, len(todo), EMBED_BATCH):
            batch = todo[start : start + EMBED_BATCH]
            if start:
                done = await self._db("the embeddings' read", self._store.embedded_ids)
                batch = [r for r in batch if r.id not in done]
                if not batch:
                    continue
            vectors = await asyncio.to_thread(
                embedder.embed, [embedding_text(r.name, r.description) for r in batch]
            )
            items = [
                (r.id, r.version, encode_vector(embedder.model_id, vectors[i]))
                for i, r in enumerate(batch)
            ]
            stored += await self._db("the embeddings' write", self._store.save_embeddings, items)
        if todo:
            logger.info("embedded %d tools (%d stored)", len(todo), stored)
        await self.catalog(force=True)
        return stored

    async def wait_indexed(self) -> None:
        """Wait for a running embedding job (tests, benchmarks, the eval command)."""
        task = self._state.embed_task
        if task is not None:
            await asyncio.shield(task)

    # --- floor --------------------------------------------------------------------------------

    async def resolve_floor_names(self) -> tuple[str, ...]:
        """The stored floor (cached for floor_ttl_s), STATIC_FLOOR when none was stored or it
        does not parse, always unioned with SYSTEM_TOOL_NAMES."""
        cache = self._floor
        if self._clock() < cache.expires:
            return cache.names
        stored = parse_floor(
            await self._db("the Tier-0 floor's read", self._store.read_seed, SEED_KEY)
        )
        if stored is None:
            base, source = STATIC_FLOOR, "static"
        else:
            base, source = stored, "derived"
        names = tuple(dict.fromkeys([*base, *sorted(SYSTEM_TOOL_NAMES)]))
        self._floor = _FloorCache(self._clock() + self._floor_ttl_s, names, source)
        return names

    @property
    def floor_source(self) -> str:
        """ "derived" when the floor came from the seed log, "static" for the fallback."""
        return self._floor.source

    async def derive_tier0(self) -> Derivation:
        """Re-derive the floor from usage and surface misses and store it in the seed log."""
        now = self._now()
        usage = await self._db("the usage counts' read", self._store.usage_counts, now)
        misses = await self._db("the surface misses' read", self._store.miss_counts, now)
        catalog = await self.catalog()
        # The floor is every tenant's: only tools every tenant may see are eligible (a
        # tenant's own tool, however used, would be skipped for the others and named to them).
        live = [
            n for n, t in catalog.tools.items() if t.category != "internal" and t.tenant_id == "*"
        ]
        derivation = derive_tier0(compute_scores(usage, misses), eligible=live)
        await self._db(
            "the Tier-0 floor's write", self._store.write_seed, SEED_KEY, encode_floor(derivation)
        )
        self._floor = _FloorCache()  # this replica sees it at once; others within the TTL
        logger.info("tier0 derived: %d tools", len(derivation.names))
        return derivation

    # --- assembly -----------------------------------------------------------------------------

    async def _model(self, model: str) -> ModelConfig | None:
        if not model:
            return None
        cached = self._state.models.get(model)
        if cached is not None and self._clock() < cached.expires:
            return cached.value
        cfg = await self._db("the model configuration's read", self._models.get, model)
        self._state.models[model] = _Cached(self._clock() + MODEL_CACHE_TTL_S, cfg)
        return cfg

    async def _compose(
        self, caller: Caller, *, enforce_budget: bool
    ) -> tuple[Surface, Catalog, Callable[[list[str]], Surface]]:
        """The caller's surface, the catalog snapshot it was composed from, and the same
        composition for another working set (search_tools' budget check under the lock)."""
        if caller.mode not in MODES:
            raise InvalidArgument(
                f"mode must be one of {', '.join(MODES)}", field_violations=[("mode", "unknown")]
            )
        catalog = await self.catalog()
        floor = await self.resolve_floor_names()
        working = (
            await self._db(
                "the working set's read",
                self._store.working_set,
                caller.conversation_id,
                caller.namespace_id,
                caller.tenant_id,
            )
            if caller.conversation_id
            else []
        )
        cfg = await self._model(caller.model)

        def for_working_set(names: list[str], *, enforce: bool = False) -> Surface:
            return compose(
                mode=caller.mode,
                floor=floor,
                working_set=names,
                catalog=catalog.tools,
                tenant_id=caller.tenant_id,
                capabilities=caller.capabilities,
                model_capabilities=cfg.capabilities if cfg is not None else (),
                provider=cfg.provider if cfg is not None else "",
                enforce_budget=enforce,
            )

        surface = for_working_set(working, enforce=enforce_budget)
        logged = self._state.logged_missing
        fresh = [n for n in surface.skipped if n not in logged]
        if fresh:
            # Names of tools deleted since they were paged in come for as long as the service
            # runs: past MAX_LOGGED_MISSING the set starts again (a name is then logged anew).
            if len(logged) + len(fresh) > MAX_LOGGED_MISSING:
                logged.clear()
            logged.update(fresh)
            logger.info("surface skips names the caller's catalog lacks: %s", fresh)
        return surface, catalog, for_working_set

    async def assemble(self, caller: Caller) -> Surface:
        if not caller.tenant_id:
            raise InvalidArgument(
                "tenant_id is required", field_violations=[("tenant_id", "must not be empty")]
            )
        surface, catalog, _ = await self._compose(caller, enforce_budget=True)
        # `skipped` names what the caller asked for but cannot use; another tenant's tool in a
        # floor (one stored before floors were limited to shared tools) is not the caller's to
        # hear of: left out, as if it were not skipped at all.
        foreign = [
            n
            for n in surface.skipped
            if (t := catalog.tools.get(n)) is not None
            and t.tenant_id not in ("*", caller.tenant_id)
        ]
        if foreign:
            surface.skipped = [n for n in surface.skipped if n not in foreign]
        span = trace.get_current_span()
        span.set_attribute("toolmesh.surface.size", len(surface.tools))
        span.set_attribute("toolmesh.surface.mode", caller.mode)
        return surface

    async def working_set(
        self, conversation_id: str, namespace_id: str, tenant_id: str | None = None
    ) -> list[str]:
        """A conversation namespace's working set: what `tenant_id` paged in, or (None: the
        operator's view) what every tenant did."""
        if not conversation_id:
            raise InvalidArgument(
                "conversation_id is required",
                field_violations=[("conversation_id", "must not be empty")],
            )
        return await self._db(
            "the working set's read",
            self._store.working_set,
            conversation_id,
            namespace_id,
            tenant_id,
        )

    # --- search -------------------------------------------------------------------------------

    def _allowed(self, catalog: Catalog, caller: Caller) -> frozenset[str]:
        """Names the caller may be offered, cached per catalog snapshot and caller kind: usable
        by the caller and not kept out of the caller's mode (a tool the mode never shows, like
        `plan` outside agentic mode, would be paged in and never seen)."""
        key = (caller.tenant_id, caller.capabilities, caller.mode)
        names = catalog.allowed.get(key)
        if names is None:
            if len(catalog.allowed) > MAX_ALLOWED_CACHE:
                catalog.allowed.clear()
            excluded: frozenset[str] = frozenset()
            if caller.mode != "agentic":
                excluded = AGENTIC_ONLY | (
                    DELEGATE_EXCLUDED if caller.mode == "delegate" else frozenset()
                )
            names = frozenset(
                n
                for n, t in catalog.tools.items()
                if n not in excluded and t.usable_by(caller.tenant_id, caller.capabilities)
            )
            catalog.allowed[key] = names
        return names

    async def search(self, query: str, limit: int, caller: Caller) -> SearchOutcome:
        """Rank the tools the caller may use against `query` and page the best ones that are
        not on the caller's surface yet into the working set, within MAX_TOOL_SURFACE."""
        query = query.strip()
        problems: list[tuple[str, str]] = []
        if not query:
            problems.append(("query", "must not be empty"))
        elif len(query) > MAX_QUERY_CHARS:
            problems.append(("query", f"longer than {MAX_QUERY_CHARS} characters"))
        if limit < 0 or limit > MAX_SEARCH_LIMIT:
            problems.append(("limit", f"must be between 0 and {MAX_SEARCH_LIMIT}"))
        if not caller.tenant_id:
            problems.append(("context.tenant_id", "must not be empty"))
        if not caller.conversation_id:
            problems.append(("context.conversation_id", "must not be empty"))
        if problems:
            raise InvalidArgument(
                "invalid search: " + "; ".join(f"{f} {d}" for f, d in problems),
                field_violations=problems,
            )
        limit = limit or DEFAULT_SEARCH_LIMIT
        catalog = await self.catalog()
        allowed = self._allowed(catalog, caller)
        # Rank (mostly the query embedding) while the caller's current surface is composed.
        ranking = asyncio.ensure_future(
            asyncio.to_thread(catalog.index.search, query, limit, allowed)
        )
        try:
            surface, _, for_working_set = await self._compose(caller, enforce_budget=False)
        finally:
            matches = await ranking
        on_surface = set(surface.names)
        already = [m.name for m in matches if m.name in on_surface]
        wanted = [m.name for m in matches if m.name not in on_surface]
        in_use = [len(on_surface)]

        def room(current: list[str]) -> int:
            # Under the namespace's lock, on the working set as it is now: another search of
            # the conversation may have paged tools in since this one composed the surface.
            in_use[0] = len(for_working_set(current).tools)
            return MAX_TOOL_SURFACE - in_use[0]

        refusal = ""
        added: list[str] = []
        if wanted:
            floor = frozenset(await self.resolve_floor_names())
            result = await self._db(
                "the working set's write",
                functools.partial(
                    self._store.page_in_checked,
                    caller.conversation_id,
                    caller.namespace_id,
                    wanted,
                    floor,
                    self._now(),
                    tenant_id=caller.tenant_id,
                    room=room,
                ),
            )
            added = result.added
            # A name another search of the conversation paged in meanwhile is there already.
            late = set(wanted) - set(added) - set(result.refused)
            already += [n for n in wanted if n in late]
            if result.refused:
                refusal = (
                    f"the tool surface is at its budget of {MAX_TOOL_SURFACE} tools "
                    f"({in_use[0]} in use), so {', '.join(result.refused)} could not be added; "
                    "use the tools already available or continue in a new conversation"
                )
        span = trace.get_current_span()
        span.set_attribute("toolmesh.search.matches", len(matches))
        span.set_attribute("toolmesh.search.paged_in", len(added))
        span.set_attribute("toolmesh.search.hybrid", catalog.index.hybrid)
        return SearchOutcome(matches, added, already, refusal)

    # --- model configs ------------------------------------------------------------------------

    async def list_models(self) -> list[ModelConfig]:
        return await self._db("the model configurations' read", self._models.list)

    async def upsert_model(self, cfg: ModelConfig) -> ModelConfig:
        stored = await self._db("the model configuration's write", self._models.upsert, cfg)
        self._state.models.pop(cfg.model, None)
        return stored

    async def close(self) -> None:
        for task in (self._state.refresh_task, self._state.embed_task):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
