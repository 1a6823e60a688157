"""The gateway answers only what docs/openapi.json says it answers: every status a hostile or careless client can
get, over real HTTP from a live gateway, is a documented response of its operation, with the documented body."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from crashsafe.natsd import NatsServer
from tests.support.paths import ROOT
from tests.support.stack import StackClient, guest_event, open_stack

pytestmark = pytest.mark.e2e

DOC = json.loads((ROOT / "docs" / "openapi.json").read_bytes())


@pytest.fixture(scope="module")
async def world(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    async with open_stack(
        tmp_path_factory.mktemp("openapi"),
        nats_url=nats_server.url,
        namespace=f"o{uuid.uuid4().hex[:10]}",
        executors=(),
        reconciler=False,
    ) as client:
        yield client


def _requests() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(operation path, method, url, httpx kwargs): the odd requests a client sends."""
    sent = guest_event(text="hello", session_id="sess-1")
    return [
        (
            "/v1/events",
            "post",
            "/v1/events",
            {"content": b"not json", "headers": {"Content-Type": "application/json"}},
        ),
        ("/v1/events", "post", "/v1/events", {"content": b"{}", "headers": {"Content-Type": "text/plain"}}),
        ("/v1/events", "post", "/v1/events", {"json": [1, 2]}),
        ("/v1/events", "post", "/v1/events", {"json": {**sent, "text": ""}}),
        ("/v1/events", "post", "/v1/events", {"json": {**sent, "extra": 1}}),
        ("/v1/events", "post", "/v1/events?agent=nobody", {"json": sent}),
        ("/v1/events", "post", "/v1/events", {"json": sent, "headers": {"Authorization": "Bearer nope"}}),
        ("/v1/events", "post", "/v1/events", {"json": sent, "headers": {"Authorization": "Basic eA=="}}),
        (
            "/v1/events",
            "post",
            "/v1/events",
            {"content": b"x" * 20000, "headers": {"Content-Type": "application/json"}},
        ),
        ("/v1/runs/{run_id}", "get", "/v1/runs/unknown", {}),
        ("/v1/runs/{run_id}", "get", "/v1/runs/*", {}),
        ("/v1/runs/{run_id}", "get", "/v1/runs/%3E", {}),
        ("/v1/runs/{run_id}", "get", "/v1/runs/" + "r" * 5000, {}),
        ("/v1/runs/{run_id}/events", "get", "/v1/runs/unknown/events?after=-1", {}),
        ("/v1/runs/{run_id}/events", "get", "/v1/runs/*/events", {}),
        ("/v1/runs/{run_id}/reconcile", "post", "/v1/runs/unknown/reconcile", {}),
        ("/v1/runs/{run_id}/reconcile", "post", "/v1/runs/*/reconcile", {}),
        ("/v1/approvals", "get", "/v1/approvals?status=bogus", {}),
        ("/v1/approvals", "get", "/v1/approvals?limit=-5", {}),
        ("/v1/approvals/{approval_id}", "get", "/v1/approvals/unknown", {}),
        ("/v1/approvals/{approval_id}", "get", "/v1/approvals/*", {}),
        ("/v1/approvals/{approval_id}", "post", "/v1/approvals/unknown", {"json": {"decision": "approve"}}),
        ("/v1/approvals/{approval_id}", "post", "/v1/approvals/unknown", {"json": {"decision": "maybe"}}),
        (
            "/v1/approvals/{approval_id}",
            "post",
            "/v1/approvals/unknown",
            {"content": b"[", "headers": {"Content-Type": "application/json"}},
        ),
        ("/v1/approvals/{approval_id}", "post", "/v1/approvals/unknown", {}),
    ]


async def test_every_answer_is_a_documented_response(world: StackClient) -> None:
    http = world.gateway
    wrong: list[str] = []
    for path, method, url, kwargs in _requests():
        response = await http.request(method.upper(), url, **kwargs)
        documented = DOC["paths"][path][method]["responses"]
        status = str(response.status_code)
        seen = f"{method.upper()} {url[:60]} {kwargs.get('headers', '')} -> {status} {response.text[:160]}"
        if status not in documented:
            wrong.append(f"undocumented status: {seen}")
            continue
        if int(status) >= 400:
            try:
                body = response.json()
            except ValueError:
                wrong.append(f"not JSON: {seen}")
                continue
            if not (
                isinstance(body, dict)
                and set(body) == {"error"}
                and {"code", "message"} <= set(body["error"])
            ):
                wrong.append(f"not an ErrorBody: {seen}")
    assert not wrong, "\n".join(wrong)


def _fits(body: Any, schema: dict[str, Any]) -> list[str]:
    """Where `body` leaves the documented schema: a key it lacks (required) or one the schema does not have."""
    if "$ref" in schema:
        schema = DOC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if not isinstance(body, dict) or "properties" not in schema:
        return []
    problems = [f"missing {k}" for k in schema.get("required", []) if k not in body]
    problems += [f"undocumented {k}" for k in body if k not in schema["properties"]]
    return problems


async def test_a_real_runs_answers_have_the_documented_bodies(world: StackClient) -> None:
    http = world.gateway
    sent = guest_event(text="hello", session_id="sess-2")
    answers = {("/v1/events", "post"): await http.post("/v1/events", json=sent)}
    answers[("/v1/events", "post", "again")] = await http.post("/v1/events", json=sent)
    run_id = answers[("/v1/events", "post")].json()["run_id"]
    await world.wait_status(run_id, "completed", timeout_s=20)
    answers[("/v1/runs/{run_id}", "get")] = await http.get(f"/v1/runs/{run_id}")
    answers[("/v1/runs/{run_id}/events", "get")] = await http.get(f"/v1/runs/{run_id}/events")
    answers[("/v1/runs/{run_id}/reconcile", "post")] = await http.post(f"/v1/runs/{run_id}/reconcile")
    answers[("/v1/approvals", "get")] = await http.get("/v1/approvals")
    answers[("/healthz", "get")] = await http.get("/healthz")
    answers[("/readyz", "get")] = await http.get("/readyz")
    wrong = []
    for (path, method, *_), response in answers.items():
        documented = DOC["paths"][path][method]["responses"].get(str(response.status_code))
        if documented is None:
            wrong.append(f"{method} {path}: undocumented {response.status_code} {response.text[:200]}")
            continue
        for problem in _fits(response.json(), documented["content"]["application/json"]["schema"]):
            wrong.append(f"{method} {path} {response.status_code}: {problem}")
    assert not wrong, "\n".join(wrong)
