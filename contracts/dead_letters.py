"""Dead letters: messages a service gave up on, kept with the reason so an operator can act."""

from __future__ import annotations

from datetime import datetime

import msgspec


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="dead_letter"):
    service: str
    subject: str
    stream_seq: int
    deliveries: int
    reason: str
    code: str
    payload: str
    at: datetime


dead_letter_encoder = msgspec.json.Encoder()
dead_letter_decoder = msgspec.json.Decoder(DeadLetter)
