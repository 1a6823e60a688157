"""`crashsafe runs export --evidence RUN` and `crashsafe verify --live`: a run's evidence out of a deployment, and
every run of a time range checked against it (issue 34; the offline check is `verify_command`)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from crashsafe.contracts.evidence import bundle_encoder
from crashsafe.deployment import settings_for
from crashsafe.domain import registry as registries
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.operations.run_evidence import gather, public_key_text, walk_checkpoints
from crashsafe.services.operations.run_index import list_runs, parse_since
from crashsafe.services.platform.settings import Settings
from crashsafe.services.records.capability_keys import public_path, read_public_keys
from crashsafe.stack_keys import capability_key_path


def deployment_keys(state_dir: Path, settings: Settings) -> list[Ed25519PublicKey]:
    """The runtime's public keys: CRASHSAFE_CAPABILITY_VERIFY_KEYS, else those of the stack `up` started."""
    paths = list(settings.capability_verify_keys)
    stacked = public_path(capability_key_path(state_dir))  # the stack `crashsafe up` started there
    if not paths and stacked.exists():
        paths = [stacked]
    return read_public_keys(paths)


async def export_evidence_command(state_dir: Path, run_id: str, out: Path | None, ask_providers: bool) -> int:
    settings = settings_for(state_dir)
    registry = registries.load(settings.registry)
    keys = deployment_keys(state_dir, settings)
    async with operator_broker(settings, "crashsafe-evidence") as broker:
        bundle = await gather(
            broker, settings.namespace, registry, settings.registry, run_id, keys, ask_providers
        )
    if bundle is None:
        print(f"crashsafe: no run {run_id} in namespace {settings.namespace.name}", file=sys.stderr)
        return 1
    body = bundle_encoder.encode(bundle)
    if out is None:
        sys.stdout.buffer.write(body + b"\n")
        sys.stdout.flush()
    else:
        out.write_bytes(body + b"\n")
        print(
            f"evidence of run {run_id}: {len(bundle.journal)} events, {len(bundle.checkpoints)} checkpoints,"
            f" {len(bundle.provider_answers)} provider answers, written to {out}",
            file=sys.stderr,
        )
    return 0


async def verify_live_command(
    state_dir: Path, since: str | None, until: str | None, trust: list[Ed25519PublicKey], as_json: bool
) -> int:
    """Check the checkpoint stream whole, then every run started in [since, until) as its bundle would be checked
    (providers not asked: `runs export --evidence` asks them); exit 1 if anything was tampered, 3 if any run is
    unchained or not covered, else 0."""
    from crashsafe.evidence_verify import verify  # the offline check, as `crashsafe verify BUNDLE` runs it

    settings = settings_for(state_dir)
    registry = registries.load(settings.registry)
    keys = trust or deployment_keys(state_dir, settings)
    raw = {kid: base64_raw for kid, base64_raw in (_raw(k) for k in keys)}
    start = parse_since(since) if since else None
    end = parse_since(until) if until else datetime.now(UTC)
    verdicts: dict[str, list[str]] = {}
    async with operator_broker(settings, "crashsafe-verify") as broker:
        walk = await walk_checkpoints(broker, settings.namespace, raw)
        stream_breaks = walk.breaks
        rows, _ = await list_runs(broker, settings.namespace, since=start, limit=0)
        for row in rows:
            if row.started_at >= end:
                continue
            bundle = await gather(
                broker, settings.namespace, registry, settings.registry, row.run_id, keys, False
            )
            if bundle is None:
                continue
            verification = verify(bundle, raw, registry)
            verdicts.setdefault(verification.verdict, []).append(row.run_id)
            if verification.verdict != "verified" and not as_json:
                print(f"{row.run_id}: {verification.verdict}")
                for finding in verification.findings:
                    if finding.status in ("fail", "uncovered"):
                        print(f"  {finding.check} {finding.status}: {finding.message}")
    counts = {verdict: len(runs) for verdict, runs in sorted(verdicts.items())}
    if as_json:
        print(json.dumps({"checkpoint_stream": stream_breaks, "runs": verdicts, "counts": counts}))
    else:
        for problem in stream_breaks:
            print(f"checkpoint stream: {problem}")
        shown = ", ".join(f"{n} {verdict}" for verdict, n in counts.items()) or "no runs"
        print(f"{sum(counts.values())} runs checked: {shown}; checkpoint stream: {len(stream_breaks)} breaks")
    if stream_breaks or verdicts.get("tampered"):
        return 1
    return 3 if verdicts.get("incomplete") or verdicts.get("unchained") else 0


def _raw(key: Ed25519PublicKey) -> tuple[str, bytes]:
    return public_key_text(key)[0], key.public_bytes_raw()
