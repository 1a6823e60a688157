"""Dead letters: messages a service gave up on, kept with the reason so an operator can act."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import msgspec


class DeadLetter(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type", tag="dead_letter"
):
    service: str
    subject: str
    stream_seq: int
    deliveries: int
    reason: str
    code: str
    payload: str
    at: datetime
    # The error's typed facts (`CrashsafeError.details()`): a refused capability's `reason`, `key`, `tool`.
    details: dict[str, Any] = {}


dead_letter_encoder = msgspec.json.Encoder()
dead_letter_decoder = msgspec.json.Decoder(DeadLetter)


class Settled(StrEnum):
    REPLAYED = "replayed"
    DISCARDED = "discarded"


class DeadLetterMark(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type", tag="dead_letter.mark"
):
    """`<ns>_dead_marks`, key `dead.<stream_seq>`: what an operator did with one dead letter, written once."""

    stream_seq: int
    settled: str  # a Settled
    by: str
    at: datetime
    # What a replay sent: the subject it published to (its original, or the run's wake subject).
    replayed_to: str = ""


dead_mark_encoder = msgspec.json.Encoder()
dead_mark_decoder = msgspec.json.Decoder(DeadLetterMark)
