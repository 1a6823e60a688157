"""Clients and tenants at the gateway, over real HTTP on a real stack: who may call, what each may see, and the
quotas. (The pure rules: tests/unit/test_gateway_access.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashsafe.contracts.active import active_decoder
from crashsafe.contracts.clients import Scope, format_key
from crashsafe.contracts.inbound import MAX_BODY_BYTES
from crashsafe.contracts.keys import run_id_for
from crashsafe.contracts.streams import active_spec
from crashsafe.natsd import NatsServer, free_port
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.client_keys import ClientKeys
from crashsafe.services.records.session_lane_records import SessionRecords
from crashsafe.stack_keys import STACK_TENANT
from tests.support.stack import StackClient, auth_header, cli_env, crashsafe, guest_event, open_stack
from tests.support.waiting import eventually
from tests.support.world import BOOKING_TEXT

HELLO = "hello"  # a run that asks the scripted model once and completes: no executors needed
# Limits of this module's stack: low enough to reach in a test, and per key/guest/session/run so tests stay apart.
LIMITS = {
    "CRASHSAFE_RATE_PER_CLIENT": "40",  # burst 80
    "CRASHSAFE_RATE_PER_GUEST": "4",  # burst 8
    "CRASHSAFE_RECONCILE_PER_MINUTE": "6",  # burst 3
    "CRASHSAFE_ACTIVE_RUNS_PER_GUEST": "3",
}


@pytest.fixture(scope="module")
async def world(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    async with open_stack(
        tmp_path_factory.mktemp("trust"),
        nats_url=nats_server.url,
        namespace=f"k{uuid.uuid4().hex[:10]}",
        executors=(),
        reconciler=False,
        env=LIMITS,
    ) as client:
        yield client


async def new_key(broker: Broker, world: StackClient, tenant: str, *scopes: Scope) -> str:
    """A key minted the way `crashsafe keys create` mints one (the CLI itself is tested below)."""
    keys = ClientKeys(broker, world.ns)
    return (await keys.create(tenant, list(scopes), name="test")).key


def gateway(world: StackClient, key: str | None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=world.stack.gateway_url, timeout=20.0, headers=auth_header(key) if key else None
    )


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and set(response.json()) == {"error"}
    return dict(error)


def hello(event_id: str | None = None, **fields: Any) -> dict[str, Any]:
    return guest_event(event_id, text=HELLO, guest_id=f"g-{uuid.uuid4().hex[:8]}", **fields)


# Who may call -------------------------------------------------------------------------------------------------


async def test_an_anonymous_caller_gets_401_on_every_endpoint_but_the_probes(world: StackClient) -> None:
    run_id = run_id_for(STACK_TENANT, "evt-anything")
    async with gateway(world, None) as anonymous:
        for method, path in [
            ("POST", "/v1/events"),
            ("GET", f"/v1/runs/{run_id}"),
            ("GET", f"/v1/runs/{run_id}/events"),
            ("POST", f"/v1/runs/{run_id}/reconcile"),
        ]:
            response = await anonymous.request(method, path, json=hello() if method == "POST" else None)
            assert assert_error(response, 401, "unauthenticated")["details"] == {"reason": "missing"}
        assert (await anonymous.get("/healthz")).status_code == 200
        assert (await anonymous.get("/readyz")).status_code == 200
        for schema in ("/schema", "/schema/openapi.json"):  # no description of the API for anyone who asks
            assert (await anonymous.get(schema)).status_code == 404


@pytest.mark.parametrize(
    ("authorization", "reason"),
    [
        pytest.param("Bearer not-a-key", "malformed", id="malformed"),
        pytest.param(f"Basic {format_key('0' * 16, 's' * 43)}", "malformed", id="other-scheme"),
        pytest.param(
            f"Bearer {format_key(secrets.token_hex(8), secrets.token_urlsafe(32))}", "invalid", id="unknown"
        ),
    ],
)
async def test_a_key_that_proves_nothing_is_401_and_publishes_nothing(
    world: StackClient, authorization: str, reason: str
) -> None:
    sent = hello()
    async with gateway(world, None) as http:
        response = await http.post("/v1/events", json=sent, headers={"authorization": authorization})
    error = assert_error(response, 401, "unauthenticated")
    assert error["details"] == {"reason": reason}
    assert authorization.split()[-1] not in response.text  # the key is never echoed
    assert await world.summary(run_id_for(STACK_TENANT, sent["event_id"])) is None


async def test_the_right_key_id_with_a_wrong_secret_is_the_same_401_as_an_unknown_key(
    world: StackClient, broker: Broker
) -> None:
    key = await new_key(broker, world, "acme", Scope.EVENTS_WRITE)
    forged = key[: -len(key.split("_", 2)[2])] + secrets.token_urlsafe(32)
    async with gateway(world, forged) as http:
        error = assert_error(await http.post("/v1/events", json=hello()), 401, "unauthenticated")
    assert error["details"] == {"reason": "invalid"}


async def test_keys_made_listed_and_revoked_with_the_cli_and_the_very_next_request_is_401(
    world: StackClient,
) -> None:
    env = cli_env(world.stack, sandbox=False)
    made = await crashsafe(
        "keys", "create", "--tenant", "initech", "--scope", "events:write", "--scope", "runs:read",
        "--name", "booking-frontend", env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("csk_") and len(made.stdout.splitlines()) == 1  # the key alone on stdout, once
    key_id, secret = key.split("_", 2)[1:]
    listed = await crashsafe("keys", "list", env=env)
    assert listed.returncode == 0 and key_id in listed.stdout and "initech" in listed.stdout
    assert secret not in listed.stdout and "events:write,runs:read" in listed.stdout
    async with gateway(world, key) as http:
        accepted = await http.post("/v1/events", json=hello())
        assert accepted.status_code == 202, accepted.text
        revoked = await crashsafe("keys", "revoke", key_id, env=env)
        assert revoked.returncode == 0, revoked.stderr
        error = assert_error(await http.post("/v1/events", json=hello()), 401, "unauthenticated")
        assert error["details"] == {"reason": "revoked"}
        assert_error(await http.get(f"/v1/runs/{accepted.json()['run_id']}"), 401, "unauthenticated")
    listed = await crashsafe("keys", "list", env=env)
    assert f"{key_id}  tenant initech" in listed.stdout and "revoked" in listed.stdout
    assert (await crashsafe("keys", "revoke", "f" * 16, env=env)).returncode == 1


async def test_a_revocation_holds_on_every_gateway_replica_from_its_next_request(
    world: StackClient, broker: Broker, tmp_path: Path
) -> None:
    """A second gateway process on the same namespace, as a second pod behind the load balancer."""
    port = free_port()
    env = {
        **os.environ,
        **cli_env(world.stack, sandbox=False),
        "CRASHSAFE_GATEWAY_PORT": str(port),
        "CRASHSAFE_WORKER_ID": "gateway-replica",
    }
    with open(tmp_path / "gateway-replica.log", "wb") as log:
        replica = subprocess.Popen(
            [sys.executable, "-m", "crashsafe.cli", "serve", "gateway"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    key = await new_key(broker, world, "acme", Scope.RUNS_READ)
    missing = run_id_for("acme", "nothing-here")
    try:
        async with (
            gateway(world, key) as first,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=auth_header(key)) as second,
        ):

            async def up() -> bool:
                try:
                    return (await second.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(up, what="the second gateway replica to be ready", timeout_s=30)
            for http in (first, second):
                assert (await http.get(f"/v1/runs/{missing}")).status_code == 404  # known, not found
            revoked = await crashsafe(
                "keys", "revoke", key.split("_")[1], env=cli_env(world.stack, sandbox=False)
            )
            assert revoked.returncode == 0, revoked.stderr
            for http in (first, second):
                error = assert_error(await http.get(f"/v1/runs/{missing}"), 401, "unauthenticated")
                assert error["details"] == {"reason": "revoked"}
    finally:
        replica.terminate()
        replica.wait(timeout=10)


async def test_two_keys_of_one_tenant_sending_the_same_event_land_on_one_run(
    world: StackClient, broker: Broker
) -> None:
    """The run is the tenant's event, not the key's: a client that rotates its key, or two services of one tenant
    relaying one event, get one run (the second a duplicate); a key of another tenant gets its own run."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    one = await new_key(broker, world, tenant, Scope.EVENTS_WRITE, Scope.RUNS_READ)
    two = await new_key(broker, world, tenant, Scope.EVENTS_WRITE, Scope.RUNS_READ)
    stranger = await new_key(broker, world, f"t-{uuid.uuid4().hex[:8]}", Scope.EVENTS_WRITE)
    sent = hello(f"evt-{uuid.uuid4().hex[:8]}")
    async with gateway(world, one) as a, gateway(world, two) as b, gateway(world, stranger) as c:
        first = await a.post("/v1/events", json=sent)
        second = await b.post("/v1/events", json=sent)
        assert first.status_code == second.status_code == 202, (first.text, second.text)
        assert first.json() == {"run_id": run_id_for(tenant, sent["event_id"]), "duplicate": False}
        assert second.json() == {"run_id": first.json()["run_id"], "duplicate": True}
        # At once from both keys too: still the one run, every answer a duplicate.
        burst = await asyncio.gather(*(k.post("/v1/events", json=sent) for k in (a, b, a, b)))
        assert {(r.status_code, r.json()["run_id"], r.json()["duplicate"]) for r in burst} == {
            (202, first.json()["run_id"], True)
        }
        other = await c.post("/v1/events", json=sent)
        assert other.status_code == 202 and other.json()["run_id"] != first.json()["run_id"]
        run_id = first.json()["run_id"]
        await eventually(
            lambda: _summary(b, run_id, "completed"), what=f"run {run_id} to complete", timeout_s=30
        )
    assert [e["type"] for e in await world.events(run_id)].count("run.started") == 1


