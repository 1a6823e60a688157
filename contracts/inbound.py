"""Guest events as the gateway accepts them over HTTP and hands them to the runtime over JetStream."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@\-]+$")]
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]

MAX_BODY_BYTES = 16 * 1024


class GuestMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of `POST /v1/events`: strict, because a typo must be a 422, not a silently dropped field."""

    event_id: Id
    session_id: Id
    guest_id: Id
    text: Text


class InboundMessage(msgspec.Struct, frozen=True):
    """The guest message as it travels on JetStream: the same fields, but lenient, so old readers skip new ones."""

    event_id: str
    session_id: str
    guest_id: str
    text: str

    @classmethod
    def of(cls, message: GuestMessage) -> InboundMessage:
        return cls(message.event_id, message.session_id, message.guest_id, message.text)


class InboundEvent(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="inbound.guest_message"):
    """A guest message accepted by the gateway, bound to its run; published once per idempotency key."""

    key: str
    run_id: str
    input_hash: str
    message: InboundMessage
    # The agent asked to handle it. Empty: the deployment's default agent (`Registry.default_agent`, its first
    # registration), resolved by the reader (`intake.addressed`). The gateway always names one.
    agent: str = ""
    received_at: datetime
    # The tenant of the client that sent it (its API key's); part of the run's identity (`run_id_for`).
    tenant: str = ""
    # A further message of a session whose run is active: the run id it is a turn of (the session lane). Empty:
    # the message starts its own run (`run_id`). The event still travels on its own inbound subject, whose
    # one-message guard dedups it forever.
    turn_of: str = ""
    # The id of the client key that sent it (never its secret): a run records who started it, so that key never
    # decides the run's approvals. "": a gateway from before this field (who sent it is not known).
    sent_by: str = ""


inbound_encoder = msgspec.json.Encoder()
inbound_decoder = msgspec.json.Decoder(InboundEvent)
guest_message_decoder = msgspec.json.Decoder(GuestMessage)
