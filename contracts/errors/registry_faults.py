"""A registry a deployment cannot run as declared: refused when it is built, so no service starts with it."""

from __future__ import annotations

from crashsafe.contracts.errors.crashsafe_error import CrashsafeError, ErrorCode, RetryClass


class ProbeWrites(CrashsafeError, ValueError):
    """A registry's synthetic probe (`domain/probe.py`) names a tool that is not a read: a probe runs every few
    minutes as the `synthetic` tenant and must be able to change nothing anywhere. A `ValueError` too, as the
    registry's other refusals are."""

    code = ErrorCode.PROBE_WRITES
    retry = RetryClass.POISON

    agent: str
    tools: list[str]

    def explain(self) -> str:
        return (
            f"the probe of agent {self.agent!r} names {', '.join(self.tools)}, which change something (effect write"
            " or money): a probe makes reads only. Name the agent's read tools (Effect.READ) in its calls"
        )
