"""Pure arithmetic over what the bench saw: percentiles, one phase's figures, and the text the bench prints."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `ordered` must be sorted and non-empty."""
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Latency:
    """Milliseconds: how many samples, their median, 99th percentile and worst."""

    n: int = 0
    p50: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, samples: Iterable[float]) -> Latency:
        ordered = sorted(samples)
        if not ordered:
            return cls()
        return cls(len(ordered), percentile(ordered, 0.50), percentile(ordered, 0.99), ordered[-1])


@dataclass(frozen=True, slots=True)
class RunSample:
    """What the driver recorded about one run, reduced to plain numbers."""

    outcome: str  # completed | handed_off | lost | rejected
    run_ms: float | None
    step_ms: tuple[float, ...]
    model_ms: tuple[float, ...]
    error: str = ""


@dataclass(frozen=True)
class Phase:
    """One measured phase: N runs at concurrency C through one submission path."""

    name: str
    submit: str  # gateway/httpx | gateway/raw | jetstream
    runs: int
    concurrency: int
    wall_s: float
    completed: int
    handed_off: int
    lost: int
    rejected: int
    runs_per_s: float
    steps: int
    steps_per_s: float
    run_ms: Latency
    step_ms: Latency
    model_ms: Latency
    # CPU time each process spent in this phase, per run, and as a share of one core over the phase.
    cpu_ms_per_run: dict[str, float] = field(default_factory=dict)
    cpu_core_share: dict[str, float] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # submit errors by message, most frequent first
    # NATS messages each connection sent (publishes, acks) and received (deliveries, PubAcks), per run.
    messages_per_run: dict[str, tuple[float, float]] = field(default_factory=dict)


def phase_figures(
    name: str,
    submit: str,
    concurrency: int,
    wall_s: float,
    samples: Sequence[RunSample],
    cpu_s: dict[str, float],
    messages: dict[str, tuple[int, int]] | None = None,
) -> Phase:
    finished = [s for s in samples if s.outcome in ("completed", "handed_off")]
    steps = sum(len(s.step_ms) for s in finished)
    wall = max(wall_s, 1e-9)
    return Phase(
        name=name,
        submit=submit,
        runs=len(samples),
        concurrency=concurrency,
        wall_s=wall_s,
        completed=sum(s.outcome == "completed" for s in samples),
        handed_off=sum(s.outcome == "handed_off" for s in samples),
        lost=sum(s.outcome == "lost" for s in samples),
        rejected=sum(s.outcome == "rejected" for s in samples),
        runs_per_s=sum(s.outcome == "completed" for s in samples) / wall,
        steps=steps,
        steps_per_s=steps / wall,
        run_ms=Latency.of(s.run_ms for s in finished if s.run_ms is not None),
        step_ms=Latency.of(ms for s in finished for ms in s.step_ms),
        model_ms=Latency.of(ms for s in finished for ms in s.model_ms),
        cpu_ms_per_run={k: 1000 * v / max(len(samples), 1) for k, v in cpu_s.items()},
        cpu_core_share={k: v / wall for k, v in cpu_s.items()},
        errors=dict(Counter(s.error for s in samples if s.error).most_common(5)),
        messages_per_run={
            k: (sent / max(len(samples), 1), got / max(len(samples), 1))
            for k, (sent, got) in (messages or {}).items()
        },
    )


# Text ---------------------------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def phase_table(phases: Sequence[Phase]) -> str:
    header = (
        f"{'phase':<12}{'via':<15}{'runs':>6}{'C':>4}{'ok':>6}{'other':>6}{'wall s':>8}{'runs/s':>8}{'steps/s':>9}"
        f"{'run p50':>9}{'run p99':>9}{'step p50':>9}{'step p99':>9}{'model p50':>10}{'model p99':>10}"
    )
    lines = [header, "-" * len(header)]
    for p in phases:
        other = p.handed_off + p.lost + p.rejected
        # A throughput phase that watched only each run's end has no step timings (`--step-times` adds them).
        timed = p.step_ms.n > 0
        steps_per_s = f"{p.steps_per_s:>9.1f}" if timed else f"{'-':>9}"
        step50 = _ms(p.step_ms.p50) if timed else "-"
        step99 = _ms(p.step_ms.p99) if timed else "-"
        model50 = _ms(p.model_ms.p50) if p.model_ms.n else "-"
        model99 = _ms(p.model_ms.p99) if p.model_ms.n else "-"
        lines.append(
            f"{p.name:<12}{p.submit:<15}{p.runs:>6}{p.concurrency:>4}{p.completed:>6}{other:>6}{p.wall_s:>8.2f}"
            f"{p.runs_per_s:>8.1f}{steps_per_s}{_ms(p.run_ms.p50):>9}{_ms(p.run_ms.p99):>9}"
            f"{step50:>9}{step99:>9}{model50:>10}{model99:>10}"
        )
    lines.append("(latencies in ms; 'other' = handed off + lost + rejected at submit)")
    for p in phases:
        for error, count in p.errors.items():
            lines.append(f"  {p.name} {p.submit}: {count} x {error}")
    return "\n".join(lines)