async def test_a_missing_scope_is_403_naming_it(world: StackClient, broker: Broker) -> None:
    writer = await new_key(broker, world, "acme", Scope.EVENTS_WRITE)
    reader = await new_key(broker, world, "acme", Scope.RUNS_READ)
    async with gateway(world, writer) as w, gateway(world, reader) as r:
        run_id = (await w.post("/v1/events", json=hello())).json()["run_id"]
        assert (
            assert_error(await w.get(f"/v1/runs/{run_id}"), 403, "forbidden")["details"]["scope"]
            == "runs:read"
        )
        refused = await r.post("/v1/events", json=hello())
        assert assert_error(refused, 403, "forbidden")["details"]["scope"] == "events:write"
        refused = await r.post(f"/v1/runs/{run_id}/reconcile")
        assert assert_error(refused, 403, "forbidden")["details"]["scope"] == "runs:operate"
        summary = await eventually(
            lambda: _summary(r, run_id, "completed"), what=f"run {run_id} to complete", timeout_s=30
        )
        assert summary["run_id"] == run_id


async def _summary(http: httpx.AsyncClient, run_id: str, status: str) -> dict[str, Any] | None:
    response = await http.get(f"/v1/runs/{run_id}")
    return (
        dict(response.json()) if response.status_code == 200 and response.json()["status"] == status else None
    )


