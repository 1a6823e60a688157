"""The gateway over real HTTP on a real stack: one run per idempotency key, typed errors, nothing published on bad input."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from crashsafe.contracts.inbound import MAX_BODY_BYTES, GuestMessage, InboundEvent, inbound_encoder
from crashsafe.contracts.keys import inbound_hash, run_id_for
from crashsafe.contracts.run_events import Budget, RunStarted
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker, SubjectFull
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.stack_keys import STACK_TENANT
from tests.support.stack import StackClient, guest_event, open_stack
from tests.support.waiting import eventually

# Runs in this file only ever ask the scripted model a question ("hello"): no tool executors needed.
HELLO = "hello"


@pytest.fixture(scope="module")
async def world(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    """One stack for the module (they cost seconds each); every test uses its own keys."""
    async with open_stack(
        tmp_path_factory.mktemp("gateway"),
        nats_url=nats_server.url,
        namespace=f"g{uuid.uuid4().hex[:10]}",
        executors=(),
        reconciler=False,
    ) as client:
        yield client


@pytest.fixture
def ns(world: StackClient) -> Namespace:
    return world.ns


@pytest.fixture
def http(world: StackClient) -> httpx.AsyncClient:
    """The gateway over HTTP, as any client sees it."""
    return world.gateway


def body(key: str | None = None, text: str = HELLO, **overrides: Any) -> dict[str, Any]:
    """A guest event of guest-1 in session sess-1; `overrides` replace or add fields (to test refusals)."""
    return {**guest_event(key, text=text, session_id="sess-1"), **overrides}


async def inbound_count(broker: Broker, ns: Namespace) -> int:
    info = await broker.js.stream_info(ns.stream(StreamKind.INBOUND))
    return int(info.state.messages)


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    return dict(error)


# Accepting an event -------------------------------------------------------------------------------------------


async def test_an_event_becomes_a_run_with_a_readable_journal(
    world: StackClient, http: httpx.AsyncClient
) -> None:
    sent = body()
    response = await http.post("/v1/events", json=sent)
    assert response.status_code == 202
    run_id = run_id_for(STACK_TENANT, sent["event_id"])
    assert response.json() == {"run_id": run_id, "duplicate": False}

    summary = await world.wait_status(run_id, "completed", timeout_s=20)
    events = await world.events(run_id)
    assert [e["type"] for e in events] == ["run.started", "run.model_answered", "run.completed"]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {e["run_id"] for e in events} == {run_id}
    first = events[0]
    assert (first["idempotency_key"], first["event_id"], first["guest_id"], first["text"]) == (
        sent["event_id"],
        sent["event_id"],
        "guest-1",
        HELLO,
    )
    assert first["input_hash"] == inbound_hash(GuestMessage(**sent), "booking")
    answered = events[1]
    assert (
        summary["steps"] == 1
        and summary["tokens_used"] == answered["input_tokens"] + answered["output_tokens"] > 0
    )
    assert (
        summary["reply"] == events[2]["reply"]
        and summary["last_seq"] == seqs[-1]
        and summary["pending_actions"] == []
    )


async def test_the_same_key_twice_is_one_run(
    world: StackClient, http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    sent = body()
    before = await inbound_count(broker, ns)
    first = await http.post("/v1/events", json=sent)
    second = await http.post("/v1/events", json=sent)
    assert first.status_code == second.status_code == 202
    assert first.json()["run_id"] == second.json()["run_id"]
    assert (first.json()["duplicate"], second.json()["duplicate"]) == (False, True)
    await world.wait_status(first.json()["run_id"], "completed", timeout_s=20)
    third = await http.post("/v1/events", json=sent)  # after the run ended too
    assert third.status_code == 202 and third.json() == {"run_id": first.json()["run_id"], "duplicate": True}
    assert await inbound_count(broker, ns) == before + 1
    assert [e["type"] for e in await world.events(first.json()["run_id"])].count("run.started") == 1


async def test_a_burst_of_the_same_key_is_one_run(
    world: StackClient, http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    sent = body()
    before = await inbound_count(broker, ns)
    answers = await asyncio.gather(*(http.post("/v1/events", json=sent) for _ in range(6)))
    assert {a.status_code for a in answers} == {202}
    assert len({a.json()["run_id"] for a in answers}) == 1
    assert sorted(a.json()["duplicate"] for a in answers) == [False] + [True] * 5
    await world.wait_status(answers[0].json()["run_id"], "completed", timeout_s=20)
    assert await inbound_count(broker, ns) == before + 1
    assert [e["type"] for e in await world.events(answers[0].json()["run_id"])].count("run.started") == 1


async def test_the_same_key_with_another_body_is_a_conflict(
    world: StackClient, http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    sent = body()
    key, run_id = sent["event_id"], run_id_for(STACK_TENANT, sent["event_id"])
    assert (await http.post("/v1/events", json=sent)).status_code == 202
    before = await inbound_count(broker, ns)
    clash = await http.post(
        "/v1/events", json={**sent, "text": "Book a room in Paris from 2031-12-01 to 2031-12-02"}
    )
    error = assert_error(clash, 409, "idempotency_conflict")
    assert key in error["message"] and error["details"] == {"key": key, "run_id": run_id}
    assert await inbound_count(broker, ns) == before
    await world.wait_status(run_id, "completed", timeout_s=20)
    started = [e for e in await world.events(run_id) if e["type"] == "run.started"]
    assert len(started) == 1 and started[0]["text"] == HELLO


async def test_a_proxy_adding_an_idempotency_key_per_retry_still_makes_one_run(
    world: StackClient, http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    """The identity is (tenant, event_id) only: a header a proxy or an HTTP library adds per attempt is ignored."""
    sent = body()
    before = await inbound_count(broker, ns)
    answers = [
        await http.post("/v1/events", json=sent, headers={"Idempotency-Key": f"retry-{uuid.uuid4().hex}"})
        for _ in range(3)
    ]
    assert [a.status_code for a in answers] == [202, 202, 202], [a.text for a in answers]
    run_id = run_id_for(STACK_TENANT, sent["event_id"])
    assert [a.json() for a in answers] == [
        {"run_id": run_id, "duplicate": False},
        {"run_id": run_id, "duplicate": True},
        {"run_id": run_id, "duplicate": True},
    ]
    assert await inbound_count(broker, ns) == before + 1
    await world.wait_status(run_id, "completed", timeout_s=20)
    events = await world.events(run_id)
    assert [e["type"] for e in events].count("run.started") == 1
    assert (events[0]["idempotency_key"], events[0]["tenant"]) == (sent["event_id"], STACK_TENANT)
    # An empty or overlong header is ignored as well: it is not part of the request's meaning.
    for header in ("", "k" * 201):
        again = await http.post("/v1/events", json=sent, headers={"Idempotency-Key": header})
        assert again.status_code == 202 and again.json() == {"run_id": run_id, "duplicate": True}


# Refusing bad input, publishing nothing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "headers", "status", "code"),
    [
        pytest.param(
            b'{"event_id": "evt-1", "session_id": ', {}, 400, "invalid_request", id="malformed-json"
        ),
        pytest.param(b"", {}, 400, "invalid_request", id="empty-body"),
        pytest.param(
            json.dumps({k: v for k, v in body().items() if k != "guest_id"}).encode(),
            {},
            422,
            "invalid_request",
            id="missing-field",
        ),
        pytest.param(json.dumps(body(guest_id=42)).encode(), {}, 422, "invalid_request", id="wrong-type"),
        pytest.param(
            json.dumps(body(amount_cents=1)).encode(), {}, 422, "invalid_request", id="unknown-field"
        ),
        pytest.param(json.dumps(body(text="")).encode(), {}, 422, "invalid_request", id="empty-text"),
        pytest.param(
            json.dumps(body(event_id="has spaces/and slashes")).encode(),
            {},
            422,
            "invalid_request",
            id="bad-id",
        ),
        pytest.param(b"[1, 2, 3]", {}, 422, "invalid_request", id="not-an-object"),
        pytest.param(
            json.dumps(body(text="x" * 4001)).encode(), {}, 422, "invalid_request", id="text-too-long"
        ),
        pytest.param(
            json.dumps(body(text="x" * (MAX_BODY_BYTES + 1))).encode(),
            {},
            413,
            "body_too_large",
            id="too-large",
        ),
    ],
)
async def test_bad_requests_are_typed_and_publish_nothing(
    http: httpx.AsyncClient,
    broker: Broker,
    ns: Namespace,
    raw: bytes,
    headers: dict[str, str],
    status: int,
    code: str,
) -> None:
    before = await inbound_count(broker, ns)
    response = await http.post(
        "/v1/events", content=raw, headers={"content-type": "application/json", **headers}
    )
    assert_error(response, status, code)
    assert await inbound_count(broker, ns) == before


async def test_the_body_limit_is_exactly_16_kib(
    world: StackClient, http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    compact = json.dumps(body()).encode()
    at_limit = compact[:-1] + b" " * (MAX_BODY_BYTES - len(compact)) + b"}"  # JSON allows the padding
    assert len(at_limit) == MAX_BODY_BYTES
    before = await inbound_count(broker, ns)
    too_big = compact[:-1] + b" " * (MAX_BODY_BYTES + 1 - len(compact)) + b"}"
    assert_error(await http.post("/v1/events", content=too_big), 413, "body_too_large")
    assert await inbound_count(broker, ns) == before
    accepted = await http.post("/v1/events", content=at_limit)
    assert accepted.status_code == 202
    await world.wait_status(accepted.json()["run_id"], "completed", timeout_s=20)


async def test_an_unknown_agent_is_refused_before_anything_is_published(
    http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    sent = body()
    before = await inbound_count(broker, ns)
    response = await http.post("/v1/events?agent=no_such_agent", json=sent)
    assert response.status_code in (400, 422), response.text
    assert await inbound_count(broker, ns) == before


# The lasting guards behind the 2-minute duplicate window ------------------------------------------------------


def inbound_event(sent: dict[str, Any], key: str | None = None) -> InboundEvent:
    key = key or sent["event_id"]
    message = GuestMessage(**sent)
    return InboundEvent(
        key=key,
        run_id=run_id_for(STACK_TENANT, key),
        input_hash=inbound_hash(message, "booking"),
        message=message,
        received_at=datetime.now(UTC),
        tenant=STACK_TENANT,
    )


async def test_a_redelivery_with_a_new_msg_id_is_refused_by_the_per_run_subject(
    world: StackClient, http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    """What a redelivery after the duplicate window looks like: same run subject, a message id JetStream forgot."""
    sent = body()
    run_id = (await http.post("/v1/events", json=sent)).json()["run_id"]
    before = await inbound_count(broker, ns)
    with pytest.raises(SubjectFull):
        await broker.publish(
            ns.inbound(run_id), inbound_encoder.encode(inbound_event(sent)), msg_id=f"late-{uuid.uuid4().hex}"
        )
    assert await inbound_count(broker, ns) == before
    await world.wait_status(run_id, "completed", timeout_s=20)
    assert [e["type"] for e in await world.events(run_id)].count("run.started") == 1


async def _poll_until_window_passed(
    broker: Broker, ns: Namespace, run_id: str, deadline_s: float = 10.0
) -> None:
    """The gateway's msg id is the run id; once JetStream forgets it, a publish hits the full subject instead."""

    async def window_passed() -> bool:
        try:
            published = await broker.publish(ns.inbound(run_id), b"{}", msg_id=run_id)
        except SubjectFull:
            return True
        assert published.duplicate, "a probe was stored: the subject guard is gone"
        return False

    await eventually(window_passed, what="the duplicate window to pass", timeout_s=deadline_s, every_s=0.05)


