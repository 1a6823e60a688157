"""The coworking space's booking API, as the example's provider: its own process, in memory, speaking the
conventions crashsafe's executor reads (docs/adopting.md, docs/failure-modes.md):

- every write takes an `Idempotency-Key`: the same key again is the same answer (`Idempotent-Replayed: true`),
  the same key with another body a 409 `idempotency_conflict`, and while the first request is still in progress
  a 409 `idempotency_key_in_use`;
- each write can be asked about by key (`GET …/by-key/{key}`): the record, or a 404 `key_not_found`;
- refusals are typed, `{"error": {"code": …, "message": …}}`; a declined card is a record whose status says so;
- each account (its `Provider-Account` header) has its own keys and records, and each record names its account:
  a pass or a release finds only its own account's reservation. The desks are the space's, one for all accounts.

Test hooks, as a sandbox would have: `PUT /_faults {"late_ms": N}` answers the next reservation N ms after it was
committed; `PUT /members/{id}/card` sets a member's card on file (4000000000000002 declines); `GET /_ledger` lists
what was done (`?account=A`: in account A alone). `python -m crashsafe.examples.cowork.desk_provider --port 0` prints
where it listens."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

ZONES = {
    "quiet": (3, 2_500),
    "open": (5, 1_500),
    "office": (1, 9_000),
}  # zone: (desks, day-pass price in cents)
CURRENCY = "EUR"
DECLINED_CARD = "4000000000000002"  # the card networks' test card for "do not honour"
DEFAULT_CARD = "4242424242424242"


@dataclass
class Books:
    """Everything the provider holds. Records are plain dicts: they are its JSON answers too."""

    reservations: dict[str, dict[str, Any]] = field(default_factory=dict)
    passes: dict[str, dict[str, Any]] = field(default_factory=dict)
    releases: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (account, kind, key) -> (the request's fingerprint, the record it made)
    keys: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = field(default_factory=dict)
    in_flight: set[tuple[str, str, str]] = field(default_factory=set)
    cards: dict[str, str] = field(default_factory=dict)
    late_ms: int = 0  # the next reservation's answer waits this long after its commit


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def _taken(books: Books, zone: str, day: str) -> int:
    return sum(
        1
        for r in books.reservations.values()
        if (r["zone"], r["day"], r["status"]) == (zone, day, "reserved")
    )


def _reservation(books: Books, reservation_id: str, account: str) -> dict[str, Any]:
    """The account's reservation; another account's is as unknown here as one never made."""
    reservation = books.reservations.get(reservation_id)
    if reservation is None or reservation["account"] != account:
        raise Refused(404, "reservation_not_found", f"no reservation {reservation_id}")
    return reservation


def reserve(books: Books, body: dict[str, Any], account: str = "") -> dict[str, Any]:
    zone, day, member = str(body.get("zone", "")), str(body.get("day", "")), str(body.get("member_id", ""))
    if zone not in ZONES or not day or not member:
        raise Refused(422, "invalid_request", f"member_id, day and a zone of {sorted(ZONES)} are required")
    desks, price = ZONES[zone]
    if _taken(books, zone, day) >= desks:
        raise Refused(409, "zone_full", f"no free desk in {zone} on {day}")
    reservation_id = f"res_{len(books.reservations) + 1:04d}"
    desk = f"{zone}-{_taken(books, zone, day) + 1}"
    record: dict[str, Any] = {
        "reservation_id": reservation_id,
        "member_id": member,
        "zone": zone,
        "desk_id": desk,
        "day": day,
    }
    record |= {"price_cents": price, "currency": CURRENCY, "status": "reserved", "account": account}
    books.reservations[reservation_id] = record
    return record


def charge(books: Books, body: dict[str, Any], account: str = "") -> dict[str, Any]:
    reservation = _reservation(books, str(body.get("reservation_id", "")), account)
    if reservation["status"] != "reserved":
        raise Refused(409, "reservation_released", f"{reservation['reservation_id']} was released")
    if (body.get("amount_cents"), body.get("currency")) != (
        reservation["price_cents"],
        reservation["currency"],
    ):
        raise Refused(422, "amount_mismatch", "the amount is not the reservation's price")
    member = reservation["member_id"]
    declined = books.cards.get(member, DEFAULT_CARD) == DECLINED_CARD
    pass_id = f"pass_{len(books.passes) + 1:04d}"
    record: dict[str, Any] = {
        "pass_id": pass_id,
        "reservation_id": reservation["reservation_id"],
        "member_id": member,
    }
    record |= {"amount_cents": reservation["price_cents"], "currency": CURRENCY}
    record |= {"status": "declined" if declined else "paid", "account": account}
    books.passes[pass_id] = record
    return record


def release(books: Books, reservation_id: str, account: str = "") -> dict[str, Any]:
    reservation = _reservation(books, reservation_id, account)
    reservation["status"] = "released"
    record = {"reservation_id": reservation_id, "status": "released", "account": account}
    books.releases[reservation_id] = record
    return record


def app(books: Books | None = None) -> web.Application:
    books = books or Books()

    async def write(request: web.Request, kind: str, act: Any) -> web.Response:
        key = request.headers.get("Idempotency-Key", "")
        if not key:
            return _error(400, "missing_idempotency_key", "every write needs an Idempotency-Key")
        raw = await request.read()
        account = _account(request)
        slot = (account, kind, key)
        fingerprint = hashlib.sha256(raw + request.path.encode()).hexdigest()
        if slot in books.in_flight:
            return _error(409, "idempotency_key_in_use", "a request with this key is still in progress")
        if slot in books.keys:
            seen, record = books.keys[slot]
            if seen != fingerprint:
                return _error(409, "idempotency_conflict", "this key was used with another request")
            return _answer(record, replayed=True)
        body = json.loads(raw or b"{}")
        books.in_flight.add(slot)
        try:
            record = act(body, account)
            books.keys[slot] = (fingerprint, record)
            if kind == "reservation" and books.late_ms:
                late, books.late_ms = books.late_ms, 0
                await asyncio.sleep(late / 1000)  # committed; the caller waits (or dies waiting)
            return _answer(record, replayed=False)
        except Refused as exc:
            return _error(exc.status, exc.code, exc.message)
        finally:
            books.in_flight.discard(slot)

    def by_key(kind: str) -> Any:
        async def lookup(request: web.Request) -> web.Response:
            slot = (_account(request), kind, request.match_info["key"])
            if slot not in books.keys:
                return _error(404, "key_not_found", f"no {kind} was made with this key")
            return web.json_response(books.keys[slot][1])

        return lookup

    async def desks(request: web.Request) -> web.Response:
        day, only = request.query.get("day", ""), request.query.get("zone", "")
        zones = [
            {"zone": z, "free": n - _taken(books, z, day), "price_cents": price, "currency": CURRENCY}
            for z, (n, price) in ZONES.items()
            if not only or z == only
        ]
        return web.json_response({"day": day, "zones": zones})

    async def card(request: web.Request) -> web.Response:
        books.cards[request.match_info["member"]] = str((await request.json())["card"])
        return web.json_response({"ok": True})

    async def faults(request: web.Request) -> web.Response:
        books.late_ms = int((await request.json()).get("late_ms", 0))
        return web.json_response({"late_ms": books.late_ms})

    async def ledger(request: web.Request) -> web.Response:
        member, account = request.query.get("member_id"), request.query.get("account")
        listed = {
            name: [
                r
                for r in records.values()
                if (member is None or _member(books, r) == member) and account in (None, r["account"])
            ]
            for name, records in (
                ("reservations", books.reservations),
                ("passes", books.passes),
                ("releases", books.releases),
            )
        }
        return web.json_response(listed)

    async def reservations(request: web.Request) -> web.Response:
        return await write(request, "reservation", lambda body, account: reserve(books, body, account))

    async def releases(request: web.Request) -> web.Response:
        return await write(
            request, "release", lambda _, account: release(books, request.match_info["rid"], account)
        )

    async def passes(request: web.Request) -> web.Response:
        return await write(request, "pass", lambda body, account: charge(books, body, account))

    application = web.Application()
    application.router.add_get("/desks", desks)
    application.router.add_post("/reservations", reservations)
    application.router.add_get("/reservations/by-key/{key}", by_key("reservation"))
    application.router.add_post("/reservations/{rid}/release", releases)
    application.router.add_get("/releases/by-key/{key}", by_key("release"))
    application.router.add_post("/passes", passes)
    application.router.add_get("/passes/by-key/{key}", by_key("pass"))
    application.router.add_put("/members/{member}/card", card)
    application.router.add_put("/_faults", faults)
    application.router.add_get("/_ledger", ledger)
    return application


def _answer(record: dict[str, Any], *, replayed: bool) -> web.Response:
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    if record.get("status") == "declined":
        error = {"code": "card_declined", "message": "the card was declined", "pass_id": record["pass_id"]}
        return web.json_response({"error": error}, status=402, headers=headers)
    return web.json_response(record, status=200 if replayed else 201, headers=headers)


def _account(request: web.Request) -> str:
    """The account a request acts in: its `Provider-Account` header ("": the default account)."""
    return request.headers.get("Provider-Account", "")


def _member(books: Books, record: dict[str, Any]) -> str:
    if "member_id" in record:
        return str(record["member_id"])
    return str(books.reservations.get(record["reservation_id"], {}).get("member_id", ""))


async def serve(host: str = "127.0.0.1", port: int = 0) -> None:
    runner = web.AppRunner(app(), access_log=None)
    await runner.setup()
    sock = socket.create_server((host, port))  # bound here, so the port is known before anyone asks
    try:
        await web.SockSite(runner, sock).start()
        print(f"desk provider listening on http://{host}:{sock.getsockname()[1]}", flush=True)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m crashsafe.examples.cowork.desk_provider")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port, printed on start")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port))