def cpu_table(phases: Sequence[Phase]) -> str:
    names = list(dict.fromkeys(k for p in phases for k in p.cpu_ms_per_run))
    header = f"{'CPU ms/run (core share)':<26}" + "".join(f"{n:>22}" for n in names) + f"{'machine busy':>14}"
    lines = [header]
    for p in phases:
        cells = "".join(
            f"{p.cpu_ms_per_run.get(n, 0):>13.2f} ({p.cpu_core_share.get(n, 0):>4.0%})" for n in names
        )
        lines.append(f"{p.name + ' ' + p.submit:<26}{cells}{sum(p.cpu_core_share.values()):>14.0%}")
    lines.append(
        "(core share = CPU seconds / wall seconds, so 100% is one core of the machine's cores; 'not ours' is load from"
    )
    lines.append(" processes outside this bench's stack and driver, e.g. other users or py-spy)")
    return "\n".join(lines)


def messages_table(phases: Sequence[Phase]) -> str:
    """NATS messages per run by connection: sent to the server / received from it (nats-server's /connz)."""
    names = sorted({k for p in phases for k in p.messages_per_run})
    if not names:
        return ""
    header = f"{'NATS msgs/run sent/recv':<26}" + "".join(f"{n:>22}" for n in names)
    lines = [header]
    for p in phases:
        cells = "".join(
            f"{p.messages_per_run[n][0]:>10.1f} /{p.messages_per_run[n][1]:>9.1f}"
            if n in p.messages_per_run
            else f"{'-':>22}"
            for n in names
        )
        lines.append(f"{p.name + ' ' + p.submit:<26}{cells}")
    lines.append(
        "(sent: publishes and acks; received: deliveries, PubAcks and replies; counted by nats-server)"
    )
    return "\n".join(lines)


def rss_line(peak_rss_mb: dict[str, float | None]) -> str:
    cells = [f"{name} {mb:.1f}" if mb is not None else f"{name} ?" for name, mb in peak_rss_mb.items()]
    return "peak RSS (VmHWM, MB): " + " | ".join(cells)


def verdict(
    phases: Sequence[Phase],
    bar_runs_per_s: float,
    bar_step_p50_ms: float | None,
    peak_rss_mb: dict[str, float | None],
    bar_rss_mb: float,
) -> str:
    best = max(phases, key=lambda p: p.runs_per_s)
    parts = [
        f"best throughput {best.runs_per_s:.1f} runs/s ({best.name}/{best.submit}) vs bar {bar_runs_per_s:.0f}"
    ]
    if bar_step_p50_ms is not None:
        fastest = min(phases, key=lambda p: p.step_ms.p50 if p.step_ms.n else float("inf"))
        parts.append(
            f"best step p50 {fastest.step_ms.p50:.2f} ms ({fastest.name}/{fastest.submit}) vs bar {bar_step_p50_ms:g} ms"
        )
    over = [n for n, mb in peak_rss_mb.items() if mb is not None and mb >= bar_rss_mb and n != "nats-server"]
    parts.append(f"services over {bar_rss_mb:.0f} MB RSS: {', '.join(over) or 'none'}")
    return "; ".join(parts)


def to_json(value: Any) -> Any:
    """Dataclasses to plain dicts for --json."""
    if hasattr(value, "__dataclass_fields__"):
        return {k: to_json(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)
    return value
