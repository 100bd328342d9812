"""The dispatcher's guardrail state in the database, so any replica serves any conversation:
policy rules, per-user observations, failed approaches, the loop guard and the cancellation
epoch (conversation_state), and rate-limit counters.

Reads for one call (or one batch) are one statement of scalar subqueries — one round trip. The
updates a call causes are StateWrite objects the call log applies in the same group-commit
transaction as the call's log rows. The hot-path statements are plain SQL, the same on SQLite
and PostgreSQL (both have INSERT .. ON CONFLICT and RETURNING): building them with the SQL
expression language cost about 1 ms of CPU per call, text about 0.2 ms."""

from __future__ import annotations

import functools
import random
import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, cast

from sqlalchemy import (
    DateTime,
    Engine,
    Table,
    TextClause,
    bindparam,
    insert,
    select,
    text,
    update,
)

from services.dispatcher.guardrails import LoopState, PolicyRule, window_start
from shared.db.engine import database_error, translate_db_errors
from shared.db.inline import LoopConnection
from shared.db.models import PolicyRuleRow, utcnow
from shared.db.prepared import PreparedCache
from shared.errors import InvalidArgument, NotFound, Unavailable

_RULES = cast(Table, PolicyRuleRow.__table__)

_NAMED_PARAM = re.compile(r":([a-z][a-z0-9_]*)")
PRUNE_PROBABILITY = 0.01  # share of rate-limit increments that also delete expired windows


@dataclass
class Snapshot:
    """What the guardrails need to know about a conversation before its next call(s)."""

    known: bool = False
    loop: LoopState = field(default_factory=LoopState)
    cancel_epoch: int = 0
    failed: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    prior_tools: set[str] = field(default_factory=set)
    # (tool_use_id, tool_name, args_hash) of a call asked about -> the tool_execution_log row
    # of the latest such call answered in the conversation (see Dispatcher: a retry).
    answered: dict[tuple[str, str, str], int] = field(default_factory=dict)


class GuardrailStore(Protocol):
    """Storage of the guardrails; every method is blocking (the core runs them in a thread)."""

    def add_rule(self, rule: PolicyRule) -> PolicyRule: ...
    def list_rules(self, tenant_id: str, include_disabled: bool) -> list[PolicyRule]: ...
    def disable_rule(self, rule_id: int) -> PolicyRule: ...
    def snapshot(
        self,
        tenant_id: str,
        conversation_id: str,
        calls: Sequence[tuple[str, str]],
        prior_tools: Sequence[str],
        answers: Sequence[tuple[str, str, str]] = (),
    ) -> Snapshot: ...
    def snapshot_now(
        self,
        tenant_id: str,
        conversation_id: str,
        calls: Sequence[tuple[str, str]],
        prior_tools: Sequence[str],
        answers: Sequence[tuple[str, str, str]] = (),
    ) -> Snapshot | None:
        """The snapshot read without blocking (on the event loop), or None when that would
        wait; then the core reads `snapshot` in a thread."""
        ...

    def observation_counts(
        self, tenant_id: str, user_id: str, rule_ids: Sequence[int]
    ) -> dict[int, int]: ...
    def count_calls(
        self, tenant_id: str, tool_name: str, rules: Sequence[PolicyRule], now_s: float
    ) -> dict[int, int]: ...
    def count_calls_now(
        self, tenant_id: str, tool_name: str, rules: Sequence[PolicyRule], now_s: float
    ) -> dict[int, int] | None:
        """count_calls without blocking (on the event loop), or None when that would wait."""
        ...

    def touch_conversation(self, tenant_id: str, conversation_id: str) -> None: ...
    def touch_conversation_now(self, tenant_id: str, conversation_id: str) -> bool:
        """touch_conversation without blocking (on the event loop); False when that would
        wait."""
        ...

    def bump_cancel_epoch(self, tenant_id: str, conversation_id: str) -> int | None: ...
    def cancel_epoch(self, tenant_id: str, conversation_id: str) -> int: ...
    def cancel_epochs(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]: ...


