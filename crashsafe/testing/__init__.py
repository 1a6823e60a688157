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
finds none, each field being in the identity or named in the contract's `outside_identity`."""

from __future__ import annotations

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

__all__ = [
    "START",
    "Approve",
    "Call",
    "Conflicted",
    "Conversation",
    "Failed",
    "IdentityGap",
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
    "reply",
    "respond",
    "step",
    "tool_call",
]
