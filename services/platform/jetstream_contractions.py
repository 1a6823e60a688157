"""The Broker's contracting calls (`crashsafe infra contract`): what takes away a stream's subjects, which every other
declaration keeps (an older release running beside this one may still write there)."""

from __future__ import annotations

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from crashsafe.contracts.errors import BrokerUnavailable
from crashsafe.contracts.streams import StreamSpec


class Contractions:
    js: JetStreamContext

    async def narrow_stream(self, spec: StreamSpec) -> list[str]:
        """Make the stream take exactly `spec`'s subjects, all else as the server has it; the subjects taken away
        (none from a stream that does not exist: contracting makes nothing). Its messages stay: a subject it no
        longer takes is only refused to new publishes."""
        try:
            config = (await self.js.stream_info(spec.name)).config
        except nats.js.errors.NotFoundError:
            return []
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise BrokerUnavailable(f"JetStream did not answer about stream {spec.name}: {exc}") from exc
        dropped = [s for s in config.subjects or [] if s not in spec.subjects]
        if dropped or set(spec.subjects) - set(config.subjects or []):
            config.subjects = list(spec.subjects)
            await self.js.update_stream(config)
        return dropped