def _sql(statement: str, *timestamps: str) -> TextClause:
    """A textual statement whose named timestamp parameters go through the DateTime type (so
    SQLite stores them exactly as the ORM does)."""
    clause = text(statement)
    if timestamps:
        clause = clause.bindparams(
            *(bindparam(name, type_=DateTime(timezone=True)) for name in timestamps)
        )
    return clause


_UPSERT_LOOP = _sql(
    """
    INSERT INTO conversation_state
        (tenant_id, conversation_id, call_seq, loop_hash, loop_count, cancel_epoch, updated_at)
    VALUES (:tenant_id, :conversation_id, :seq, :hash, :run, 0, :now)
    ON CONFLICT (tenant_id, conversation_id) DO UPDATE SET
        call_seq = excluded.call_seq, loop_hash = excluded.loop_hash,
        loop_count = excluded.loop_count, updated_at = excluded.updated_at
    WHERE conversation_state.call_seq < excluded.call_seq
    """,
    "now",
)
_TOUCH = _sql(
    """
    INSERT INTO conversation_state
        (tenant_id, conversation_id, call_seq, loop_hash, loop_count, cancel_epoch, updated_at)
    VALUES (:tenant_id, :conversation_id, 0, '', 0, 0, :now)
    ON CONFLICT (tenant_id, conversation_id) DO NOTHING
    """,
    "now",
)
_UPSERT_FAILED = _sql(
    """
    INSERT INTO failed_approaches (tenant_id, conversation_id, tool_name, identity_hash, reason,
        attempts, first_failed_at, last_failed_at)
    VALUES (:tenant_id, :conversation_id, :tool, :identity, :reason, 1, :now, :now)
    ON CONFLICT (tenant_id, conversation_id, tool_name, identity_hash) DO UPDATE SET
        attempts = failed_approaches.attempts + 1, reason = excluded.reason,
        last_failed_at = excluded.last_failed_at
    """,
    "now",
)
_UPSERT_OBSERVATION = _sql(
    """
    INSERT INTO observations (tenant_id, user_id, rule_id, tool_name, count, first_seen_at,
        last_seen_at)
    VALUES (:tenant_id, :user_id, :rule_id, :tool, 1, :now, :now)
    ON CONFLICT (tenant_id, user_id, rule_id) DO UPDATE SET
        count = observations.count + 1, last_seen_at = excluded.last_seen_at
    """,
    "now",
)
_COUNT_CALL = _sql(
    """
    INSERT INTO rate_limit_counters (rule_id, tenant_id, tool_name, window_start, count)
    VALUES (:rule_id, :tenant_id, :tool, :window, 1)
    ON CONFLICT (rule_id, tenant_id, tool_name, window_start) DO UPDATE SET
        count = rate_limit_counters.count + 1
    RETURNING count
    """
)
# One rule's windows long past: never another rule's (a rule with a longer window keeps counting
# in a window older than this rule's horizon).
_PRUNE_COUNTERS = _sql(
    "DELETE FROM rate_limit_counters WHERE rule_id = :rule_id AND window_start < :horizon"
)
_CANCEL_EPOCH = _sql(
    "SELECT cancel_epoch FROM conversation_state "
    "WHERE tenant_id = :tenant_id AND conversation_id = :conversation_id"
)
_BUMP_EPOCH = _sql(
    """
    UPDATE conversation_state SET cancel_epoch = cancel_epoch + 1, cancelled_at = :now
    WHERE tenant_id = :tenant_id AND conversation_id = :conversation_id
    RETURNING cancel_epoch
    """,
    "now",
)


