"""The outside world as a test sees it: what a guest asks for, and the sandbox providers' books and faults."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from tests.support.waiting import eventually

# What a guest sends to get the whole booking: search, hold, pay (then the email and the CRM record follow as
# projections of the paid run, delivered by the projector).
BOOKING_TEXT = "Book a room in Lisbon from 2031-12-01 to 2031-12-03"

# The booking run's tools in the order the scripted model calls them, and offered to a model the way the
# runtime's adapter offers them (the scripted model reads only the names).
BOOKING_TOOLS = ["search_hotels", "create_booking", "create_payment"]
# The booking's projections: not the model's tools, delivered after the run by the projector.
PROJECTED_TOOLS = ["send_confirmation_email", "update_crm"]
OFFERED_TOOLS = [
    {"type": "function", "name": n, "parameters": {"type": "object", "properties": {}}} for n in BOOKING_TOOLS
]

# Every effect kind the providers' ledger counts, and what a booking that went right leaves in it: the run's own
# effects when it completes (BOOKED_AND_PAID), and with its projections delivered (CONFIRMED).
EFFECT_KINDS = ("booking", "booking_release", "charge", "refund", "email", "crm_update")
NOTHING = dict.fromkeys(EFFECT_KINDS, 0)
BOOKED_AND_PAID = NOTHING | {"booking": 1, "charge": 1}
CONFIRMED = BOOKED_AND_PAID | {"email": 1, "crm_update": 1}
# The effects a booking makes once each (a release or refund is an undo, counted apart); the projected ones.
EFFECTS = ("booking", "charge", "email", "crm_update")
PROJECTED = ("email", "crm_update")

# The sandbox's operator endpoints (not part of any provider's API).
_LEDGER = "/_ledger"
_FAULTS = "/_faults"
_RESET = "/_reset"
# The audit trail receiver's read (a provider endpoint, but one only the tests and operators read).
_AUDIT = "/audit/records"


class Sandbox:
    """The sandbox providers seen from outside over HTTP: their ledger of effects, and the faults armed on them."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url.rstrip("/")

    async def ledger(self, guest_id: str | None = None) -> dict[str, Any]:
        """`{"entries": [...], "counts": {kind: n}, "replays": {kind: n}}`, for one guest or everyone."""
        params = {"guest_id": guest_id} if guest_id else None
        response = await self.http.get(f"{self.url}{_LEDGER}", params=params)
        response.raise_for_status()
        return dict(response.json())

    async def counts(self, guest_id: str | None = None) -> dict[str, int]:
        return dict((await self.ledger(guest_id))["counts"])

    async def audit_records(self, run_id: str) -> list[dict[str, Any]]:
        """The audit trail's records of one run, in journal position order (each event id once)."""
        response = await self.http.get(f"{self.url}{_AUDIT}", params={"run_id": run_id})
        response.raise_for_status()
        return list(response.json()["records"])

    async def arm(self, target: str, **fault: int) -> dict[str, Any]:
        """Arm a fault on one target (`payments`, `lookups`, `model`, ...); returns every fault now armed."""
        response = await self.http.put(f"{self.url}{_FAULTS}", json={"target": target, **fault})
        assert response.status_code == 200, response.text
        return dict(response.json()["faults"])

    async def faults(self) -> dict[str, Any]:
        response = await self.http.get(f"{self.url}{_FAULTS}")
        response.raise_for_status()
        return dict(response.json()["faults"])

    async def in_flight(self) -> list[str]:
        """The keys whose write the providers are processing right now (they answer 409 in use meanwhile)."""
        response = await self.http.get(f"{self.url}{_FAULTS}")
        response.raise_for_status()
        return list(response.json()["in_flight"])

    async def clear_faults(self) -> None:
        response = await self.http.delete(f"{self.url}{_FAULTS}")
        assert response.status_code == 200, response.text

    async def reset(self) -> None:
        """The providers forget every record and fault."""
        response = await self.http.post(f"{self.url}{_RESET}")
        assert response.status_code == 200, response.text


async def projected(
    counts: Callable[[], Awaitable[dict[str, int]]],
    expected: Mapping[str, int] = CONFIRMED,
    *,
    what: str = "the projector to deliver the confirmation email and the CRM record",
    timeout_s: float = 120.0,
) -> dict[str, int]:
    """The ledger counts once they are `expected`: a run ends paid before its projections (email, CRM) are
    delivered, off its critical path, so a test of what a booking left waits for them. More than expected
    (a second email) never becomes expected: the wait fails, naming the counts it last saw."""
    seen: list[dict[str, int]] = [{}]

    async def reached() -> dict[str, int] | None:
        seen[0] = await counts()
        return seen[0] if seen[0] == dict(expected) else None

    try:
        return await eventually(reached, what=what, timeout_s=timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last counts {seen[0]}, expected {dict(expected)}") from None


def effects_per_run(entries: list[dict[str, Any]], runs: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Ledger effects grouped by run, through `runs` (guest id -> run id: each run here has its own guest).
    Keys name business actions (`hold:<digest>`), not runs, so the guest is what ties an effect to its run;
    a key still written `run_id:step` (a journal from before business keys) names its run itself."""
    out: dict[str, dict[str, int]] = {}
    for entry in entries:
        key = str(entry["key"])
        run_id = key.split(":", 1)[0] if key.startswith("run_") else runs.get(str(entry["guest_id"]), "?")
        kinds = out.setdefault(run_id, {})
        kinds[entry["kind"]] = kinds.get(entry["kind"], 0) + 1
    return out
