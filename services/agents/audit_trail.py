"""The audit trail as a projection: every event of every run, delivered to the audit log deduplicated by event id."""

from __future__ import annotations

from typing import Any

from crashsafe.contracts.projections import AUDIT_TRAIL_TOOL, RetryPolicy
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.registry import HttpOperation, HttpRequest, Tool


def _records(args: dict[str, Any]) -> HttpRequest:
    # The projector builds `records` from the run's journal at delivery time (crashsafe.contracts.run_events.event_id per
    # event); the task itself carries only how far (`upto`): a journal may be megabytes.
    return HttpRequest("POST", "/audit/records", json={"records": args["records"]})


RECORD_AUDIT = Tool(
    ToolContract(
        name=AUDIT_TRAIL_TOOL,
        family="audit",
        effect=Effect.WRITE,
        timeout_s=10.0,
        retry=RetryRule.KEYED,
        max_attempts=5,
        # Keyed by the task (`audit:<run_id>:<upto>`), yet what the receiver deduplicates is each record's event
        # id: re-posting any range of a journal is harmless, so it needs no lookup by key.
        key_rule=KeyRule.RUN_STEP,
        description="Append a run's events to the audit log (the projector's, never the model's).",
    ),
    HttpOperation(request=_records, lookup_path=None, ref_field=None, requires=("records",)),
    # The audit log keeps no record per task key to check it by (its records are per event).
    audited=False,
    projection=RetryPolicy(),
)
