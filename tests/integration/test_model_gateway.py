"""The model gateway over real HTTP: routes from the pinned catalog tried in order, failover on a provider's
5xx, an expired key (401, 403), an unknown model (404), slowness or garbage (journaled), the Chat Completions dialect, timeouts bounded by the run's deadline, and
token accounting from the provider's own usage. Two sandboxes play two providers; faults are armed on them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from aiohttp import web

from crashsafe.contracts.catalog import AgentConfig, Catalog, ModelApi, ModelRoute
from crashsafe.contracts.errors import ModelUnavailable
from crashsafe.contracts.run_events import JournalEvent, ModelAnswered, RunStarted
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.fold import replay
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_catalog import publish_catalog
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime.chat_completions import chat_messages, chat_tools
from crashsafe.services.runtime.model import ModelGateway
from crashsafe.services.runtime.service import Runtime
from tests.support import inprocess
from tests.support.broker import dead_letters, submit_inbound
from tests.support.inprocess import REGISTRY
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKED_AND_PAID, BOOKING_TEXT, Sandbox

BOOKING = REGISTRY.agent("booking")


@dataclass
class World:
    runtime: Runtime
    model: ModelGateway
    primary: Sandbox  # the providers and the first model
    backup: Sandbox  # a second model provider
    journal: RunJournal
    broker: Broker
    ns: Namespace


@pytest.fixture
async def world(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> AsyncIterator[World]:
    async with (
        inprocess.sandbox_server() as primary_url,
        inprocess.sandbox_server() as backup_url,
        AsyncExitStack() as running,
    ):
        settings = inprocess.settings_for(
            nats_server.url, namespace, sandbox_url=primary_url, data_dir=tmp_path / "data"
        )
        for family in ("booking", "payment", "notify"):
            await running.enter_async_context(inprocess.executor(settings, family))
        model = await running.enter_async_context(inprocess.scripted_model(settings))
        worker = await running.enter_async_context(inprocess.runtime(settings, model, catalog=True))
        await worker.start()
        http = await running.enter_async_context(httpx.AsyncClient(timeout=10))
        yield World(
            worker,
            model,
            Sandbox(http, primary_url),
            Sandbox(http, backup_url),
            RunJournal(broker, namespace),
            broker,
            namespace,
        )


# An aiohttp handler of one of a provider's routes.
Handler = Callable[[web.Request], Awaitable[web.Response]]


def _route(name: str, sandbox: Sandbox, **kw: Any) -> ModelRoute:
    return ModelRoute(name=name, model="scripted-booking", base_url=f"{sandbox.url}/v1", **kw)


def _booking(**changes: Any) -> AgentConfig:
    """The booking agent's own configuration (its rules as the code ships them), with `changes`."""
    return msgspec.structs.replace(BOOKING.config, **changes)


async def _publish(world: World, config: AgentConfig, label: str = "") -> int:
    revision = await publish_catalog(
        world.broker, world.ns, REGISTRY, Catalog(agents={"booking": config}, label=label)
    )
    await eventually(lambda: world.runtime.catalog.revision == revision, what=f"revision {revision} loaded")
    return revision


async def _book(world: World) -> tuple[str, list[JournalEvent]]:
    """A whole booking run through the runtime; its guest and its journal once it ended."""
    event_id = unique("ev")
    run_id = await submit_inbound(world.broker, world.ns, event_id, agent="booking", text=BOOKING_TEXT)

    async def ended() -> list[JournalEvent] | None:
        events, _ = await world.journal.read(run_id)
        state = replay(events)
        return events if state is not None and state.terminal else None

    return f"guest-{event_id}", await eventually(ended, what=f"run {run_id} to end")