# Tenants ------------------------------------------------------------------------------------------------------


async def test_another_tenants_run_is_404_with_the_very_body_of_a_run_that_does_not_exist(
    world: StackClient, broker: Broker
) -> None:
    acme = await new_key(broker, world, "acme", Scope.EVENTS_WRITE, Scope.RUNS_READ)
    globex = await new_key(broker, world, "globex", Scope.RUNS_READ, Scope.RUNS_OPERATE)
    async with gateway(world, acme) as a, gateway(world, globex) as g:
        run_id = (await a.post("/v1/events", json=hello())).json()["run_id"]
        await eventually(
            lambda: _summary(a, run_id, "completed"), what="the acme run to complete", timeout_s=30
        )
        missing = run_id_for("globex", f"never-{uuid.uuid4().hex}")
        for template in ("/v1/runs/{}", "/v1/runs/{}/events"):
            theirs, nothing = await g.get(template.format(run_id)), await g.get(template.format(missing))
            assert_error(theirs, 404, "run_not_found")
            assert theirs.text == nothing.text.replace(missing, run_id)
            assert dict(theirs.headers).keys() == dict(nothing.headers).keys()
        theirs = await g.post(f"/v1/runs/{run_id}/reconcile")
        nothing = await g.post(f"/v1/runs/{missing}/reconcile")
        assert_error(theirs, 404, "run_not_found")
        assert theirs.text == nothing.text.replace(missing, run_id)
    # An admin key reads every tenant's runs.
    assert (await world.summary(run_id)) is not None