def rule_from_row(row: Any) -> PolicyRule:
    return PolicyRule(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        kind=row.kind,
        tool_name=row.tool_name,
        mode=row.mode,
        params=dict(row.params or {}),
        message=row.message,
        enabled=row.enabled,
        created_by=row.created_by,
        created_at=row.created_at,
    )


def rate_rules(rules: Iterable[PolicyRule]) -> list[PolicyRule]:
    return [r for r in rules if r.kind == "rate_limit"]


@dataclass(frozen=True)
class LoopStateWrite:
    """Stores the loop guard's state after a call; a write ordered before the stored one (by
    call_seq, e.g. a batch's calls finishing out of order) changes nothing."""

    tenant_id: str
    conversation_id: str
    loop: LoopState

    statement: ClassVar[TextClause] = _UPSERT_LOOP

    def row_key(self) -> tuple[Any, ...]:
        return (self.tenant_id, self.conversation_id)

    def params(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "conversation_id": self.conversation_id,
            "seq": self.loop.seq,
            "hash": self.loop.last_identity,
            "run": self.loop.run_length,
            "now": utcnow(),
        }


@dataclass(frozen=True)
class FailedApproachWrite:
    """record_failed_approach in the database: idempotent upsert, attempts + 1."""

    tenant_id: str
    conversation_id: str
    tool_name: str
    identity: str
    reason: str

    statement: ClassVar[TextClause] = _UPSERT_FAILED

    def row_key(self) -> tuple[Any, ...]:
        return (self.tenant_id, self.conversation_id, self.tool_name, self.identity)

    def params(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "conversation_id": self.conversation_id,
            "tool": self.tool_name,
            "identity": self.identity,
            "reason": self.reason,
            "now": utcnow(),
        }


@dataclass(frozen=True)
class ObservationWrite:
    """Reinforces a user's observation row for a violated rule (count + 1)."""

    tenant_id: str
    user_id: str
    rule_id: int
    tool_name: str

    statement: ClassVar[TextClause] = _UPSERT_OBSERVATION

    def row_key(self) -> tuple[Any, ...]:
        return (self.tenant_id, self.user_id, self.rule_id)

    def params(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "user_id": self.user_id,
            "rule_id": self.rule_id,
            "tool": self.tool_name,
            "now": utcnow(),
        }


# Calls (two columns each), prior tools or answers (one each) per snapshot statement: SQLite
# allows 2000 result columns and PostgreSQL 1664 target entries, so a batch of many distinct
# calls is read in several statements of at most ~1,030 columns each.
SNAPSHOT_CHUNK = 256