def _answers(events: list[JournalEvent]) -> list[ModelAnswered]:
    return [e for e in events if isinstance(e, ModelAnswered)]


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        ({"fail_5xx": 1}, "answered 503"),
        ({"malformed": 1}, "malformed answer"),
        ({"latency_ms": 5_000}, "timed out after 0.5s"),
    ],
    ids=["5xx", "garbage", "slow"],
)
async def test_a_failing_first_route_fails_over_to_the_second_and_the_journal_says_so(
    world: World, fault: dict[str, int], why: str
) -> None:
    await _publish(
        world,
        _booking(routes=[_route("primary", world.primary, timeout_s=0.5), _route("backup", world.backup)]),
    )
    await world.primary.arm("model", **fault)
    guest, events = await _book(world)
    await world.primary.arm("model")  # disarm a latency (counters disarm themselves)

    state = replay(events)
    assert state is not None and state.status == "completed", state
    assert (await world.primary.counts(guest)) == BOOKED_AND_PAID
    first, *rest = _answers(events)
    assert first.provider == "backup"
    assert len(first.failovers) == 1 and first.failovers[0].startswith("primary: ")
    assert why in first.failovers[0]
    if "latency_ms" in fault:  # slow on every call: every answer came from the backup
        assert {a.provider for a in rest} == {"backup"}
    else:  # one fault, then the first route answers again
        assert rest and all(a.provider == "primary" and a.failovers == [] for a in rest)
    assert await dead_letters(world.broker, world.ns) == []


async def test_a_whole_booking_runs_over_chat_completions(world: World) -> None:
    """vLLM, Ollama and LiteLLM speak only Chat Completions: the same run, the same effects, over that dialect."""
    await _publish(world, _booking(routes=[_route("chat", world.primary, api=ModelApi.CHAT.value)]))
    guest, events = await _book(world)

    state = replay(events)
    assert state is not None and state.status == "completed", state
    assert (await world.primary.counts(guest)) == BOOKED_AND_PAID
    answers = _answers(events)
    assert [c.name for a in answers for c in a.tool_calls] == [
        "search_hotels",
        "create_booking",
        "create_payment",
    ]
    assert all(a.provider == "chat" and a.response_id.startswith("chatcmpl-") for a in answers)
    assert answers[-1].reply  # the confirmation, read from `choices[0].message.content`
    assert state.tokens_used == sum(a.input_tokens + a.output_tokens for a in answers) > 0


