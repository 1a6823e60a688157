"""A run's turn cap counts what was published: a message whose publish failed gives its turn back, so a client's
honest retries of it are counted once and never meet the 409 early (issue 31, item 7)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from crashsafe.contracts.clients import Scope
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.registry import load
from crashsafe.natsd import NatsServer
from crashsafe.services.gateway import app as gateway
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.client_keys import ClientKeys
from crashsafe.services.records.session_lane_records import SessionRecords
from tests.support import inprocess
from tests.support.nats_users import access
from tests.support.stack import auth_header, guest_event

pytestmark = pytest.mark.integration


# The app's handlers name their path parameters in the style this Litestar warns about when the app is built.
@pytest.mark.filterwarnings("ignore::litestar.exceptions.LitestarDeprecationWarning")
async def test_a_turn_whose_publish_failed_is_not_counted_against_the_runs_cap(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = dataclasses.replace(
        inprocess.settings_for(nats_server.url, namespace),
        turns_per_run=2,
        run_inbox=0,
        nats_access=access(nats_server.url, Role.GATEWAY),
    )
    await inprocess.provisioned(settings)
    key = (await ClientKeys(broker, namespace).create("acme", [Scope.EVENTS_WRITE])).key
    publish = gateway._publish_once
    failures = [RuntimeError("the broker did not answer")]

    async def fails_once(*args: Any) -> bool:
        if failures:
            raise failures.pop()
        return await publish(*args)

    monkeypatch.setattr(gateway, "_publish_once", fails_once)
    app = gateway.build_app(settings, load(settings.registry))
    async with AsyncTestClient(app=app, raise_server_exceptions=False) as client:
        client.headers.update(auth_header(key))
        session = "s-turns"
        failures.clear()
        first = await client.post("/v1/events", json=guest_event(session_id=session))
        assert first.status_code == 202, first.text  # starts the run: the session's owner
        owner = first.json()["run_id"]

        failures.append(RuntimeError("the broker did not answer"))
        turn = guest_event(session_id=session, text="and a late checkout?")
        failed = await client.post("/v1/events", json=turn)
        assert failed.status_code >= 500, failed.text  # nothing published: the client tries again
        for _ in range(2):  # an honest retry, and a retry of that (already published: counted once)
            retried = await client.post("/v1/events", json=turn)
            assert retried.status_code == 202 and retried.json()["run_id"] == owner, retried.text

        second = await client.post("/v1/events", json=guest_event(session_id=session, text="and parking?"))
        assert second.status_code == 202, second.text  # the run's second turn, within its cap of 2
        third = await client.post("/v1/events", json=guest_event(session_id=session, text="and a cot?"))
        assert third.status_code == 409 and third.json()["error"]["code"] == "turn_limit_reached", third.text
    lane, _ = await SessionRecords(broker, namespace).get("acme", session)
    assert (lane.run_id, lane.turns) == (owner, 2)
