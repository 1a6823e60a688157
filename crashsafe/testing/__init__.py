"""`crashsafe.testing`: what an adopter's tests and evals import. Like `crashsafe.sdk`, the public surface: what is
not here may change. Pure (no broker, no network): the scripted model's HTTP server is `crashsafe.testing.model_server`
(`python -m crashsafe.testing MODULE:FUNCTION`), imported only when run.

The harness plays an agent through the runtime's own decisions, the test playing the model and the providers:

    played = play(
        MyAgent(),
        "A desk on Friday",
        model=[ask("find_slots", day="2030-01-11"), ask("reserve_slot", slot_id="s1", day="2030-01-11"),
               reply("Reserved.")],
        tools={"find_slots": {"slots": [...]}, "reserve_slot": lambda args: {"reservation_id": "r1", ...}},
    )
    assert played.status == "completed" and played.requested[-1][0] == "reserve_slot"

`Conversation` plays several turns (`say`), a guest's "yes" to an approval, a manager's decision (`approve=`) and
an approval running out (`expire`). Each move is decided twice from the same journal: an agent whose hooks are not
pure fails the test, as its replay after a crash would decide otherwise. The scripted model (`Script`, `step`,
`respond`) answers a run's transcript, the same script in memory and served on the OpenAI protocol. A model that
already speaks that protocol is replayed from its recorded answers: `play(agent, text, model=read_responses(path))`.

`identity_gaps(registry)` points out a business-keyed tool whose model arguments reach outside its identity (asked
again with another value, the same key brings other input: a conflict, not a second effect): a test asserts it
finds none, each field being in the identity or named in the contract's `outside_identity`.

`real_stack` is the other side: the agent on a stack of real processes, a seam armed to SIGKILL one of them, and
every keyed effect asked about by key afterwards (`crashsafe.testing.live_stack`, imported only when asked for):

    async with real_stack("desks.registry:registry", model=script, providers=url, crash="executor.after_intent") as s:
        run_id = await s.start_run("A slot on 2031-05-04")
        assert (await s.wait_terminal(run_id))["status"] == "completed"
        assert await s.crashed() == ["executor-desks"] and (await s.audit()).ok"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crashsafe.domain.identity_check import IdentityGap, identity_gaps
from crashsafe.testing.harness import (
    START,
    Approve,
    Conflicted,
    Conversation,
    Failed,
    ModelScript,
    Played,
    ToolAnswer,
    ToolAnswers,
    Unknown,
    ask,
    play,
    reply,
    tool_call,
)
from crashsafe.testing.recorded import read_responses
from crashsafe.testing.scripted import (
    Call,
    ModelTurn,
    Say,
    Script,
    ToolResult,
    Transcript,
    respond,
    step,
)

if TYPE_CHECKING:
    from crashsafe.testing.live_stack import EffectAudit, LiveStack, real_stack

# The real stack's names, imported when first asked for: the harness above stays pure (no broker, no processes).
_LIVE = ("EffectAudit", "LiveStack", "real_stack")


def __getattr__(name: str) -> Any:
    if name in _LIVE:
        from crashsafe.testing import live_stack

        return getattr(live_stack, name)
    raise AttributeError(f"module 'crashsafe.testing' has no attribute {name!r}")


__all__ = [
    "START",
    "Approve",
    "Call",
    "Conflicted",
    "Conversation",
    "EffectAudit",
    "Failed",
    "IdentityGap",
    "LiveStack",
    "ModelScript",
    "ModelTurn",
    "Played",
    "Say",
    "Script",
    "ToolAnswer",
    "ToolAnswers",
    "ToolResult",
    "Transcript",
    "Unknown",
    "ask",
    "identity_gaps",
    "play",
    "read_responses",
    "real_stack",
    "reply",
    "respond",
    "step",
    "tool_call",
]