@pytest.mark.parametrize("api", [ModelApi.RESPONSES, ModelApi.CHAT])
async def test_tokens_are_the_providers_usage(world: World, api: ModelApi) -> None:
    """The reply's tokens are what the provider's `usage` says for the same request, in either dialect."""
    items: tuple[dict[str, Any], ...] = ({"role": "user", "content": BOOKING_TEXT},)
    config = _booking(routes=[_route("r", world.primary, api=api.value)])
    reply = await world.model.answer(BOOKING, items, config)

    tools = [
        {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
        for t in BOOKING.tools.values()
    ]
    if api is ModelApi.CHAT:
        body = {"model": "scripted-booking", "messages": chat_messages("", items), "tools": chat_tools(tools)}
        usage = (await world.primary.http.post(f"{world.primary.url}/v1/chat/completions", json=body)).json()
        expected = (usage["usage"]["prompt_tokens"], usage["usage"]["completion_tokens"])
    else:
        body = {"model": "scripted-booking", "input": list(items), "tools": tools}
        usage = (await world.primary.http.post(f"{world.primary.url}/v1/responses", json=body)).json()
        expected = (usage["usage"]["input_tokens"], usage["usage"]["output_tokens"])
    assert (reply.input_tokens, reply.output_tokens) == expected
    assert expected[0] > 0 and expected[1] > 0


async def test_a_call_is_cut_at_the_runs_deadline_and_no_later_route_is_asked(world: World) -> None:
    """Route timeout 30 s, but the run has 0.5 s left: the call is cut there, and no time is left for the
    backup, which is never asked (its armed fault is still unspent)."""
    await world.primary.arm("model", latency_ms=5_000)
    await world.backup.arm("model", fail_5xx=1)
    config = _booking(routes=[_route("primary", world.primary), _route("backup", world.backup)])
    items: tuple[dict[str, Any], ...] = ({"role": "user", "content": BOOKING_TEXT},)
    deadline = datetime.now(UTC) + timedelta(seconds=0.5)
    with pytest.raises(ModelUnavailable) as raised:
        await world.model.answer(BOOKING, items, config, deadline)
    await world.primary.arm("model")
    assert "primary: timed out after 0." in raised.value.message
    assert "backup: no time left before the run's deadline" in raised.value.message
    assert (await world.backup.faults())["model"]["fail_5xx"] == 1


async def test_a_run_past_its_deadline_asks_no_model(world: World) -> None:
    await world.primary.arm("model", fail_5xx=1)
    config = _booking(routes=[_route("primary", world.primary)])
    items: tuple[dict[str, Any], ...] = ({"role": "user", "content": BOOKING_TEXT},)
    with pytest.raises(ModelUnavailable, match="no time left"):
        await world.model.answer(BOOKING, items, config, datetime.now(UTC) - timedelta(seconds=1))
    assert (await world.primary.faults())["model"]["fail_5xx"] == 1  # never asked


async def test_every_route_failing_names_each_and_a_4xx_is_not_failed_over(world: World) -> None:
    items: tuple[dict[str, Any], ...] = ({"role": "user", "content": BOOKING_TEXT},)
    await world.primary.arm("model", fail_5xx=1)
    await world.backup.arm("model", throttle=1)
    both = _booking(routes=[_route("primary", world.primary), _route("backup", world.backup)])
    with pytest.raises(ModelUnavailable) as raised:
        await world.model.answer(BOOKING, items, both)
    assert "primary: answered 503" in raised.value.message
    assert "backup: answered 429" in raised.value.message

    # A 400 (too long a context, a bad tool schema) is the request's fault: the backup would refuse it too.
    async with _refusing_provider(400) as (url, asked):
        bad = ModelRoute(name="primary", model="m", base_url=url)
        await world.backup.arm("model", fail_5xx=1)
        with pytest.raises(ModelUnavailable, match="primary refused the request: 400"):
            await world.model.answer(BOOKING, items, _booking(routes=[bad, _route("backup", world.backup)]))
    assert asked == [400]
    assert (await world.backup.faults())["model"]["fail_5xx"] == 1  # never asked


@asynccontextmanager
async def _refusing_provider(status: int) -> AsyncIterator[tuple[str, list[int]]]:
    """A provider on loopback that refuses every model call with `status` and the OpenAI error shape (an expired
    key's 401, a revoked project's 403, a model it does not serve's 404); the list holds each refusal given."""
    asked: list[int] = []

    async def refuse(request: web.Request) -> web.Response:
        await request.read()
        asked.append(status)
        error = {"message": f"refused with {status}", "type": "invalid_request_error", "code": str(status)}
        return web.json_response({"error": error}, status=status)

    async with _serving(refuse, refuse) as url:
        yield url, asked


@pytest.mark.parametrize("status", [401, 403, 404])
@pytest.mark.parametrize("api", [ModelApi.RESPONSES, ModelApi.CHAT])
async def test_a_route_refusing_its_key_or_model_fails_over(world: World, api: ModelApi, status: int) -> None:
    """An expired key (401), a key without access (403) or a model the provider does not serve (404) is that
    route's trouble, not the request's: the next route, with its own key and provider, answers."""
    items: tuple[dict[str, Any], ...] = ({"role": "user", "content": BOOKING_TEXT},)
    async with _refusing_provider(status) as (url, asked):
        expired = ModelRoute(name="expired", model="m", api=api.value, base_url=url)
        config = _booking(routes=[expired, _route("backup", world.backup, api=api.value)])
        reply = await world.model.answer(BOOKING, items, config)
    assert asked == [status]
    assert reply.provider == "backup" and reply.tool_calls
    assert reply.failovers == (f"expired: answered {status}",)


async def test_an_expired_key_on_the_primary_leaves_every_run_to_the_secondary(world: World) -> None:
    """The primary's key expired: a whole booking run still completes, every step answered by the secondary,
    instead of being handed off as `model_unavailable`."""
    async with _refusing_provider(401) as (url, asked):
        expired = ModelRoute(name="expired", model="scripted-booking", base_url=url)
        await _publish(world, _booking(routes=[expired, _route("secondary", world.primary)]))
        guest, events = await _book(world)
    state = replay(events)
    assert state is not None and state.status == "completed", state
    assert (await world.primary.counts(guest)) == BOOKED_AND_PAID
    answers = _answers(events)
    assert answers and {a.provider for a in answers} == {"secondary"}
    assert all(a.failovers == ["expired: answered 401"] for a in answers)
    assert len(asked) == len(answers)


async def test_a_route_without_its_key_fails_over(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_NO_SUCH_API_KEY", raising=False)
    items: tuple[dict[str, Any], ...] = ({"role": "user", "content": BOOKING_TEXT},)
    config = _booking(
        routes=[
            _route("keyless", world.backup, api_key_env="TEST_NO_SUCH_API_KEY"),
            _route("primary", world.primary),
        ]
    )
    reply = await world.model.answer(BOOKING, items, config)
    assert reply.provider == "primary"
    assert reply.failovers == ("keyless: no API key: set $TEST_NO_SUCH_API_KEY",)


async def test_a_run_keeps_its_catalog_revision_while_a_new_one_is_published(world: World) -> None:
    """Run 1 starts under revision A and waits on its hold; revision B (another route, budget and tool set: no
    payment) is published meanwhile. Run 1 ends under A (its route, its budget, its payment); run 2 gets B."""
    a = await _publish(
        world,
        _booking(
            routes=[_route("a", world.primary)],
            budget=msgspec.structs.replace(BOOKING.config.budget, max_steps=19),
        ),
        "A",
    )
    await world.primary.arm("bookings", commit_delay_ms=3_000)  # run 1 waits on its hold
    event_id = unique("ev")
    run_1 = await submit_inbound(world.broker, world.ns, event_id, agent="booking", text=BOOKING_TEXT)
    await eventually(world.primary.in_flight, what="run 1's hold in the provider's hands")

    without_payment = [t for t in BOOKING.tools if t != "create_payment"]
    b = await _publish(
        world,
        _booking(
            routes=[_route("b", world.backup)],
            tools=without_payment,
            budget=msgspec.structs.replace(BOOKING.config.budget, max_steps=18),
        ),
        "B",
    )
    assert b > a

    async def ended(run_id: str) -> list[JournalEvent] | None:
        events, _ = await world.journal.read(run_id)
        state = replay(events)
        return events if state is not None and state.terminal else None

    first = await eventually(lambda: ended(run_1), what="run 1 to end")
    started_1 = first[0]
    assert isinstance(started_1, RunStarted)
    assert started_1.catalog_revision == a and started_1.budget.max_steps == 19
    assert {m.provider for m in _answers(first)} == {"a"}  # also the answers after B was published
    assert (await world.primary.counts(f"guest-{event_id}"))["charge"] == 1  # A offered the payment

    await world.primary.arm("bookings")
    guest_2, second = await _book(world)
    started_2 = second[0]
    assert isinstance(started_2, RunStarted)
    assert started_2.catalog_revision == b and started_2.budget.max_steps == 18
    assert {m.provider for m in _answers(second)} == {"b"}
    # B offers no payment tool: the well-behaved scripted model says so instead of calling it.
    assert "create_payment tool is not available" in (_answers(second)[-1].reply or "")
    assert (await world.primary.counts(guest_2))["charge"] == 0


@asynccontextmanager
async def _recording_provider() -> AsyncIterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """A stand-in for an outside provider that keeps every request body and answers with a minimal valid reply
    in the dialect asked (the scripted model ignores the prompt, so this is how the prompt sent is seen)."""
    seen: list[tuple[str, dict[str, Any]]] = []

    async def responses(request: web.Request) -> web.Response:
        seen.append(("responses", await request.json()))
        return web.json_response({"id": "resp_1", "model": "m", "output": [], "usage": {"input_tokens": 1}})

    async def chat(request: web.Request) -> web.Response:
        seen.append(("chat", await request.json()))
        return web.json_response({"id": "c1", "choices": [{"message": {"content": "ok"}}]})

    async with _serving(responses, chat) as url:
        yield url, seen


@asynccontextmanager
async def _serving(responses: Handler, chat: Handler) -> AsyncIterator[str]:
    """A model provider on a free loopback port, its two dialects served by `responses` and `chat`; its base URL."""
    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("api", [ModelApi.RESPONSES, ModelApi.CHAT])
async def test_the_prompt_and_tools_sent_are_the_pinned_configurations(world: World, api: ModelApi) -> None:
    items: tuple[dict[str, Any], ...] = ({"role": "user", "content": BOOKING_TEXT},)
    async with _recording_provider() as (url, seen):
        route = ModelRoute(name="r", model="m", api=api.value, base_url=url)
        await world.model.answer(
            BOOKING, items, _booking(routes=[route], instructions="Only Lisbon.", tools=["search_hotels"])
        )
        await world.model.answer(BOOKING, items, _booking(routes=[route]))
    (kind_1, narrowed), (kind_2, default) = seen
    assert kind_1 == kind_2 == ("chat" if api is ModelApi.CHAT else "responses")
    if api is ModelApi.CHAT:
        assert narrowed["messages"][0] == {"role": "system", "content": "Only Lisbon."}
        assert [t["function"]["name"] for t in narrowed["tools"]] == ["search_hotels"]
        assert default["messages"][0] == {"role": "system", "content": BOOKING.instructions}
        assert [t["function"]["name"] for t in default["tools"]] == list(BOOKING.tools)
    else:
        assert narrowed["instructions"] == "Only Lisbon."
        assert [t["name"] for t in narrowed["tools"]] == ["search_hotels"]
        assert default["instructions"] == BOOKING.instructions
        assert [t["name"] for t in default["tools"]] == list(BOOKING.tools)
    assert narrowed["model"] == "m"


async def test_a_provider_nobody_listens_on_is_failed_over(world: World) -> None:
    items: tuple[dict[str, Any], ...] = ({"role": "user", "content": BOOKING_TEXT},)
    dead = ModelRoute(name="dead", model="m", base_url=f"{inprocess.NO_SANDBOX}/v1")
    reply = await world.model.answer(
        BOOKING, items, _booking(routes=[dead, _route("primary", world.primary)])
    )
    assert reply.provider == "primary" and reply.tool_calls
    (why,) = reply.failovers
    assert why.startswith("dead: connection failed")


@pytest.mark.parametrize("api", [ModelApi.RESPONSES, ModelApi.CHAT])
async def test_a_call_carries_its_routes_key_and_the_deployments_organization_and_project(
    api: ModelApi,
) -> None:
    """What the `openai` SDK sent, without it: the route's key as a bearer token (read from the variable the
    catalog names), the deployment's OPENAI_ORG_ID and OPENAI_PROJECT_ID, a JSON body; and no cookie an answer set
    rides on the next call (every tenant's runs share the client)."""
    headers: list[dict[str, str]] = []

    async def recorded(request: web.Request) -> web.Response:
        headers.append(dict(request.headers))
        reply = (
            {"id": "c1", "choices": [{"message": {"content": "ok"}}]}
            if request.path.endswith("completions")
            else {"id": "resp_1", "model": "m", "output": [], "usage": {"input_tokens": 1}}
        )
        answer = web.json_response(reply)
        answer.set_cookie("session", "tenant-a")
        return answer

    keys = {"ROUTE_KEY": "sk-route"}
    gateway = ModelGateway(None, None, "m", keys=keys.get, organization="org-1", project="proj-1")
    items: tuple[dict[str, Any], ...] = ({"role": "user", "content": BOOKING_TEXT},)
    try:
        async with _serving(recorded, recorded) as url:
            route = ModelRoute(name="r", model="m", api=api.value, base_url=url, api_key_env="ROUTE_KEY")
            for _ in range(2):
                await gateway.answer(BOOKING, items, _booking(routes=[route]))
    finally:
        await gateway.close()
    first, second = headers
    assert first["Authorization"] == "Bearer sk-route" and first["Content-Type"] == "application/json"
    assert (first["OpenAI-Organization"], first["OpenAI-Project"]) == ("org-1", "proj-1")
    assert "Cookie" not in second
