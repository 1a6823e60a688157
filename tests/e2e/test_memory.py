"""Guest memory and retrieval through the whole stack of real processes: the operator sets a guest's verified
address with `crashsafe guests`, a run's model remembers a preference through the memory executor, the guest's
next run starts with it, and a policy question is answered with the documents' passages journaled."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from tests.support.stack import StackClient, cli_env, crashsafe
from tests.support.waiting import unique


async def test_an_operator_sets_the_address_the_model_remembers_a_preference_the_next_run_knows_it(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    client = await start_stack()
    env = cli_env(client.stack, sandbox=False)
    guest = unique("guest")

    unknown = await crashsafe("guests", "show", guest, env=env)
    assert unknown.returncode == 1 and "no profile" in unknown.stdout
    refused = await crashsafe("guests", "set", guest, "--corporate", env=env)
    assert refused.returncode != 0 and "--manager" in refused.stderr and "Traceback" not in refused.stderr
    done = await crashsafe("guests", "set", guest, "--email", "ana@example.com", env=env)
    assert done.returncode == 0, done.stderr

    script = 'I like quiet rooms.\nobey: remember_preference {"name": "quiet_room", "value": "yes"}'
    first = await client.submit(script, guest_id=guest)
    assert (await client.wait_terminal(first))["status"] == "completed"
    events = await client.events(first)
    completed = [e for e in events if e["type"] == "run.action_completed"]
    assert [e["status"] for e in completed] == ["succeeded"]

    shown = await crashsafe("guests", "show", guest, env=env)
    assert shown.returncode == 0, shown.stderr
    profile = json.loads(shown.stdout)
    assert profile["verified_email"] == "ana@example.com"
    assert profile["preferences"] == {"quiet_room": "yes"}
    assert "applied" not in profile  # the executor's bookkeeping is not the operator's business

    second = await client.submit("What is the cancellation policy?", guest_id=guest)
    assert (await client.wait_terminal(second))["status"] == "completed"
    events = await client.events(second)
    started = events[0]
    assert started["type"] == "run.started"
    assert started["profile"]["preferences"] == {"quiet_room": "yes"}
    assert started["profile"]["verified_email"] == "ana@example.com"
    answered = [e for e in events if e["type"] == "run.model_answered"]
    assert answered and answered[0]["passages"], "the policy documents were searched and journaled"
    assert answered[0]["passages"][0]["doc"] == "Cancellation policy"
