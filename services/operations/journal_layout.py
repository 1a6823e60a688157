"""Journals written before event classes (one subject per run, `<ns>.run.<run_id>`) copied onto their classes'
subjects by `crashsafe infra contract` (services/operations/contracting.py), so every reader reads every run it ever
had.

A contracting step: the caller runs it only once no older runtime or projector is alive (an older runtime appends
to the old subject, and a run copied before its last append would lose it). Each run is copied in order with its
version checked across its new subjects, and only past what an earlier, interrupted copy already wrote: running it
again finishes the job and copies nothing twice. A run's old subject is purged once its copy is whole (a subject
that names no run is left as it was). The projector's planner durable is made to start after the copies, so no
run that ended before the upgrade plans its email again (the reconciler still finds one whose plan was missed);
the reconciler reads the copies by their events' own times."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import msgspec

from crashsafe.contracts.run_events import RUN_ENDS, event_class
from crashsafe.contracts.streams import StreamSpec, projector_planner_consumer, stream_specs
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.services.platform.jetstream import Broker

log = logging.getLogger("crashsafe.operations")

# The server's own headers (an old append's version check and dedup id, a direct get's sequence and time) stay
# behind: the copy makes its own. The trace context and the after-the-end mark travel with the event.
_SERVERS = "Nats-"


class _Envelope(msgspec.Struct):
    type: str = ""


_envelope = msgspec.json.Decoder(_Envelope)


@dataclass(frozen=True, slots=True)
class LayoutMigration:
    """What a migration did: runs it copied events of, events copied, old messages it left as not a run's."""

    runs: int = 0
    events: int = 0
    skipped: int = 0


def _type_of(data: bytes) -> str:
    try:
        return _envelope.decode(data).type
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""  # not an event: copied as a step, as it was kept, for the reader to refuse as it always did


async def has_old_layout(broker: Broker, ns: Namespace) -> bool:
    """Whether the RUNS stream still takes the old layout's subjects: something for `migrate_journals` to do."""
    subjects = await broker.stream_subjects(ns.stream(StreamKind.RUNS))
    return subjects is not None and ns.legacy_run_events_all in subjects


async def migrate_journals(broker: Broker, ns: Namespace, replicas: int = 1) -> LayoutMigration:
    """Copy every journal on the old layout onto the new one (see the module's docstring; the caller has made
    sure no older runtime or projector is alive); nothing to do on a deployment that never had it."""
    runs_spec = next(s for s in stream_specs(ns, replicas) if s.name == ns.stream(StreamKind.RUNS))
    legacy = ns.legacy_run_events_all
    if not await has_old_layout(broker, ns):
        return LayoutMigration()
    # Both layouts while the copy runs; the contracting step narrows the stream to the new one after it.
    await broker.ensure_stream(replace(runs_spec, subjects=(legacy, *runs_spec.subjects)))
    done = LayoutMigration()
    for last in await broker.last_on_each_subject(runs_spec.name, legacy):
        run_id = last.subject.removeprefix(f"{ns.name}.run.")
        copied = await _copy_run(broker, ns, runs_spec, run_id)
        if copied is None:
            done = replace(done, skipped=done.skipped + 1)
            continue
        done = replace(done, runs=done.runs + 1, events=done.events + copied) if copied else done
        await broker.purge_subject(runs_spec.name, last.subject)
    # Made whether or not the projector ever ran: a durable it made later would start hours back by receive time,
    # which every copy has.
    planner = projector_planner_consumer(ns)
    await broker.start_consumer_at(planner, await broker.stream_head(runs_spec.name) + 1)
    log.warning(
        "run journals copied onto their event classes' subjects: %d run(s), %d event(s); %d old subject(s) that"
        " name no run left as they were",
        done.runs,
        done.events,
        done.skipped,
    )
    return done


async def _copy_run(broker: Broker, ns: Namespace, runs: StreamSpec, run_id: str) -> int | None:
    """The events of one old journal not yet on the new layout, appended in order; None: not a run's subject."""
    try:
        target = ns.run_events(run_id)
    except ValueError:
        return None
    old = await broker.read_subject(runs.name, f"{ns.name}.run.{run_id}")
    have = await broker.read_subject(runs.name, target)
    seq = have[-1].seq if have else 0
    ended = any(_type_of(m.data) in RUN_ENDS for m in old[: len(have)])
    for message in old[len(have) :]:
        kind = _type_of(message.data)
        headers = {k: v for k, v in message.headers.items() if not k.startswith(_SERVERS)}
        published = await broker.publish(
            ns.run_event(run_id, event_class(kind, ended)),
            message.data,
            expected_subject_seq=seq,
            sequence_subject=target,
            headers=headers or None,
        )
        seq = published.seq
        ended = ended or kind in RUN_ENDS
    return len(old) - len(have)
