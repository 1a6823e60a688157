"""A short chaos soak as a real test: random SIGKILLs of every service and nats-server under booking load."""

from __future__ import annotations

from bench.soak import soak


async def test_chaos_soak_short(tmp_path) -> None:
    report = await soak(
        tmp_path, runs=40, duration_s=15.0, kill_every_s=(1.0, 3.0), seed=7, drain_timeout_s=180.0
    )
    print("\n".join(report.lines()))
    assert report.runs_accepted == report.runs_submitted == 40
    assert sum(report.kills.values()) >= 4, report.kills
    assert report.lost == 0, report.findings
    assert report.duplicate_effects == 0, report.findings
    assert report.orphan_charges == 0, report.findings
    assert report.audit_findings == 0, report.findings
    assert report.completed + report.handed_off == 40
