"""Support tickets on JetStream: one per handed-off run, published once however often it is sent."""

from __future__ import annotations

import logging

from crashsafe.contracts.errors import CrashsafeError, SubjectFull
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.support import SupportTicket, support_encoder
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log


async def publish_ticket(
    broker: Broker, ns: Namespace, ticket: SupportTicket, logger: logging.Logger
) -> bool:
    """Publish a run's ticket; True once it stands (now or before). False if the broker did not take it: the
    run goes on regardless, and the reconciler's journal scan publishes the ticket later."""
    try:
        await broker.publish(
            ns.support(ticket.tenant, ticket.run_id),
            support_encoder.encode(ticket),
            msg_id=f"support:{ticket.run_id}",
        )
    except SubjectFull:
        return True  # the run's one ticket is there already (discard new per subject)
    except CrashsafeError as exc:
        log(logger, logging.WARNING, "support ticket not published", run_id=ticket.run_id, error=exc.message)
        return False
    return True
