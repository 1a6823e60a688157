"""Which process of a stack a crash seam kills: `SEAM[@FAMILY or SERVICE]` read as one service of the stack, for
`crashsafe up --crash`, `crashsafe crash-test` and `crashsafe.testing.real_stack` alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from crashsafe.services.platform.crashpoints import SEAMS

# What a service reads its seam from. A stack never hands its own environment's value to its services (every
# process passing the seam would die, every replica and every executor at once); `crashsafe up` reads it as one
# `--crash` instead, and says so.
CRASH_VARIABLE = "CRASHSAFE_CRASH_AT"


class CrashTargetError(ValueError):
    """A crash no service of the stack can be armed with: says which seams, families or services there are."""


@dataclass(frozen=True, slots=True)
class CrashAt:
    """One seam armed in one service of a stack (each of its replicas), for one life: the supervisor restarts it
    without the seam, as Kubernetes restarts a crashed pod."""

    seam: str
    service: str

    def __str__(self) -> str:
        return f"{self.seam}@{self.service}"


def process_of(seam: str) -> str:
    """The process a seam is in: `executor`, `runtime`, `gateway`, `reconciler` or `projector`."""
    return seam.split(".", 1)[0]


def parse_crash(spec: str, families: Sequence[str]) -> CrashAt:
    """`executor.after_provider_ack@deposits` (a tool family, or `executor-deposits`), `runtime.after_model_answer`.
    An executor's seam names its family unless the registry has only one."""
    seam, _, target = spec.strip().partition("@")
    if seam not in SEAMS:
        raise CrashTargetError(f"{spec!r}: {seam!r} is not a seam; the seams: {', '.join(SEAMS)}")
    process = process_of(seam)
    if process != "executor":
        if target and target != process:
            raise CrashTargetError(f"{spec!r}: {seam} is a seam of the {process}, not of {target}")
        return CrashAt(seam, process)
    family = target.removeprefix("executor-") if target else (families[0] if len(families) == 1 else "")
    if family not in families:
        said = f"no tool family {family!r}" if target else f"which executor? {len(families)} tool families"
        raise CrashTargetError(
            f"{spec!r}: {said}; name one: {seam}@FAMILY, FAMILY one of {', '.join(sorted(families))}"
        )
    return CrashAt(seam, f"executor-{family}")


def every_crash(families: Iterable[str]) -> list[CrashAt]:
    """Every seam of docs/failure-modes.md in its order, an executor's at each tool family."""
    crashes: list[CrashAt] = []
    for seam in SEAMS:
        process = process_of(seam)
        if process == "executor":
            crashes += [CrashAt(seam, f"executor-{family}") for family in sorted(families)]
        else:
            crashes.append(CrashAt(seam, process))
    return crashes


def crash_map(crashes: Iterable[CrashAt]) -> dict[str, str]:
    """As `crashsafe.stack.Stack(crash=…)` takes them, {service: seam}: a process dies once, at one seam."""
    armed: dict[str, str] = {}
    for crash in crashes:
        if armed.get(crash.service, crash.seam) != crash.seam:
            raise CrashTargetError(
                f"{crash.service} armed at {armed[crash.service]} and at {crash.seam}: a process dies once;"
                " crash it at one seam per stack"
            )
        armed[crash.service] = crash.seam
    return armed


def check_armable(crash: Mapping[str, str], services: Mapping[str, str]) -> None:
    """Every crash of a stack names one of its services (`services`: name -> base), by name or by base, at a seam
    of that service's process: one that named no process would never fire, and the test would prove nothing."""
    for name, seam in crash.items():
        bases = {base for service, base in services.items() if name in (service, base)}
        if not bases:
            raise CrashTargetError(
                f"crash at {seam} in {name!r}: no such service in this stack; it has {', '.join(sorted(services))}"
            )
        process = process_of(seam)
        if any(base != process and not base.startswith(f"{process}-") for base in bases):
            raise CrashTargetError(f"crash at {seam} in {name!r}: that seam is in the {process}")


def crash_for_up(
    given: Sequence[str], from_environment: str | None, families: Sequence[str]
) -> tuple[list[CrashAt], list[str]]:
    """What `crashsafe up` arms: each `--crash`, else `CRASHSAFE_CRASH_AT` (`from_environment`, `Settings.crash_at`)
    read as one; and the lines it prints about them, so a seam is never dropped without a word."""
    from_environment = (from_environment or "").strip()
    notes: list[str] = []
    specs = list(given)
    if from_environment and specs:
        notes.append(f"{CRASH_VARIABLE}={from_environment} not used: --crash names the seams")
    elif from_environment:
        specs = [from_environment]
    crashes = [parse_crash(spec, families) for spec in specs]
    crash_map(crashes)
    source = f" (from {CRASH_VARIABLE})" if from_environment and not given else ""
    for crash in crashes:
        notes.append(
            f"{crash.seam} in {crash.service}{source}: SIGKILL once there, restarted without it by the supervisor"
        )
    return crashes, notes
