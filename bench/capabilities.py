"""What a run-scoped capability costs: µs to sign one (the runtime, per published request) and to verify one
(the executor, per delivery, including recomputing the input hash), on a booking-sized payment request."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from crashsafe.contracts.capabilities import GRACE_S, CapabilityIssuer, CapabilityOrigin, CapabilityVerifier
from crashsafe.contracts.keys import action_key, tool_input_hash
from crashsafe.contracts.tool_messages import ActionRequest, action_request_decoder, tool_encoder


def _request() -> ActionRequest:
    run_id = "run_94cb296d1a30794270b8b64f"
    args = {"booking_id": "bk_1", "guest_id": "guest-1", "amount_cents": 24000, "currency": "EUR"}
    now = datetime.now(UTC)
    return ActionRequest(
        run_id=run_id,
        step_no=6,
        tool="create_payment",
        family="payment",
        args=args,
        key=action_key(run_id, 6),
        input_hash=tool_input_hash("create_payment", args),
        timeout_s=10.0,
        deadline_at=now + timedelta(seconds=10),
        requested_at=now,
    )


def _per_call_us(call: Callable[[], object], n: int, rounds: int) -> tuple[float, float]:
    """Median and best of `rounds` rounds of `n` calls, in µs per call."""
    results = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            call()
        results.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(results), min(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=5000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    key = Ed25519PrivateKey.generate()
    issuer = CapabilityIssuer(key)
    verifier = CapabilityVerifier([key.public_key(), Ed25519PrivateKey.generate().public_key()], ())
    request = _request()
    expires = request.deadline_at + timedelta(seconds=GRACE_S)
    signed = issuer.grant(request, CapabilityOrigin.PLAN, expires)
    wire = tool_encoder.encode(signed)
    now = datetime.now(UTC)
    assert verifier.check(signed, now) is None

    rows: dict[str, Callable[[], object]] = {
        "sign (runtime: grant, per request published)": lambda: issuer.grant(
            request, CapabilityOrigin.PLAN, expires
        ),
        "verify (executor: check, per delivery)": lambda: verifier.check(signed, now),
        "decode + verify (executor, from the wire)": lambda: verifier.check(
            action_request_decoder.decode(wire), now
        ),
        "baseline: decode the request alone": lambda: action_request_decoder.decode(wire),
    }
    print(
        f"capability: {len(tool_encoder.encode(signed.capability))} bytes on the wire; request {len(wire)} bytes"
    )
    for name, fn in rows.items():
        median, best = _per_call_us(fn, args.n, args.rounds)
        print(f"{name:<48} {median:7.1f} µs median   {best:7.1f} µs best")


if __name__ == "__main__":
    main()
