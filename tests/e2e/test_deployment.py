"""A deployment decides which agents run: the gateway admits no others."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from tests.support.stack import StackClient, auth_header


async def test_the_gateway_admits_only_the_agents_the_deployment_registered(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    """`crashsafe up` runs the product's registry: the benchmark's `steps5` is refused, not left to hang."""
    stack = (await start_stack(executors=(), reconciler=False)).stack
    body = {"event_id": "evt-steps", "session_id": "s", "guest_id": "g", "text": "five steps"}
    async with httpx.AsyncClient(
        base_url=stack.gateway_url, timeout=10, headers=auth_header(stack.api_key)
    ) as http:
        refused = await http.post("/v1/events?agent=steps5", json=body)
        assert refused.status_code == 422
        assert "steps5" in refused.json()["error"]["message"]
        assert "booking" in refused.json()["error"]["message"]
        accepted = await http.post("/v1/events", json=body)
        assert accepted.status_code == 202