async def test_one_event_id_in_two_tenants_is_two_runs_each_seen_only_by_its_own(
    world: StackClient, broker: Broker
) -> None:
    acme = await new_key(broker, world, "acme", Scope.EVENTS_WRITE, Scope.RUNS_READ)
    globex = await new_key(broker, world, "globex", Scope.EVENTS_WRITE, Scope.RUNS_READ)
    sent = hello()
    async with gateway(world, acme) as a, gateway(world, globex) as g:
        first, second = await a.post("/v1/events", json=sent), await g.post("/v1/events", json=sent)
        assert (first.status_code, second.status_code) == (202, 202)
        assert first.json() == {"run_id": run_id_for("acme", sent["event_id"]), "duplicate": False}
        assert second.json() == {"run_id": run_id_for("globex", sent["event_id"]), "duplicate": False}
        for own, other, run_id, tenant in (
            (a, g, first.json()["run_id"], "acme"),
            (g, a, second.json()["run_id"], "globex"),
        ):
            await eventually(
                lambda own=own, run_id=run_id: _summary(own, run_id, "completed"),
                what=f"{run_id} to complete",
                timeout_s=30,
            )
            started = (await own.get(f"/v1/runs/{run_id}/events")).json()["events"][0]
            assert (started["type"], started["tenant"], started["event_id"]) == (
                "run.started",
                tenant,
                sent["event_id"],
            )
            assert (await other.get(f"/v1/runs/{run_id}")).status_code == 404


async def test_a_proxy_adding_a_fresh_idempotency_key_per_retry_makes_one_run(
    world: StackClient, broker: Broker
) -> None:
    key = await new_key(broker, world, "acme", Scope.EVENTS_WRITE, Scope.RUNS_READ)
    sent = hello()
    async with gateway(world, key) as http:
        answers = [
            (await http.post("/v1/events", json=sent, headers={"Idempotency-Key": uuid.uuid4().hex})).json()
            for _ in range(3)
        ]
        run_id = run_id_for("acme", sent["event_id"])
        assert [a["run_id"] for a in answers] == [run_id] * 3 and [a["duplicate"] for a in answers] == [
            False,
            True,
            True,
        ]
        await eventually(
            lambda: _summary(http, run_id, "completed"), what="the run to complete", timeout_s=30
        )
        events = (await http.get(f"/v1/runs/{run_id}/events")).json()["events"]
        assert [e["type"] for e in events].count("run.started") == 1


# Quotas -------------------------------------------------------------------------------------------------------


async def test_a_client_over_its_rate_gets_429_with_retry_after(world: StackClient, broker: Broker) -> None:
    key = await new_key(broker, world, "acme", Scope.RUNS_READ)
    missing = run_id_for("acme", "nothing")
    async with gateway(world, key) as http:
        # 240 at once: past the burst of 80 even if the requests take 4 s to be served (40 a second refill).
        answers = await asyncio.gather(*(http.get(f"/v1/runs/{missing}") for _ in range(240)))
    statuses = [a.status_code for a in answers]
    assert set(statuses) == {404, 429} and statuses.count(404) >= 80  # the burst, then refused
    limited = next(a for a in answers if a.status_code == 429)
    error = assert_error(limited, 429, "rate_limited")
    assert error["details"]["limit"] == "client" and int(limited.headers["retry-after"]) >= 1


