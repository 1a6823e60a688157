"""`crashsafe config show|validate|publish` against a stack of real processes: a catalog routing the booking agent
over Chat Completions is validated, published, picked up by the running runtime, and pinned by the next run; an
invalid one is refused by `validate` and by `publish`, and the published revision stays in force."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crashsafe.contracts.run_events import ModelAnswered, RunEvent, RunStarted
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from tests.support.stack import StackClient, cli_env, crashsafe, open_stack, operator_access
from tests.support.waiting import eventually
from tests.support.world import EFFECTS, projected


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[StackClient]:
    """The stack's own nats-server, so its users are a deployment's: one namespace, the runtime allowed to read
    and watch the catalog bucket and not to write it (the session server's users cover any namespace)."""
    async with open_stack(tmp_path / "stack", nats_url=None, reconciler=False) as client:
        yield client


async def test_a_catalog_is_validated_published_and_pinned_by_the_next_run(
    stack: StackClient, tmp_path: Path
) -> None:
    env = cli_env(stack.stack)
    state = ("--state-dir", str(tmp_path / "cli"))
    shown = await crashsafe("config", "show", *state, env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.startswith("revision 0 (built-in)")
    catalog = json.loads(shown.stdout)
    booking = catalog["agents"]["booking"]
    booking["routes"] = [{"name": "chat", "model": "scripted-booking", "api": "chat_completions"}]
    booking["budget"]["max_steps"] = 15
    good = tmp_path / "catalog.json"
    good.write_text(json.dumps(catalog))

    checked = await crashsafe("config", "validate", str(good), *state, env=env)
    assert checked.returncode == 0 and checked.stdout.startswith("valid:"), checked
    published = await crashsafe("config", "publish", str(good), "--label", "chat-route", *state, env=env)
    assert published.returncode == 0, published.stderr
    revision = int(published.stdout.strip())
    assert revision > 0

    # The running runtime picks the revision up from its watch; the next run started after that is pinned to it.
    broker = await Broker.connect(stack.stack.nats_url, "tests-config", access=operator_access(stack.stack))
    journal = RunJournal(broker, stack.ns)

    async def a_run_pinned_to_it() -> list[RunEvent] | None:
        run_id, guest = await stack.start_run()
        await stack.wait_terminal(run_id)
        events, _ = await journal.read(run_id)
        first = events[0]
        assert isinstance(first, RunStarted)
        return events if first.catalog_revision == revision else None

    try:
        events = await eventually(a_run_pinned_to_it, what=f"a run pinned to revision {revision}")
    finally:
        await broker.close()
    started = events[0]
    assert isinstance(started, RunStarted) and started.budget.max_steps == 15
    answers = [e for e in events if isinstance(e, ModelAnswered)]
    assert answers and all(a.provider == "chat" and a.response_id.startswith("chatcmpl-") for a in answers)
    # The email and the CRM record follow the paid run (the projector's).
    counts = await projected(lambda: stack.counts(started.guest_id))
    assert {kind: counts[kind] for kind in EFFECTS} == dict.fromkeys(EFFECTS, 1)

    # An invalid catalog: refused by validate and by publish, listing its problems; the revision stays.
    booking["tools"] = ["search_hotels", "transfer_money"]
    booking["budget"]["max_steps"] = 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(catalog))
    for command in ("validate", "publish"):
        refused = await crashsafe("config", command, str(bad), *state, env=env)
        assert refused.returncode == 1, refused
        assert "Traceback" not in refused.stderr
        assert "transfer_money" in refused.stderr and "max_steps" in refused.stderr
    after = await crashsafe("config", "show", *state, env=env)
    assert after.stderr.startswith(f"revision {revision} (chat-route)"), after.stderr
    assert json.loads(after.stdout)["agents"]["booking"]["budget"]["max_steps"] == 15
    builtin = await crashsafe("config", "show", "--revision", "0", *state, env=env)
    assert json.loads(builtin.stdout)["agents"]["booking"]["routes"] == []
