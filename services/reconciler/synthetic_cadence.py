"""The synthetic turn on a cadence: at most one per CRASHSAFE_SYNTHETIC_EVERY_S, beside the reconciler's ticks.

The turn goes through the gateway over HTTP with the `synthetic` tenant's key, like any client: the reconciler's
NATS user gains nothing for it but the publish of its result on `<ns>.ops.synthetic.reconciler`. A turn runs in
its own task, so a slow gateway never delays the reconciler's tick; a turn never overlaps the next."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from pathlib import Path

from crashsafe.contracts.synthetic_turn import SYNTHETIC_AGENT, SyntheticResult, SyntheticTurn
from crashsafe.domain.probe import Probe, ProbeAgent
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.settings import Settings
from crashsafe.services.reconciler.synthetic_probe import publish_turn, record, synthetic_turn

# The first turn soon after start (the deployment gate: a fresh rollout shows its seam within seconds), then
# one per `every_s`.
FIRST_AFTER_S = 5.0


class SyntheticCadence:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        logger: logging.Logger,
        gateway_url: str,
        key_file: Path,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.logger = logger
        self.gateway_url = gateway_url
        self.key_file = key_file
        self.turns = 0
        # The registry's declared probe (None: StayHub's own search).
        self.probe: Probe | None = None

    @classmethod
    def configured(
        cls, broker: Broker, settings: Settings, logger: logging.Logger, *, agents: Collection[str]
    ) -> SyntheticCadence | None:
        """The cadence if the settings ask for one (a gateway, a key file and a period above 0) and the registry
        runs the `synthetic` agent (`agents`: its agents, or their names): StayHub's own, or the one a registry's
        declared probe makes (`domain/probe.py`), whose calls each turn then asks. Else None: a registry without
        it would answer every turn 422, so the turn is off, said once at start."""
        if (
            settings.synthetic_every_s <= 0
            or not settings.synthetic_gateway_url
            or settings.synthetic_key_file is None
        ):
            return None
        if SYNTHETIC_AGENT not in agents:
            log(
                logger,
                logging.WARNING,
                "the registry runs no synthetic agent: the synthetic turn is off "
                "(declare one: Registry.of(..., probe=Probe(agent, calls)), docs/adopting.md)",
                agents=sorted(agents),
            )
            return None
        probed = agents.get(SYNTHETIC_AGENT) if isinstance(agents, Mapping) else None
        cadence = cls(broker, settings, logger, settings.synthetic_gateway_url, settings.synthetic_key_file)
        cadence.probe = probed.probe if isinstance(probed, ProbeAgent) else None
        return cadence

    async def run(self, stop: asyncio.Event) -> None:
        delay = min(FIRST_AFTER_S, self.settings.synthetic_every_s)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
                return
            except TimeoutError:
                pass
            await self.once()
            delay = self.settings.synthetic_every_s

    async def once(self) -> None:
        """One turn: run, record in the metrics, publish, log. Never raises (a probe must not stop the reconciler)."""
        budget_s = self.settings.synthetic_budget_s
        try:
            key = self.key_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            key, unreadable = "", f"the synthetic key file {self.key_file} cannot be read: {exc}"[:300]
        else:
            unreadable = "" if key else f"the synthetic key file {self.key_file} is empty"
        if unreadable:
            turn = SyntheticTurn(
                result=SyntheticResult.FAILED.value,
                reason=unreadable,
                duration_s=0.0,
                budget_s=budget_s,
                by="reconciler",
                at=datetime.now(UTC),
            )
        else:
            try:
                turn = await synthetic_turn(
                    self.gateway_url, key, budget_s=budget_s, by="reconciler", probe=self.probe
                )
            except Exception as exc:  # noqa: BLE001 -- a probe's own fault is a failed turn; the cadence goes on
                turn = SyntheticTurn(
                    result=SyntheticResult.FAILED.value,
                    reason=f"the turn could not be judged: {type(exc).__name__}: {exc}"[:300],
                    duration_s=0.0,
                    budget_s=budget_s,
                    by="reconciler",
                    at=datetime.now(UTC),
                )
        self.turns += 1
        record(turn)
        await publish_turn(self.broker, self.settings.namespace, turn, self.logger)
        log(
            self.logger,
            logging.INFO if turn.result == "ok" else logging.WARNING,
            "synthetic turn",
            result=turn.result,
            reason=turn.reason,
            duration_s=turn.duration_s,
            run_id=turn.run_id,
        )
