"""A short chaos soak as a real test: every process `crashsafe up` lists is SIGKILLed in turn under booking load,
nats-server included, and only the stack's own supervisor brings them back."""

from __future__ import annotations

from bench.soak import soak

# The sandbox keeps its books in SQLite under the stack's data dir, as a real provider remembers every effect and
# key: it is killed like everything else.
KILL_SANDBOX = True


async def test_chaos_soak_short(tmp_path) -> None:
    report = await soak(
        tmp_path,
        runs=40,
        duration_s=15.0,
        kill_every_s=(0.5, 1.5),
        seed=7,
        drain_timeout_s=180.0,
        kill_sandbox=KILL_SANDBOX,
    )
    print("\n".join(report.lines()))
    assert report.runs_accepted == report.runs_submitted == 40
    assert report.killed_sandbox is KILL_SANDBOX and report.killed_nats
    everyone = {"gateway", "runtime", "executor-booking", "executor-payment", "executor-notify", "reconciler"}
    everyone |= {"executor-memory"}  # guest memory (remember_preference)
    everyone |= {"nats-server"} | ({"sandbox"} if KILL_SANDBOX else set())
    everyone |= {"projector"} & set(report.restarts)  # the projector, in every stack that runs one
    assert set(report.kills) == everyone, f"every listed process is killed at least once: {report.kills}"
    assert all(report.restarts[name] >= 1 for name in report.kills), report.restarts
    assert report.lost == 0, report.findings
    assert report.duplicate_effects == 0, report.findings
    assert report.orphan_charges == 0, report.findings
    assert report.charges_on_released_rooms == 0, report.findings
    assert report.audit_findings == 0, report.findings
    # Each booking that stayed paid: one confirmation email and one CRM record, none given up.
    assert report.projections_missing == 0, report.findings
    assert report.projections_duplicated == 0, report.findings
    assert report.projections_dead == 0, report.findings
    assert report.completed + report.handed_off == 40
