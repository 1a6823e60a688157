"""The synthetic turn: a scoped test tenant's non-mutating search end to end, and its published result.

An operator's probe of the whole seam (gateway -> runtime -> model -> executor -> provider and back), recorded
apart from process health: `ops.synthetic` on `<ns>.ops.synthetic.<who>` (OPS stream), and the
`crashsafe_synthetic_*` metrics. Its runs belong to the tenant `synthetic` and the agent `synthetic`, whose tools
are reads only (StayHub's: `search_hotels`; another registry's: those its declared probe names, `domain/probe.py`):
whatever its model asks for, the runtime rejects any other tool before anything is journaled or signed
(`tool_rejected`, `unknown_tool`), so a synthetic run can write nothing.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

import msgspec

# The test tenant every synthetic turn runs as: analytics and the audit leave its runs out.
SYNTHETIC_TENANT = "synthetic"
# The agent it talks to: a read-only search, answered by the deterministic route, never a paid model per probe.
SYNTHETIC_AGENT = "synthetic"
# The guest message's form, which the deterministic route reads back: "synthetic search <city> from <d> to <d>".
SYNTHETIC_PREFIX = "synthetic search"
# A registry's own probe (`domain/probe.py`): "synthetic probe [{"tool": ..., "arguments": {...}}, ...]", the read
# calls its agent `synthetic` makes, read back by the deterministic route.
SYNTHETIC_PROBE_PREFIX = "synthetic probe"
# The model name the `fixed` route answers as (services/runtime/fixed_model.py).
FIXED_MODEL = "synthetic-fixed"
# How long one turn may take before it is called slow (the run is still bounded by its own deadline).
DEFAULT_BUDGET_S = 30.0
# At most one turn per this many seconds on the reconciler's cadence (0: off).
DEFAULT_EVERY_S = 300.0


class SyntheticResult(StrEnum):
    OK = "ok"  # the run completed with the search's answer, within the budget
    SLOW = "slow"  # no answer within the budget (the run may still end later)
    FAILED = (
        "failed"  # an answer, but a wrong one: refused, handed off, the search failed, the gateway down …
    )


class SyntheticTurn(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="ops.synthetic"):
    """One synthetic turn's result, for operators (history beside the metrics)."""

    result: str  # SyntheticResult
    reason: str  # why, in a line: what answered or what did not
    duration_s: float
    budget_s: float
    run_id: str = ""  # empty when no run was accepted
    by: str = ""  # who ran it: "reconciler", "cli"
    at: datetime


synthetic_encoder = msgspec.json.Encoder()
synthetic_decoder = msgspec.json.Decoder(SyntheticTurn)
