"""`crashsafe dead-letters list|replay|discard`: the console's dead-letters page, for a terminal (one home for the
logic: services/operations/dead_letter_tasks.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from crashsafe.contracts.errors import CrashsafeError
from crashsafe.deployment import settings_for
from crashsafe.domain import registry as registries
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.operations.replan import operator_letters


async def dead_letters_command(state_dir: Path, command: str, seq: int | None, show_settled: bool) -> int:
    settings = settings_for(state_dir)
    async with operator_broker(settings, "crashsafe-dead-letters") as broker:
        registry = registries.load(settings.registry)
        letters = operator_letters(broker, settings.namespace, registry)
        if command == "list":
            listed = [s for s in await letters.list() if show_settled or s.mark is None]
            for s in listed:
                letter = s.letter
                state = f"{s.mark.settled} by {s.mark.by}" if s.mark else "open"
                print(
                    f"{s.seq}  {letter.at:%Y-%m-%d %H:%M:%S}  {letter.service}  {letter.subject}  {letter.code}"
                    f"  run {s.run_id or '-'}  {state}  {letter.reason}"
                )
            if not listed:
                print("no dead letters" + ("" if show_settled else " open (--all shows settled ones)"))
            return 0
        assert seq is not None
        stored = await letters.get(seq)
        try:
            if command == "replay":
                mark = await letters.replay(stored, "operator:cli")
                print(f"dead letter {seq} replayed to {mark.replayed_to}")
            else:
                await letters.discard(stored, "operator:cli")
                print(f"dead letter {seq} discarded")
        except CrashsafeError as exc:
            print(f"crashsafe: {exc.message}", file=sys.stderr)
            return 1
        return 0
