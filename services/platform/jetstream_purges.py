"""The Broker's purge of one run's journal subjects (the archiver's, once the run's archive is read back whole), and
how many subjects a filter still holds (what the archive bounds: a kept subject costs every node memory)."""

from __future__ import annotations

import json

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from crashsafe.contracts.errors import BrokerUnavailable
from crashsafe.contracts.jetstream_api import API

_WAIT_S = 10.0


class Purges:
    nc: Client
    js: JetStreamContext

    async def purge_filter(self, stream: str, subject_filter: str, *, before_seq: int | None = None) -> int:
        """Remove the messages of `stream` on `subject_filter` (`<ns>.run.<run_id>.>`), only those before stream
        sequence `before_seq` if given (one stored after what the caller read is kept); how many went. The filter
        travels in the body: a NATS permission cannot narrow it, so only the roles that archive are granted it."""
        subject = f"{API}.STREAM.PURGE.{stream}"
        request: dict[str, object] = {"filter": subject_filter}
        if before_seq is not None:
            request["seq"] = before_seq
        try:
            answer = await self.nc.request(subject, json.dumps(request).encode(), _WAIT_S)
        except (TimeoutError, nats.errors.Error) as exc:
            raise BrokerUnavailable(
                f"JetStream did not answer a purge of {subject_filter} from {stream}: {exc}; tried again on the"
                " next pass (the archive is written already)",
                subject=subject,
            ) from exc
        body = json.loads(answer.data or b"{}")
        if not body.get("success"):
            error = body.get("error") or {}
            raise BrokerUnavailable(
                f"JetStream refused a purge of {subject_filter} from {stream}:"
                f" {error.get('description', 'no reason given')}",
                subject=subject,
            )
        return int(body.get("purged", 0))

    async def subject_count(self, stream: str, subject_filter: str) -> int:
        """How many subjects of `stream` match `subject_filter` (STREAM.INFO with `subjects_filter`)."""
        try:
            info = await self.js.stream_info(stream, subjects_filter=subject_filter)
        except (TimeoutError, nats.errors.Error) as exc:
            raise BrokerUnavailable(f"cannot read {stream}: {exc}; try again once NATS answers") from exc
        return len(info.state.subjects or {})
