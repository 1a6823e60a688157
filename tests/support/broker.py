"""JetStream from a test: streams for a namespace, guest events published directly, dead letters, consumer state."""

from __future__ import annotations

from datetime import UTC, datetime

from crashsafe.contracts.dead_letters import DeadLetter, dead_letter_decoder
from crashsafe.contracts.inbound import InboundEvent, InboundMessage, inbound_encoder
from crashsafe.contracts.keys import inbound_hash, run_id_for
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace, StreamKind
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.provisioning import provision


async def ensure_streams(broker: Broker, ns: Namespace) -> None:
    """Every stream and bucket of the namespace, as `crashsafe infra apply` creates them (`broker`: the operator)."""
    await provision(broker, ns)


def action_subject(ns: Namespace, family: str, key: str) -> str:
    return ns.actions_for_key(family, key, DEFAULT_ACTION_PARTITIONS)


async def dead_letters(broker: Broker, ns: Namespace) -> list[DeadLetter]:
    stored = await broker.read_subject(ns.stream(StreamKind.DEAD_LETTERS), ns.dead_letters_all)
    return [dead_letter_decoder.decode(m.data) for m in stored]


async def consumer_settled(broker: Broker, stream: str, durable: str, seq: int) -> bool:
    """The durable consumer has settled (acked or termed) every message up to stream sequence `seq`."""
    info = await broker.js.consumer_info(stream, durable)
    floor = info.ack_floor.stream_seq if info.ack_floor else 0
    return floor >= seq and not info.num_ack_pending


async def consumer_idle(broker: Broker, stream: str, durable: str) -> bool:
    """Nothing waiting for the durable consumer and nothing it holds unacknowledged."""
    info = await broker.js.consumer_info(stream, durable)
    return not info.num_pending and not info.num_ack_pending


async def submit_inbound(
    broker: Broker,
    ns: Namespace,
    event_id: str,
    *,
    agent: str,
    text: str,
    guest_id: str | None = None,
    session_id: str | None = None,
    tenant: str = "",
) -> str:
    """Publish a guest event straight to its inbound subject, as the gateway would; returns its run id. The guest
    and session default to ones of the event's own (`guest-<event_id>`, `sess-<event_id>`); `tenant`, the one
    the gateway would have stamped from the caller's key ("": none)."""
    message = InboundMessage(
        event_id=event_id,
        session_id=session_id or f"sess-{event_id}",
        guest_id=guest_id or f"guest-{event_id}",
        text=text,
    )
    run_id = run_id_for(tenant, event_id)
    event = InboundEvent(
        key=event_id,
        run_id=run_id,
        input_hash=inbound_hash(message, agent),
        message=message,
        agent=agent,
        received_at=datetime.now(UTC),
        tenant=tenant,
    )
    await broker.publish(ns.inbound(run_id), inbound_encoder.encode(event), msg_id=run_id)
    return run_id