def _snapshot_queries(
    tenant_id: str,
    conversation_id: str,
    calls: Sequence[tuple[str, str]],
    prior_tools: Sequence[str],
    answers: Sequence[tuple[str, str, str]] = (),
) -> list[_SnapshotQuery]:
    """The statements of one snapshot: one in the usual case, one per SNAPSHOT_CHUNK calls,
    prior tools or answers beyond that."""
    unique_calls = list(dict.fromkeys(calls))
    unique_prior = list(dict.fromkeys(prior_tools))
    unique_answers = list(dict.fromkeys(answers))
    longest = max(len(unique_calls), len(unique_prior), len(unique_answers))
    n = max(1, -(-longest // SNAPSHOT_CHUNK))
    return [
        _SnapshotQuery(
            tenant_id,
            conversation_id,
            unique_calls[i * SNAPSHOT_CHUNK : (i + 1) * SNAPSHOT_CHUNK],
            unique_prior[i * SNAPSHOT_CHUNK : (i + 1) * SNAPSHOT_CHUNK],
            unique_answers[i * SNAPSHOT_CHUNK : (i + 1) * SNAPSHOT_CHUNK],
        )
        for i in range(n)
    ]


def _merge(parts: Sequence[Snapshot]) -> Snapshot:
    """One snapshot from the parts read by several statements (each reads the state row)."""
    if len(parts) == 1:
        return parts[0]
    merged = parts[0]
    for part in parts[1:]:
        merged.failed.update(part.failed)
        merged.prior_tools |= part.prior_tools
        merged.answered.update(part.answered)
    return merged


@functools.lru_cache(maxsize=64)
def _snapshot_statement(n_calls: int, n_prior: int, n_answers: int = 0) -> str:
    """The snapshot statement for `n_calls` calls, `n_prior` prior tools and `n_answers`
    answered calls looked for (its text depends on nothing else; built once per shape)."""
    columns = ["s.id", "s.call_seq", "s.loop_hash", "s.loop_count", "s.cancel_epoch"]
    for i in range(n_calls):
        where = (
            "FROM failed_approaches WHERE tenant_id = :t AND conversation_id = :c "
            f"AND tool_name = :ft{i} AND identity_hash = :fh{i}"
        )
        columns += [f"(SELECT attempts {where})", f"(SELECT reason {where})"]
    for i in range(n_prior):
        columns.append(
            "EXISTS (SELECT 1 FROM tool_execution_log WHERE conversation_id = :c "
            f"AND tenant_id = :t AND tool_name = :p{i} AND success = :yes)"
        )
    for i in range(n_answers):  # on ix_tool_execution_log_tool_use
        columns.append(
            "(SELECT MAX(id) FROM tool_execution_log WHERE conversation_id = :c "
            f"AND tool_use_id = :au{i} AND tenant_id = :t AND tool_name = :an{i} "
            f"AND args_hash = :ah{i} AND response IS NOT NULL)"
        )
    return (
        f"SELECT {', '.join(columns)} FROM (SELECT 1 AS one) AS one "
        "LEFT JOIN conversation_state s ON s.tenant_id = :t AND s.conversation_id = :c"
    )


class _SnapshotQuery:
    """One statement of a snapshot and the parsing of its row."""

    def __init__(
        self,
        tenant_id: str,
        conversation_id: str,
        calls: Sequence[tuple[str, str]],
        prior_tools: Sequence[str],
        answers: Sequence[tuple[str, str, str]] = (),
    ) -> None:
        self.calls = list(dict.fromkeys(calls))
        self.prior = list(dict.fromkeys(prior_tools))
        self.answers = list(dict.fromkeys(answers))
        params: dict[str, Any] = {"t": tenant_id, "c": conversation_id, "yes": True}
        for i, (tool, identity) in enumerate(self.calls):
            params[f"ft{i}"], params[f"fh{i}"] = tool, identity
        for i, tool in enumerate(self.prior):
            params[f"p{i}"] = tool
        for i, (tool_use_id, tool, args_hash) in enumerate(self.answers):
            params[f"au{i}"], params[f"an{i}"], params[f"ah{i}"] = tool_use_id, tool, args_hash
        self.params = params
        self.statement = _snapshot_statement(len(self.calls), len(self.prior), len(self.answers))

    def parse(self, row: list[Any]) -> Snapshot:
        snap = Snapshot(
            known=row[0] is not None,
            loop=LoopState(int(row[1] or 0), str(row[2] or ""), int(row[3] or 0)),
            cancel_epoch=int(row[4] or 0),
        )
        pos = 5
        for call in self.calls:
            attempts, reason = row[pos], row[pos + 1]
            pos += 2
            if attempts:
                snap.failed[call] = (int(attempts), str(reason or ""))
        for tool in self.prior:
            if row[pos]:
                snap.prior_tools.add(tool)
            pos += 1
        for answer in self.answers:
            if row[pos] is not None:
                snap.answered[answer] = int(row[pos])
            pos += 1
        return snap


@dataclass(frozen=True)
class _Counting:
    """The statements' parameters for counting one call against rate-limit rules: one upsert
    per rule's current window, and now and then, per rule, a prune of that rule's windows
    that ended more than one of its windows ago."""

    counts: list[tuple[int, dict[str, Any]]]
    prune: list[dict[str, Any]]

    @classmethod
    def of(
        cls, tenant_id: str, tool_name: str, rules: Sequence[PolicyRule], now_s: float
    ) -> _Counting:
        counts = [
            (
                rule.id,
                {
                    "rule_id": rule.id,
                    "tenant_id": tenant_id,
                    "tool": tool_name,
                    "window": window_start(now_s, rule.window_s),
                },
            )
            for rule in sorted(rules, key=lambda r: r.id)  # one lock order in every replica
        ]
        prune = []
        if rules and random.random() < PRUNE_PROBABILITY:
            prune = [
                {"rule_id": rule.id, "horizon": int(now_s) - 2 * rule.window_s} for rule in rules
            ]
        return cls(counts, prune)


class SqlGuardrailStore:
    """GuardrailStore over a SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine, *, loop_db: LoopConnection | None = None) -> None:
        """`loop_db`: the event loop's SQLite connection for snapshot_now, best shared with the
        call log's (see shared.db.inline.LoopConnection); by default the store opens its own."""
        self._engine = engine
        self._loop_db = LoopConnection.for_engine(engine) if loop_db is None else loop_db
        self._prepared = PreparedCache(engine.dialect)

    # --- rules ----------------------------------------------------------------------------

    def add_rule(self, rule: PolicyRule) -> PolicyRule:
        now = utcnow()
        with translate_db_errors(), self._engine.begin() as conn:
            rule_id = conn.execute(
                insert(_RULES).returning(_RULES.c.id),
                {
                    "tenant_id": rule.tenant_id,
                    "name": rule.name,
                    "kind": rule.kind,
                    "tool_name": rule.tool_name,
                    "mode": rule.mode,
                    "params": dict(rule.params),
                    "message": rule.message,
                    "enabled": True,
                    "created_by": rule.created_by,
                    "created_at": now,
                    "updated_at": now,
                },
            ).scalar_one()
        return self._get(int(rule_id))

    def _get(self, rule_id: int) -> PolicyRule:
        with translate_db_errors(), self._engine.connect() as conn:
            row = conn.execute(select(_RULES).where(_RULES.c.id == rule_id)).one_or_none()
        if row is None:
            raise NotFound(
                f"no policy rule with id {rule_id}",
                reason="POLICY_RULE_NOT_FOUND",
                metadata={"id": str(rule_id)},
            )
        return rule_from_row(row)

    def list_rules(self, tenant_id: str, include_disabled: bool) -> list[PolicyRule]:
        stmt = select(_RULES).order_by(_RULES.c.id)
        if tenant_id:
            stmt = stmt.where(_RULES.c.tenant_id.in_([tenant_id, "*"]))
        if not include_disabled:
            stmt = stmt.where(_RULES.c.enabled.is_(True))
        with translate_db_errors(), self._engine.connect() as conn:
            return [rule_from_row(r) for r in conn.execute(stmt)]

    def disable_rule(self, rule_id: int) -> PolicyRule:
        with translate_db_errors(), self._engine.begin() as conn:
            conn.execute(
                update(_RULES)
                .where(_RULES.c.id == rule_id)
                .values(enabled=False, updated_at=utcnow())
            )
        return self._get(rule_id)

    # --- conversation state -----------------------------------------------------------------

    def snapshot(
        self,
        tenant_id: str,
        conversation_id: str,
        calls: Sequence[tuple[str, str]],
        prior_tools: Sequence[str],
        answers: Sequence[tuple[str, str, str]] = (),
    ) -> Snapshot:
        """Everything in one statement: the conversation's state row, the attempts of each
        (tool, identity) in `calls`, whether each of `prior_tools` succeeded earlier in the
        conversation, and the log row answering each (tool_use_id, tool, args_hash) of
        `answers`."""
        queries = _snapshot_queries(tenant_id, conversation_id, calls, prior_tools, answers)
        parts = [
            query.parse(self._fetch_one_raw(query.statement, query.params)) for query in queries
        ]
        return _merge(parts)

    def snapshot_now(
        self,
        tenant_id: str,
        conversation_id: str,
        calls: Sequence[tuple[str, str]],
        prior_tools: Sequence[str],
        answers: Sequence[tuple[str, str, str]] = (),
    ) -> Snapshot | None:
        """The snapshot, read at once on the caller's thread (the event loop) when that needs
        no waiting: on a SQLite file, a read of a few rows takes tens of microseconds, less
        than a thread hop. None where it would wait (PostgreSQL, a busy or failing SQLite):
        then the caller reads `snapshot` in a thread."""
        if self._loop_db is None:
            return None
        parts = []
        try:
            connection = self._loop_db.get()
            queries = _snapshot_queries(tenant_id, conversation_id, calls, prior_tools, answers)
            for query in queries:
                row = connection.execute(query.statement, query.params).fetchone()
                parts.append(query.parse(list(row)))
        except sqlite3.Error:
            return None
        return _merge(parts)

    def _fetch_one_raw(self, statement: str, params: dict[str, Any]) -> list[Any]:
        """One row of a `:name`-parameter statement, on the driver's cursor directly: the
        per-call read skips SQLAlchemy's execution machinery (about 0.3 ms of CPU per call
        under load, measured)."""
        if self._engine.dialect.paramstyle == "pyformat":  # psycopg
            statement = _NAMED_PARAM.sub(r"%(\1)s", statement)
        dbapi = self._engine.dialect.loaded_dbapi
        with translate_db_errors(), self._engine.connect() as conn:
            dbapi_conn = conn.connection.driver_connection
            assert dbapi_conn is not None
            try:
                cursor = dbapi_conn.cursor()
                try:
                    cursor.execute(statement, params)
                    row = list(cursor.fetchone())
                finally:
                    cursor.close()
            except dbapi.DataError as exc:
                raise InvalidArgument(
                    f"a value cannot be stored: {exc}"[:300], reason="VALUE_NOT_STORABLE"
                ) from exc
            except dbapi.Error as exc:
                conn.invalidate()
                # A schema not migrated yet (or a database file deleted under us) says so,
                # like every other read's error.
                raise database_error(exc) or Unavailable(
                    f"database unavailable: {exc}", reason="DATABASE_UNAVAILABLE"
                ) from exc
            # The read's transaction ends here, where a server gone since it answered costs the
            # connection and nothing else: left to the pool's reset when the connection is
            # returned, that failure was logged as an error with a traceback ("Exception during
            # reset or similar") whenever PostgreSQL went down between the two.
            try:
                dbapi_conn.rollback()
            except dbapi.Error:
                conn.invalidate()
            return row

    def observation_counts(
        self, tenant_id: str, user_id: str, rule_ids: Sequence[int]
    ) -> dict[int, int]:
        """How often the user violated each rule so far (read only once a rule fired)."""
        unique = list(dict.fromkeys(rule_ids))
        if not unique:
            return {}
        params: dict[str, Any] = {"t": tenant_id, "u": user_id}
        params.update({f"r{i}": rule_id for i, rule_id in enumerate(unique)})
        placeholders = ", ".join(f":r{i}" for i in range(len(unique)))
        statement = text(
            "SELECT rule_id, count FROM observations WHERE tenant_id = :t AND user_id = :u "
            f"AND rule_id IN ({placeholders})"
        )
        with translate_db_errors(), self._engine.connect() as conn:
            return {int(r): int(c) for r, c in conn.execute(statement, params)}

    def count_calls(
        self, tenant_id: str, tool_name: str, rules: Sequence[PolicyRule], now_s: float
    ) -> dict[int, int]:
        """Count one more call against each rate-limit rule's current window, atomically (an
        upsert returning the new count), and return the counts."""
        counting = _Counting.of(tenant_id, tool_name, rules, now_s)
        counts: dict[int, int] = {}
        with translate_db_errors(), self._engine.begin() as conn:
            for rule_id, params in counting.counts:
                counts[rule_id] = int(conn.execute(_COUNT_CALL, params).scalar_one())
            for prune in counting.prune:
                conn.execute(_PRUNE_COUNTERS, prune)
        return counts

    def count_calls_now(
        self, tenant_id: str, tool_name: str, rules: Sequence[PolicyRule], now_s: float
    ) -> dict[int, int] | None:
        """count_calls on the event loop's connection, for a SQLite file: one short write
        transaction that never waits (None when another writer holds the lock, or on any
        failure: then the caller counts in a thread, with the busy timeout). On the same
        connection as the call log's commits, the two never contend inside this process."""
        if self._loop_db is None:
            return None
        counting = _Counting.of(tenant_id, tool_name, rules, now_s)
        counts: dict[int, int] = {}
        try:
            with self._loop_db.transaction() as cursor:
                for rule_id, params in counting.counts:
                    counts[rule_id] = int(cursor.execute(_COUNT_CALL.text, params).fetchone()[0])
                for prune in counting.prune:
                    cursor.execute(_PRUNE_COUNTERS.text, prune)
        except sqlite3.Error:
            return None
        return counts

    def touch_conversation(self, tenant_id: str, conversation_id: str) -> None:
        """Create the conversation's state row if missing (before its first call runs, so a
        Cancel on any replica finds the conversation while that call is in flight)."""
        with translate_db_errors(), self._engine.begin() as conn:
            conn.execute(
                _TOUCH,
                {"tenant_id": tenant_id, "conversation_id": conversation_id, "now": utcnow()},
            )

    def touch_conversation_now(self, tenant_id: str, conversation_id: str) -> bool:
        """touch_conversation on the event loop's connection, for a SQLite file, never
        waiting: False when it did nothing (PostgreSQL, a held lock, a failure)."""
        if self._loop_db is None:
            return False
        touch = self._prepared.get(_TOUCH, many=False)
        params = {"tenant_id": tenant_id, "conversation_id": conversation_id, "now": utcnow()}
        try:
            with self._loop_db.transaction() as cursor:
                touch.execute(cursor, params)
        except sqlite3.Error:
            return False
        return True

    def bump_cancel_epoch(self, tenant_id: str, conversation_id: str) -> int | None:
        """Raise the conversation's cancellation epoch; the new epoch, or None (and nothing
        stored) for a conversation no call was ever dispatched in."""
        with translate_db_errors(), self._engine.begin() as conn:
            epoch = conn.execute(
                _BUMP_EPOCH,
                {"tenant_id": tenant_id, "conversation_id": conversation_id, "now": utcnow()},
            ).scalar_one_or_none()
        return None if epoch is None else int(epoch)

    def cancel_epoch(self, tenant_id: str, conversation_id: str) -> int:
        with translate_db_errors(), self._engine.connect() as conn:
            value = conn.execute(
                _CANCEL_EPOCH, {"tenant_id": tenant_id, "conversation_id": conversation_id}
            ).scalar_one_or_none()
        return int(value or 0)

    def cancel_epochs(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The cancellation epochs of several conversations in one statement (the poller)."""
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}
        params: dict[str, Any] = {}
        conditions = []
        for i, (tenant_id, conversation_id) in enumerate(unique):
            params[f"t{i}"], params[f"c{i}"] = tenant_id, conversation_id
            conditions.append(f"(tenant_id = :t{i} AND conversation_id = :c{i})")
        statement = text(
            "SELECT tenant_id, conversation_id, cancel_epoch FROM conversation_state WHERE "
            + " OR ".join(conditions)
        )
        with translate_db_errors(), self._engine.connect() as conn:
            return {(t, c): int(e) for t, c, e in conn.execute(statement, params)}