async def test_a_guest_over_its_rate_gets_429_with_retry_after(world: StackClient) -> None:
    """Every request counts, a retry of the same event too (that one would not count against the active cap)."""
    sent = hello()
    answers = [await world.gateway.post("/v1/events", json=sent) for _ in range(12)]
    statuses = [a.status_code for a in answers]
    assert statuses[:8] == [202] * 8 and 429 in statuses[8:], statuses
    limited = next(a for a in answers if a.status_code == 429)
    assert assert_error(limited, 429, "rate_limited")["details"]["limit"] == "guest"
    assert int(limited.headers["retry-after"]) >= 1
    # Another guest of the same client is not held back.
    assert (await world.gateway.post("/v1/events", json=hello())).status_code == 202


async def test_active_runs_are_capped_per_guest_a_session_is_one_run_and_a_duplicate_counts_once(
    world: StackClient, broker: Broker
) -> None:
    """Booking runs on a stack without executors wait on their first tool: they stay under way."""
    guest = f"g-{uuid.uuid4().hex[:8]}"
    session = f"s-{uuid.uuid4().hex[:8]}"

    def booking(session_id: str) -> dict[str, Any]:
        return guest_event(guest_id=guest, session_id=session_id, text=BOOKING_TEXT)

    first, second = booking(session), booking(session)
    started = await world.gateway.post("/v1/events", json=first)
    assert started.status_code == 202 and "turn" not in started.json()
    # One run owns a session at a time (its lane): a second message while it is under way is its next turn,
    # which is no new run and takes no slot.
    joined = await world.gateway.post("/v1/events", json=second)
    assert joined.status_code == 202 and joined.json()["turn"] is True
    assert joined.json()["run_id"] == started.json()["run_id"]
    again = await world.gateway.post(
        "/v1/events", json=first
    )  # the same event: already counted, never refused
    assert again.status_code == 202 and again.json()["duplicate"] is True
    for other in ("other-session", "third-session"):
        assert (await world.gateway.post("/v1/events", json=booking(f"{other}-{session}"))).status_code == 202
    refused = await world.gateway.post("/v1/events", json=booking(f"fourth-session-{session}"))
    error = assert_error(refused, 429, "too_many_active_runs")
    assert (error["details"]["limit"], error["details"]["cap"]) == ("guest", 3)
    assert int(refused.headers["retry-after"]) >= 1
    entry = await broker.kv_get(active_spec(world.ns), world.ns.guest_active_key(STACK_TENANT, guest))
    assert entry is not None and len(active_decoder.decode(entry.value).runs) == 3
    # The refused message left the session it tried to claim free for the guest's next message.
    lane, _ = await SessionRecords(broker, world.ns).get(STACK_TENANT, f"fourth-session-{session}")
    assert lane.run_id == ""


async def test_an_ended_run_frees_its_slot(world: StackClient, broker: Broker) -> None:
    guest, session = f"g-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
    for _ in range(4):  # more than the guest's cap, one after the other
        sent = guest_event(guest_id=guest, session_id=session, text=HELLO)
        response = await world.gateway.post("/v1/events", json=sent)
        assert response.status_code == 202, response.text
        await world.wait_status(response.json()["run_id"], "completed", timeout_s=30)

        async def released() -> bool:
            entry = await broker.kv_get(active_spec(world.ns), world.ns.guest_active_key(STACK_TENANT, guest))
            return entry is not None and not active_decoder.decode(entry.value).runs

        await eventually(released, what="the runtime to release the ended run's slot", timeout_s=10)


async def test_reconcile_is_limited_per_run(world: StackClient) -> None:
    run_id = (await world.gateway.post("/v1/events", json=hello())).json()["run_id"]
    await world.wait_status(run_id, "completed", timeout_s=30)
    answers = [await world.reconcile(run_id) for _ in range(4)]
    assert [a.status_code for a in answers[:3]] == [202, 202, 202], [a.text for a in answers]
    error = assert_error(answers[3], 429, "rate_limited")
    assert error["details"]["limit"] == "run" and int(answers[3].headers["retry-after"]) >= 1
    other = (await world.gateway.post("/v1/events", json=hello())).json()["run_id"]
    await world.wait_status(other, "completed", timeout_s=30)
    assert (await world.reconcile(other)).status_code == 202  # another run has its own allowance


# The body limit, before the body is read ----------------------------------------------------------------------


