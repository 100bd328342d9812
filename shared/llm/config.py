"""Role-based model configuration (`model_configs`): which model serves a role, its provider,
native capabilities, output-token ceiling and prices. Nothing here hard-codes a token limit:
callers take `max_output_tokens` from the config of the role they play."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from shared.convert import has_control
from shared.db.engine import translate_db_errors, upsert_row
from shared.db.models import ModelConfigRow
from shared.errors import InvalidArgument, NotFound, Unavailable

# Roles the platform calls models in. A config row lists the roles it serves; the first row
# (by model name) serving a role wins, and `default` serves any role nobody claims.
ROLE_DEFAULT = "default"
ROLE_CALL_LLM = "call_llm"
ROLE_TOOL_BUILDER = "tool_builder"
ROLE_TOOL_AUDITOR = "tool_auditor"
KNOWN_ROLES = (ROLE_DEFAULT, ROLE_CALL_LLM, ROLE_TOOL_BUILDER, ROLE_TOOL_AUDITOR)

# Providers a model config may name. Only "anthropic" has a client here (create_llm_client_for
# _role); the others exist so the surface can filter tools by a provider's native capabilities.
PROVIDERS = ("anthropic", "openai", "openai_responses")
# A model name fits model_configs.model; a role or capability name is a short identifier.
MAX_MODEL_CHARS = 128
MAX_NAME_CHARS = 64
MAX_NAMES = 64


@dataclass(frozen=True)
class ModelConfig:
    """One model: prices are USD per million tokens."""

    model: str
    provider: str
    max_output_tokens: int
    roles: tuple[str, ...] = ()
    capabilities: frozenset[str] = field(default_factory=frozenset)
    input_price_per_mtok: float = 0.0
    output_price_per_mtok: float = 0.0
    cache_read_price_per_mtok: float = 0.0
    cache_write_price_per_mtok: float = 0.0

    def validate(self) -> ModelConfig:
        problems: list[tuple[str, str]] = []
        if not self.model.strip():
            problems.append(("model", "must not be empty"))
        elif len(self.model) > MAX_MODEL_CHARS or has_control(self.model):
            problems.append(
                ("model", f"must be at most {MAX_MODEL_CHARS} characters, none of them control")
            )
        if self.provider not in PROVIDERS:
            problems.append(("provider", f"must be one of {', '.join(PROVIDERS)}"))
        if self.max_output_tokens <= 0:
            problems.append(("max_output_tokens", "must be a positive integer"))
        for name in (
            "input_price_per_mtok",
            "output_price_per_mtok",
            "cache_read_price_per_mtok",
            "cache_write_price_per_mtok",
        ):
            price = getattr(self, name)
            if not math.isfinite(price):
                problems.append((name, "must be a finite number"))
            elif price < 0:
                problems.append((name, "must not be negative"))
        for name, values in (("roles", self.roles), ("capabilities", self.capabilities)):
            if len(values) > MAX_NAMES or any(
                not v.strip() or len(v) > MAX_NAME_CHARS or has_control(v) for v in values
            ):
                problems.append(
                    (
                        name,
                        f"must be at most {MAX_NAMES} names of 1 to {MAX_NAME_CHARS} "
                        "characters, none of them control",
                    )
                )
        if problems:
            raise InvalidArgument(
                f"invalid model config {self.model!r}: "
                + "; ".join(f"{f} {d}" for f, d in problems),
                field_violations=problems,
            )
        return self


# Seeded when the table is empty. Prices are the providers' published list prices (USD per
# million tokens); an operator changes them with UpsertModelConfig / `toolmesh models`.
DEFAULT_MODEL_CONFIGS: tuple[ModelConfig, ...] = (
    ModelConfig(
        model="claude-sonnet-4-5",
        provider="anthropic",
        max_output_tokens=16384,
        roles=(ROLE_DEFAULT, ROLE_CALL_LLM, ROLE_TOOL_BUILDER),
        capabilities=frozenset({"web_search", "code_execution"}),
        input_price_per_mtok=3.0,
        output_price_per_mtok=15.0,
        cache_read_price_per_mtok=0.30,
        cache_write_price_per_mtok=3.75,
    ),
    ModelConfig(
        model="claude-haiku-4-5",
        provider="anthropic",
        max_output_tokens=8192,
        roles=(ROLE_TOOL_AUDITOR,),
        capabilities=frozenset({"web_search"}),
        input_price_per_mtok=1.0,
        output_price_per_mtok=5.0,
        cache_read_price_per_mtok=0.10,
        cache_write_price_per_mtok=1.25,
    ),
)


def _from_row(row: ModelConfigRow) -> ModelConfig:
    return ModelConfig(
        model=row.model,
        provider=row.provider,
        max_output_tokens=row.max_output_tokens,
        roles=tuple(row.roles or ()),
        capabilities=frozenset(row.capabilities or ()),
        input_price_per_mtok=row.input_price_per_mtok,
        output_price_per_mtok=row.output_price_per_mtok,
        cache_read_price_per_mtok=row.cache_read_price_per_mtok,
        cache_write_price_per_mtok=row.cache_write_price_per_mtok,
    )


def _apply(row: ModelConfigRow, cfg: ModelConfig) -> None:
    row.provider = cfg.provider
    row.max_output_tokens = cfg.max_output_tokens
    row.roles = list(cfg.roles)
    row.capabilities = sorted(cfg.capabilities)
    row.input_price_per_mtok = cfg.input_price_per_mtok
    row.output_price_per_mtok = cfg.output_price_per_mtok
    row.cache_read_price_per_mtok = cfg.cache_read_price_per_mtok
    row.cache_write_price_per_mtok = cfg.cache_write_price_per_mtok


class ModelConfigStore:
    """model_configs in the database; every replica of every service reads the same rows."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def list(self) -> list[ModelConfig]:
        with translate_db_errors(), self._sessions() as session:
            rows = session.scalars(select(ModelConfigRow).order_by(ModelConfigRow.model))
            return [_from_row(r) for r in rows]

    def get(self, model: str) -> ModelConfig:
        with translate_db_errors(), self._sessions() as session:
            row = session.get(ModelConfigRow, model)
            if row is None:
                raise NotFound(f"no model config for {model!r}", reason="MODEL_NOT_CONFIGURED")
            return _from_row(row)

    def upsert(self, cfg: ModelConfig) -> ModelConfig:
        """Insert or update the model's row (writers racing on a new model all succeed)."""
        cfg.validate()
        upsert_row(self._sessions, ModelConfigRow, {"model": cfg.model}, lambda r: _apply(r, cfg))
        return cfg

    def seed_defaults(self, configs: Iterable[ModelConfig] = DEFAULT_MODEL_CONFIGS) -> int:
        """Insert the defaults when the table is empty; returns how many were inserted.

        Replicas starting together race here: the loser's insert fails (a duplicate key, or
        on SQLite a write from a stale snapshot), and when the table then holds rows another
        seeder won, which is success with nothing inserted."""
        rows = [cfg.validate() for cfg in configs]
        try:
            with translate_db_errors(), self._sessions.begin() as session:
                if self._seeded(session):
                    return 0
                for cfg in rows:
                    row = ModelConfigRow(model=cfg.model)
                    _apply(row, cfg)
                    session.add(row)
            return len(rows)
        except (IntegrityError, Unavailable):
            with translate_db_errors(), self._sessions() as session:
                if self._seeded(session):
                    return 0
            raise

    @staticmethod
    def _seeded(session: Session) -> bool:
        return session.scalars(select(ModelConfigRow.model).limit(1)).first() is not None

    def for_role(self, role: str) -> ModelConfig:
        return pick_for_role(self.list(), role)


def pick_for_role(configs: Sequence[ModelConfig], role: str) -> ModelConfig:
    """The config serving `role`, else the one serving `default`; NotFound when neither."""
    for wanted in (role, ROLE_DEFAULT):
        for cfg in configs:
            if wanted in cfg.roles:
                return cfg
    raise NotFound(
        f"no model config serves role {role!r} (and none serves {ROLE_DEFAULT!r}); add one "
        "with `toolmesh models set` or UpsertModelConfig",
        reason="MODEL_NOT_CONFIGURED",
        metadata={"role": role},
    )


def get_model_for_role(role: str, store: ModelConfigStore | None = None) -> ModelConfig:
    """The model config for a role: from the database when a store is given, otherwise from
    the built-in defaults (unit tests, tools without a database)."""
    if store is None:
        return pick_for_role(DEFAULT_MODEL_CONFIGS, role)
    configs = store.list()
    return pick_for_role(configs or DEFAULT_MODEL_CONFIGS, role)
