"""Where a live console stream starts and how many a gateway keeps open: pure rules of services/console/live.py."""

from __future__ import annotations

from crashsafe.services.console.live import StreamSlots, resume_after


def test_a_reconnect_resumes_after_its_last_event_id_else_after_the_rendered_sequence() -> None:
    assert resume_after({"last-event-id": "42"}, {"after": "7"}) == 42
    assert resume_after({}, {"after": "7"}) == 7
    assert resume_after({}, {}) == 0


def test_a_forged_or_ancient_position_never_starts_before_the_floor() -> None:
    assert resume_after({"last-event-id": "-1"}, {"after": "x; drop"}, floor=100) == 100
    assert resume_after({}, {"after": "3"}, floor=100) == 100
    assert resume_after({}, {"after": "9" * 25}, floor=5) == 5


def test_stream_slots_refuse_past_the_limit_and_come_back_when_given_back() -> None:
    slots = StreamSlots(limit=2)
    assert slots.take("a") and slots.take("b")
    assert not slots.take("c")
    slots.give_back("a")
    assert slots.take("c")


def test_one_key_cannot_hold_every_stream_slot_of_the_gateway() -> None:
    # One signed-in key (a script, or a tab reopened in a loop) would otherwise take every slot, and every
    # other tenant's live pages would be told "busy" until its streams go.
    slots = StreamSlots(limit=10, per_client=3)
    assert all(slots.take("greedy") for _ in range(3))
    assert not slots.take("greedy")
    assert slots.take("other")
    slots.give_back("greedy")
    assert slots.take("greedy")


def test_the_floor_is_never_below_the_first_sequence() -> None:
    assert resume_after({}, {}, floor=-4_990) == 0
