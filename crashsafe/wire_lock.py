"""The wire lock (contracts/wire.json): what a release declares on the broker, and what the next one may change of it.

A release runs beside the one before it on one broker, forward and back (docs/upgrading.md), so everything on the
broker changes by expand and contract: new names beside the old, never an edit in place. `current()` reads the
broker-side contract of this tree for the canonical deployment (the default namespace, the reference registry's
families and projection tools, `DEFAULT_ACTION_PARTITIONS`); `wire_breaks(previous, now)` names, one sentence
each, what `now` breaks of the previous release's snapshot (contracts/releases/<version>.json):

- a stream is never removed or renamed; the subjects it takes only grow (a wider subject may replace a narrower);
- its retention, per-subject limit, discard-new-per-subject and message scheduling never change, and it never
  keeps messages for a shorter time;
- a durable consumer the previous release declares keeps its shape (stream, filter, pull or push, ack policy,
  max deliver, back-off, deliver policy): a new shape takes a new durable name. A durable this release no longer
  declares is fine: the previous release's processes still use it, and a contract step removes it later;
- a new durable on a work-queue stream never overlaps a filter of the previous release's durables on it (the
  server takes one reader per subject of a work queue): a new reader there takes new subjects; a new durable
  taking over a previous one's filter on a stream with history does not start from the first message;
- the action partitions never change (a key would go to two executors, one per release);
- a bucket is never removed and its history never shrinks;
- every subject a role of the previous release publishes into a stream or bucket is still taken by one here
  (else the old writers would be refused);
- a subject outside the streams (a request) that a role of either release sends has a subscriber in both (else
  it is lost, or has no responders);
- a subject a role of this release publishes into a stream the previous release also had is one the previous
  release's stream took already: write a new subject one release after adding it (the previous release's `infra
  apply`, run on a rollback, would drop it again, and its readers of that stream never see it). A subject of a
  stream or bucket new in this release is expansion: the previous release neither reads nor provisions it;
- a message type travels only on subjects the previous release carried it on (its readers do not look
  elsewhere): a new layout is a new subject, written once the release before reads it too;
- a message type (tag) and a header name are never removed.

Consumer fields that are tuning, not shape (ack wait, max ack pending, pull expiry, a start look-back's length),
stream replicas and the duplicate window are not locked: the server changes them in place for either release.

This module runs unchanged against an older release's tree (`python -m crashsafe.release_snapshot`, which
snapshots one): it imports only what every release since 0.1.0 has, and the rules below are plain functions.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from crashsafe import stream_catalog
from crashsafe.contract_catalog import CHANNEL_MESSAGES, NS, messages, tag_of, templates, wildcard
from crashsafe.contracts.headers import Header
from crashsafe.contracts.nats_permissions import users
from crashsafe.contracts.streams import ConsumerSpec, StreamSpec
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace

Wire = dict[str, Any]

# What a stream may never change, whichever release applies it (the other would apply its own).
FIXED_STREAM_FIELDS = ("retention", "max_msgs_per_subject", "discard_new_per_subject", "allow_msg_schedules")


def stream_entry(spec: StreamSpec) -> dict[str, Any]:
    return {
        "subjects": sorted(spec.subjects),
        "retention": str(spec.retention),
        "max_age_s": spec.max_age_s,
        "max_msgs_per_subject": spec.max_msgs_per_subject,
        "discard_new_per_subject": spec.discard_new_per_subject,
        "allow_msg_schedules": spec.allow_msg_schedules,
    }


def consumer_entry(spec: ConsumerSpec) -> dict[str, Any]:
    """A durable's shape: what the server cannot change in place, or what changes what it delivers. The platform
    adapter acks every durable explicitly and delivers a durable with a start look-back from a start time (its
    length only matters when it is created), every other one from the first message; a spec that names either
    policy itself is read from it."""
    deliver = "all" if spec.start_lookback_s is None else "by_start_time"
    return {
        "stream": spec.stream,
        "filter_subject": spec.filter_subject,
        "pull": spec.pull,
        "ack_policy": str(getattr(spec, "ack_policy", "explicit")),
        "max_deliver": spec.max_deliver,
        "backoff_s": list(spec.backoff_s),
        "deliver_policy": str(getattr(spec, "deliver_policy", deliver)),
    }


def _named(subjects: tuple[str, ...], ns: Namespace) -> list[str]:
    """A role's own subjects and buckets: not the JetStream API, not inboxes, and not an admin's grant of the whole
    namespace or of every bucket (the operator's), which names no subject in particular."""
    everything = {f"{ns.name}.>", "$KV.>"}
    return sorted({s for s in subjects if s.startswith((f"{ns.name}.", "$KV.")) and s not in everything})


def current(ns: Namespace = NS) -> Wire:
    """This tree's broker-side contract for the canonical deployment, as plain JSON-ready data."""
    consumers: dict[str, Any] = {}
    for c in stream_catalog.consumers(ns):
        entry = consumer_entry(c.spec)
        if consumers.setdefault(c.spec.durable, entry) != entry:
            raise ValueError(f"durable {c.spec.durable} is declared twice with two shapes")
    families = stream_catalog.registry().families
    roles = sorted(users(ns, families, DEFAULT_ACTION_PARTITIONS), key=lambda u: u.name)
    by_method = {t.method: wildcard(t) for t in templates(ns)}
    channels: dict[str, set[str]] = {}
    for method, carried in CHANNEL_MESSAGES.items():
        for tag in carried:
            channels.setdefault(tag, set()).add(by_method[method])
    return {
        "namespace": ns.name,
        "action_partitions": DEFAULT_ACTION_PARTITIONS,
        "streams": {
            s.name: stream_entry(s) for s in sorted(stream_catalog.streams(ns), key=lambda s: s.name)
        },
        "consumers": dict(sorted(consumers.items())),
        "buckets": dict(sorted((kv.bucket, {"history": kv.history}) for kv, _ in stream_catalog.buckets(ns))),
        "publishes": {u.name: _named(u.permissions.publish, ns) for u in roles},
        "subscribes": {u.name: _named(u.permissions.subscribe, ns) for u in roles},
        "channels": {tag: sorted(subjects) for tag, subjects in sorted(channels.items())},
        "tags": sorted({t for m in messages() if (t := tag_of(m.cls))}),
        "headers": sorted(h.value for h in Header),
    }


# The rules ------------------------------------------------------------------------------------------------------


def covers(wide: str, narrow: str) -> bool:
    """Every subject `narrow` matches, `wide` matches too (NATS wildcards: `*` one token, `>` the rest)."""
    w, n = wide.split("."), narrow.split(".")
    for i, token in enumerate(w):
        if token == ">":
            return len(n) > i
        if i >= len(n) or n[i] == ">" or (token != "*" and token != n[i]):
            return False
    return len(w) == len(n)


def _stores(wire: Wire) -> dict[str, list[str]]:
    """Every stream of a release with the subjects it takes; a bucket is its `KV_` stream, taking `$KV.<bucket>.>`."""
    found = {name: list(s["subjects"]) for name, s in wire["streams"].items()}
    found |= {f"KV_{bucket}": [f"$KV.{bucket}.>"] for bucket in wire["buckets"]}
    return found


def _store_of(subject: str, stores: dict[str, list[str]]) -> str | None:
    """The stream that takes every message published to `subject` (None: core NATS, or no single stream)."""
    return next((name for name, taken in stores.items() if any(covers(t, subject) for t in taken)), None)


def _stream_breaks(previous: Wire, now: Wire) -> list[str]:
    problems = []
    for name, was in sorted(previous["streams"].items()):
        then = now["streams"].get(name)
        if then is None:
            problems.append(
                f"stream {name}: removed or renamed (a stream stays until a contract release; a new one goes "
                "beside it)"
            )
            continue
        for subject in was["subjects"]:
            if not any(covers(s, subject) for s in then["subjects"]):
                problems.append(
                    f"stream {name}: no longer takes {subject} (a stream's subjects only grow: the previous "
                    "release's writers publish there)"
                )
        for field in FIXED_STREAM_FIELDS:
            if then.get(field) != was[field]:
                problems.append(
                    f"stream {name}: {field} changed from {was[field]} to {then.get(field)} (retention and "
                    "per-subject limits never change: each release would apply its own)"
                )
        if _kept_less(was["max_age_s"], then["max_age_s"]):
            problems.append(
                f"stream {name}: keeps messages for less (max_age_s {was['max_age_s']} to {then['max_age_s']};"
                " 0 is forever): what the previous release counts on finding would be gone"
            )
    return problems


def _kept_less(was_s: float, now_s: float) -> bool:
    """A shorter age limit (0 is forever)."""
    return now_s != 0 and (was_s == 0 or now_s < was_s)


def collide(a: str, b: str) -> bool:
    """Some subject matches both filters."""
    x, y = a.split("."), b.split(".")
    for i in range(max(len(x), len(y))):
        if i >= len(x) or i >= len(y):
            return False
        if x[i] == ">" or y[i] == ">":
            return True
        if x[i] != "*" and y[i] != "*" and x[i] != y[i]:
            return False
    return True


def _consumer_breaks(previous: Wire, now: Wire) -> list[str]:
    problems = []
    for durable, was in sorted(previous["consumers"].items()):
        then = now["consumers"].get(durable)
        if then is None:
            continue  # no longer declared: the previous release's processes still use it; a contract step ends it
        changed = [f"{k} {was[k]} to {then.get(k)}" for k in sorted(was) if then.get(k) != was[k]]
        if changed:
            problems.append(
                f"consumer {durable}: redefined in place ({', '.join(changed)}): a durable the previous release "
                "uses keeps its shape; a new shape takes a new durable name"
            )
    return problems + _new_consumer_breaks(previous, now)


def _new_consumer_breaks(previous: Wire, now: Wire) -> list[str]:
    """A new durable beside one of the previous release's: a work-queue stream takes one reader per subject (the
    server refuses a durable whose filter overlaps another's), and one that takes over another's filter on a
    stream with history must not start from its first message (it would do again what the other did)."""
    problems = []
    queues = {name for name, s in previous["streams"].items() if s["retention"] == "workqueue"}
    for durable, then in sorted(now["consumers"].items()):
        if durable in previous["consumers"]:
            continue
        for old, was in sorted(previous["consumers"].items()):
            if was["stream"] != then["stream"]:
                continue
            if then["stream"] in queues and collide(was["filter_subject"], then["filter_subject"]):
                problems.append(
                    f"consumer {durable}: new on work-queue stream {then['stream']}, its filter overlapping "
                    f"{old}'s, which the previous release reads it with: the server refuses it while {old} "
                    "exists; a new reader of a work queue takes new subjects"
                )
            elif then["filter_subject"] == was["filter_subject"] and then["deliver_policy"] == "all":
                problems.append(
                    f"consumer {durable}: takes over {old}'s filter on {then['stream']} from the stream's first "
                    f"message: it would deliver again everything {old} did; start it where {old} is (a start "
                    "look-back, a start sequence)"
                )
    return problems


def _bucket_breaks(previous: Wire, now: Wire) -> list[str]:
    problems = []
    for bucket, was in sorted(previous["buckets"].items()):
        then = now["buckets"].get(bucket)
        if then is None:
            problems.append(f"bucket {bucket}: removed (a bucket stays until a contract release)")
        elif then["history"] < was["history"]:
            problems.append(
                f"bucket {bucket}: history shrunk from {was['history']} to {then['history']} (the values the "
                "previous release reads back would be gone)"
            )
    return problems


def _read(subject: str, wire: Wire) -> bool:
    """Some role of a release subscribes to some subject `subject` matches (a request it answers)."""
    return any(collide(s, subject) for subjects in wire["subscribes"].values() for s in subjects)


def _writer_breaks(previous: Wire, now: Wire) -> list[str]:
    problems = []
    before, after = _stores(previous), _stores(now)
    for role, subjects in sorted(previous["publishes"].items()):
        for subject in subjects:
            if _store_of(subject, before) and not _store_of(subject, after):
                problems.append(
                    f"role {role} of the previous release publishes {subject}, which no stream or bucket takes "
                    "now: its writes would be refused (a subject stays taken until a contract release)"
                )
            elif not _store_of(subject, before) and _read(subject, previous) and not _read(subject, now):
                problems.append(
                    f"role {role} of the previous release sends {subject}, which no role subscribes to now: its "
                    "requests would have no responders (a reader stays until a contract release)"
                )
    for role, subjects in sorted(now["publishes"].items()):
        for subject in subjects:
            store = _store_of(subject, after)
            if store is None and not (_read(subject, now) and _read(subject, previous)):
                problems.append(
                    f"role {role} publishes {subject}, which no stream or bucket takes and no role "
                    f"{'of the previous release ' if _read(subject, now) else ''}subscribes to: what it sends "
                    "is lost; a new request subject is answered a release before it is sent"
                )
            elif store in before and not _store_of(subject, before):
                problems.append(
                    f"role {role} publishes {subject} into {store}, which the previous release's {store} does "
                    "not take: refused before this release's `infra apply` and again once a rollback applies "
                    "the previous one, and unseen by its readers; add the subject one release before writing it"
                )
    return problems


def _written(subject: str, wire: Wire) -> bool:
    """Some role of a release may publish to some subject `subject` matches."""
    return any(collide(p, subject) for subjects in wire["publishes"].values() for p in subjects)


def _channel_breaks(previous: Wire, now: Wire) -> list[str]:
    problems = []
    for tag, subjects in sorted(now["channels"].items()):
        was = previous["channels"].get(tag)
        if was is None:
            continue  # a new message type, or one not yet sent on its own: nothing of the previous reads it
        for subject in subjects:
            if not _written(subject, now):
                continue  # a layout this release only reads (expand): the release after it writes it
            if not any(covers(w, subject) for w in was):
                problems.append(
                    f"message {tag}: now travels on {subject}, where the previous release never carried it "
                    f"({', '.join(was)}): its readers do not look there; a new layout is written only once the "
                    "release before reads it too"
                )
    return problems


def wire_breaks(previous: Wire, now: Wire) -> list[str]:
    """What `now` breaks of the previous release's wire contract, one sentence each (empty: it runs beside it)."""
    if previous["namespace"] != now["namespace"]:
        return [f"the locks describe two namespaces ({previous['namespace']}, {now['namespace']})"]
    problems = []
    if previous["action_partitions"] != now["action_partitions"]:
        problems.append(
            f"the action partitions changed from {previous['action_partitions']} to {now['action_partitions']}: a "
            "key would go to one partition's executor from one release and another's from the other"
        )
    problems += [
        *_stream_breaks(previous, now),
        *_consumer_breaks(previous, now),
        *_bucket_breaks(previous, now),
        *_writer_breaks(previous, now),
        *_channel_breaks(previous, now),
    ]
    problems += [
        f"message type {tag}: removed (a tag is kept forever: old journals and old writers carry it)"
        for tag in sorted(set(previous["tags"]) - set(now["tags"]))
    ]
    problems += [
        f"header {name}: removed (header names only grow: the previous release still sends and reads it)"
        for name in sorted(set(previous["headers"]) - set(now["headers"]))
    ]
    return problems


if __name__ == "__main__":
    # Run as a file by another release's interpreter (crashsafe.release_snapshot), so `crashsafe` is that tree.
    json.dump(current(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