async def test_after_the_duplicate_window_the_gateway_still_gives_one_run(
    world: StackClient, http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    """Shrink the inbound stream's duplicate window so "two minutes later" happens now, then retry through HTTP."""
    name = ns.stream(StreamKind.INBOUND)
    config = (await broker.js.stream_info(name)).config
    window = config.duplicate_window
    config.duplicate_window = 0.2
    await broker.js.update_stream(config)
    try:
        sent = body()
        run_id = (await http.post("/v1/events", json=sent)).json()["run_id"]
        await _poll_until_window_passed(broker, ns, run_id)
        before = await inbound_count(broker, ns)
        again = await http.post("/v1/events", json=sent)
        assert again.status_code == 202 and again.json() == {"run_id": run_id, "duplicate": True}
        assert_error(
            await http.post("/v1/events", json={**sent, "text": "something else"}),
            409,
            "idempotency_conflict",
        )
        assert await inbound_count(broker, ns) == before
        await world.wait_status(run_id, "completed", timeout_s=20)
        assert [e["type"] for e in await world.events(run_id)].count("run.started") == 1
    finally:
        config.duplicate_window = window
        await broker.js.update_stream(config)


async def _start_run_directly(broker: Broker, ns: Namespace, sent: dict[str, Any]) -> str:
    """A run whose inbound message is long gone (past the inbound stream's retention): only its journal remains."""
    key = sent["event_id"]
    run_id = run_id_for(STACK_TENANT, key)
    now = datetime.now(UTC)
    started = RunStarted(
        run_id=run_id,
        at=now,
        agent="booking",
        session_id=sent["session_id"],
        guest_id=sent["guest_id"],
        event_id=key,
        idempotency_key=key,
        input_hash=inbound_hash(GuestMessage(**sent), "booking"),
        text=sent["text"],
        budget=Budget(),
        deadline_at=now,
        tenant=STACK_TENANT,
    )
    await RunJournal(broker, ns).append(started, 0)
    await broker.js.purge_stream(ns.stream(StreamKind.INBOUND), subject=ns.inbound(run_id))
    assert await broker.last_on_subject(ns.stream(StreamKind.INBOUND), ns.inbound(run_id)) is None
    return run_id


async def test_the_journal_guards_a_key_whose_inbound_message_is_gone(
    http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    sent = body()
    run_id = await _start_run_directly(broker, ns, sent)
    clash = await http.post("/v1/events", json={**sent, "text": "a different request"})
    error = assert_error(clash, 409, "idempotency_conflict")
    assert error["details"] == {"key": sent["event_id"], "run_id": run_id}


async def test_a_journal_guard_conflict_publishes_nothing_and_keeps_the_original(
    http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    sent = body()
    run_id = await _start_run_directly(broker, ns, sent)
    other = {**sent, "text": "a different request"}
    assert_error(await http.post("/v1/events", json=other), 409, "idempotency_conflict")
    assert await broker.last_on_subject(ns.stream(StreamKind.INBOUND), ns.inbound(run_id)) is None
    retry = await http.post("/v1/events", json=sent)
    assert retry.status_code == 202 and retry.json()["run_id"] == run_id
    assert_error(await http.post("/v1/events", json=other), 409, "idempotency_conflict")


async def test_a_purged_inbound_message_inside_the_window_falls_back_to_the_journal(
    world: StackClient, http: httpx.AsyncClient, broker: Broker, ns: Namespace
) -> None:
    sent = body()
    run_id = (await http.post("/v1/events", json=sent)).json()["run_id"]
    await world.wait_status(run_id, "completed", timeout_s=20)
    await broker.js.purge_stream(ns.stream(StreamKind.INBOUND), subject=ns.inbound(run_id))
    clash = await http.post("/v1/events", json={**sent, "text": "a different request"})
    assert_error(clash, 409, "idempotency_conflict")


# Reading runs -------------------------------------------------------------------------------------------------


async def test_an_unknown_run_is_a_typed_404(http: httpx.AsyncClient) -> None:
    for path in ("/v1/runs/unknown", "/v1/runs/unknown/events"):
        error = assert_error(await http.get(path), 404, "run_not_found")
        assert error["details"] == {"run_id": "unknown"}


@pytest.mark.parametrize("run_id", ["*", ">", 'run_"x'])
async def test_a_run_id_is_never_a_subject_pattern(
    world: StackClient, http: httpx.AsyncClient, run_id: str
) -> None:
    sent = body()
    created = (await http.post("/v1/events", json=sent)).json()["run_id"]
    await world.wait_status(created, "completed", timeout_s=20)  # at least one run exists
    for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events"):
        response = await http.get(path)
        assert response.status_code in (400, 404), (path, response.status_code, response.text[:200])


async def test_health_and_readiness(http: httpx.AsyncClient) -> None:
    health = await http.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    ready = await http.get("/readyz")
    body = ready.json()
    assert ready.status_code == 200 and (body["ready"], body["missing"]) == (True, [])
    assert "nats" in body["checks"] and set(body["checks"].values()) == {"ok"}  # each seam by name
    metrics = await http.get("/metrics")
    assert metrics.status_code == 200 and "crashsafe_gateway_requests_total" in metrics.text


async def test_the_served_openapi_document_is_the_checked_in_one(http: httpx.AsyncClient) -> None:
    """docs/openapi.json is what the running gateway serves to a key holder (to anyone else /schema is not there),
    and it describes real bodies."""
    from tests.support.paths import ROOT

    served = await http.get("/schema/openapi.json")  # the stack's key
    assert served.status_code == 200, served.text[:200]
    for anonymous in ("", "Bearer csk_0000000000000000_" + "s" * 43):
        assert (
            await http.get("/schema/openapi.json", headers={"Authorization": anonymous})
        ).status_code == 404
    document = served.json()
    assert document == json.loads((ROOT / "docs" / "openapi.json").read_bytes()), "run `just docs`"
    accept = document["paths"]["/v1/events"]["post"]
    assert "202" in accept["responses"] and "201" not in accept["responses"]
    assert accept["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/GuestMessage"
    }


async def test_an_idle_connection_outlives_the_clients_own_keep_alive(world: StackClient) -> None:
    """A client keeps an idle connection 5 s (httpx) to 60 s (a load balancer); the gateway keeps it longer, so the
    client always closes first and never sends on a connection the gateway is closing (a reset: a POST whose
    answer never came). Raw HTTP/1.1 on one socket: a request, 6 s idle, a second request answered on it."""
    url = httpx.URL(world.stack.gateway_url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    request = f"GET /healthz HTTP/1.1\r\nHost: {url.host}\r\n\r\n".encode()
    try:
        for pause_s in (0.0, 6.0):
            await asyncio.sleep(pause_s)
            writer.write(request)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
    finally:
        writer.close()
