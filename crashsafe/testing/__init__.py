"""`crashsafe.testing`: what an adopter's tests import to play their agent through the runtime's own decisions,
purely (no broker, no network). Like `crashsafe.sdk`, the public surface: what is not here may change.

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
pure fails the test, as its replay after a crash would decide otherwise."""

from __future__ import annotations

from crashsafe.testing.harness import (
    START,
    Approve,
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

__all__ = [
    "START",
    "Approve",
    "Conversation",
    "Failed",
    "ModelScript",
    "Played",
    "ToolAnswer",
    "ToolAnswers",
    "Unknown",
    "ask",
    "play",
    "reply",
    "tool_call",
]
