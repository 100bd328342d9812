"""Cost accounting of one tool call: the CostAccount a handler's LLM calls and nested tool
calls charge, and the budgets it enforces.

Leaves (an LLM call, a paid tool's own charge) are recorded once, where they happen: on their
span as `gen_ai.usage.cost.amount` and as a `usage_log` row. A call's total — its leaves plus
the totals of the tools it composed — is its rollup: returned in ToolResult.cost_usd and put
on its execute_tool span under a separate attribute, so nothing is counted twice.

Budgets: `limit` is the most the call (with everything it composes) may spend, counting what
the enclosing call had already spent (`spent_before`). A call that starts over budget is
refused; a handler whose spending crosses the limit mid-way is stopped at its next charge
(BudgetExceeded, which the contract boundary turns into Err(err_kind="budget_exceeded"))."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


class BudgetExceeded(Exception):
    """Raised into a handler when its call's budget is spent."""

    err_kind = "budget_exceeded"

    def __init__(self, limit: float, spent: float, what: str = "") -> None:
        self.limit = limit
        self.spent = spent
        doing = f" ({what})" if what else ""
        super().__init__(
            f"cost budget exceeded{doing}: spent ${spent:.6f} of a ${limit:.6f} limit; "
            "narrow the request or ask for a larger budget"
        )


@dataclass
class CostAccount:
    """What one tool call has spent. Thread-safe: sync handlers run in worker threads."""

    limit: float | None = None
    spent_before: float = 0.0
    leaves: float = 0.0
    nested: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def total(self) -> float:
        return self.leaves + self.nested

    @property
    def spent(self) -> float:
        """Spent against the limit: the enclosing call's spending plus this call's."""
        return self.spent_before + self.total

    def remaining(self) -> float | None:
        return None if self.limit is None else max(0.0, self.limit - self.spent)

    def exhausted(self) -> bool:
        return self.limit is not None and self.spent >= self.limit

    def check(self, what: str = "") -> None:
        """Refuse to start more work when the budget is already spent."""
        if self.limit is not None and self.spent >= self.limit:
            raise BudgetExceeded(self.limit, self.spent, what)

    def charge_leaf(self, amount: float, what: str = "") -> None:
        """Record a leaf cost; raises BudgetExceeded when it takes the call over its limit."""
        with self._lock:
            self.leaves += max(0.0, amount)
        if self.limit is not None and self.spent > self.limit:
            raise BudgetExceeded(self.limit, self.spent, what)

    def charge_nested(self, amount: float, what: str = "") -> None:
        """Roll a composed call's total into this call's; raises like charge_leaf."""
        with self._lock:
            self.nested += max(0.0, amount)
        if self.limit is not None and self.spent > self.limit:
            raise BudgetExceeded(self.limit, self.spent, what)
