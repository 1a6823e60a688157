"""Guest memory and retrieval through the whole stack of real processes: the operator sets a guest's verified
address with `crashsafe guests`, a run's model remembers a preference through the memory executor, the guest's
next run starts with it, and a policy question is answered with the documents' passages journaled."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from crashsafe.contracts.memory import profile_decoder
from crashsafe.contracts.streams import guests_spec
from crashsafe.services.platform.jetstream import Broker
from tests.support.journals import step, trail
from tests.support.stack import StackClient, cli_env, crashsafe, supervised
from tests.support.waiting import eventually, unique

REMEMBER = 'I like quiet rooms.\nobey: remember_preference {"name": "quiet_room", "value": "yes"}'


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

    first = await client.submit(REMEMBER, guest_id=guest)
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


async def test_the_memory_executor_killed_after_its_write_before_the_receipt_writes_once(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    client = await start_stack(
        crash={"executor-memory": "executor.after_provider_ack"}, env={"CRASHSAFE_ACK_WAIT_S": "1"}
    )
    env = cli_env(client.stack, sandbox=False)
    guest = unique("guest")
    # `--verified-email` is `--email`'s long name (the eval suite's operator uses it).
    assert (
        await crashsafe("guests", "set", guest, "--verified-email", "ana@example.com", env=env)
    ).returncode == 0
    async with supervised(client.stack):
        run_id = await client.submit(REMEMBER, guest_id=guest)
        summary = await client.wait_terminal(run_id)
        await eventually(
            lambda: client.stack.services["executor-memory"].restarts >= 1,
            what="the memory executor restarted after its kill",
            timeout_s=30,
        )

    assert summary["status"] == "completed", summary
    request, receipt = step(await client.events(run_id), "remember_preference")
    assert receipt is not None and receipt["status"] == "succeeded"
    # The restarted executor found its open intent, asked the record by key, and found its own write.
    assert receipt["via"] == "provider_lookup" and ("provider.lookup", "found") in trail(receipt), receipt
    entry = await broker.kv_get(guests_spec(client.ns), client.ns.guest_key(client.tenant, guest))
    assert entry is not None
    profile = profile_decoder.decode(entry.value)
    assert profile.preferences == {"quiet_room": "yes"} and profile.applied == [request["key"]]
    # This namespace's bucket saw two writes in all: the operator's address, then the one preference.
    assert entry.revision == 2