async def _raw_exchange(world: StackClient, head: bytes, body: bytes) -> tuple[int, dict[str, Any]]:
    """Send a request's head and only `body` of its body, never the rest, and read the answer: a server that
    waited for the whole body would never answer (the read times out)."""
    url = httpx.URL(world.stack.gateway_url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(head + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout=10)
        headers: dict[str, str] = {}
        while (line := await asyncio.wait_for(reader.readline(), timeout=10)) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        payload = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout=10)
        return int(status_line.split()[1]), json.loads(payload)
    finally:
        writer.close()


def _head(world: StackClient, framing: str) -> bytes:
    url = httpx.URL(world.stack.gateway_url)
    return (
        f"POST /v1/events HTTP/1.1\r\nhost: {url.host}:{url.port}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {world.api_key}\r\n{framing}\r\n\r\n"
    ).encode()


async def test_an_announced_oversized_body_is_413_before_a_byte_of_it_is_read(world: StackClient) -> None:
    status, body = await _raw_exchange(world, _head(world, f"content-length: {10 * 1024 * 1024}"), b"{")
    assert status == 413
    assert body["error"]["code"] == "body_too_large"
    assert body["error"]["details"] == {"size": 10 * 1024 * 1024, "limit": MAX_BODY_BYTES}


async def test_a_chunked_oversized_body_is_413_once_the_limit_has_arrived(world: StackClient) -> None:
    chunk = b" " * 4096
    sent = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_BODY_BYTES // len(chunk) + 2))
    status, body = await _raw_exchange(
        world, _head(world, "transfer-encoding: chunked"), sent
    )  # no last chunk
    assert status == 413
    assert body["error"]["code"] == "body_too_large" and body["error"]["details"]["limit"] == MAX_BODY_BYTES
    assert body["error"]["details"]["size"] > MAX_BODY_BYTES


def _urllib_post(url: str, api_key: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """A plain `urllib` POST: it sends the whole body before it reads a byte of the answer."""
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"content-type": "application/json", "authorization": f"Bearer {api_key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.mark.parametrize("size", [5 * 1024 * 1024, 64 * 1024], ids=["5MB", "64KB"])
async def test_a_client_that_sends_the_whole_body_before_reading_still_sees_the_typed_413(
    world: StackClient, size: int
) -> None:
    """urllib (and many another client) writes the whole body first: a server that answered 413 and closed with
    the body unread reset the connection under it, and the client saw `Connection reset by peer`, never the 413."""
    url = f"{world.stack.gateway_url}/v1/events"
    for _ in range(3):  # a reset depends on timing: never on any of three
        status, body = await asyncio.to_thread(_urllib_post, url, world.api_key, b" " * size)
        assert status == 413, body
        assert body["error"]["code"] == "body_too_large"
        assert body["error"]["details"] == {"size": size, "limit": MAX_BODY_BYTES}
    # The connection's refusal left the gateway serving: a good request from the same client is accepted.
    status, body = await asyncio.to_thread(_urllib_post, url, world.api_key, json.dumps(hello()).encode())
    assert status == 202, body


async def test_concurrent_new_runs_never_take_more_than_the_cap(world: StackClient, broker: Broker) -> None:
    """Eight new runs of one guest in eight sessions at once (within the guest's rate burst): compare-and-set lets
    exactly the guest's cap through. (Eight messages of one session are one run and its turns: test_sessions.py.)"""
    guest = f"g-{uuid.uuid4().hex[:8]}"
    answers = await asyncio.gather(
        *(
            world.gateway.post(
                "/v1/events",
                json=guest_event(guest_id=guest, session_id=f"s-{uuid.uuid4().hex[:8]}", text=BOOKING_TEXT),
            )
            for _ in range(8)
        )
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [202] * 3 + [429] * 5, [a.text for a in answers]
    assert {a.json()["error"]["code"] for a in answers if a.status_code == 429} == {"too_many_active_runs"}
    entry = await broker.kv_get(active_spec(world.ns), world.ns.guest_active_key(STACK_TENANT, guest))
    assert entry is not None
    assert set(active_decoder.decode(entry.value).runs) == {
        a.json()["run_id"] for a in answers if a.status_code == 202
    }
