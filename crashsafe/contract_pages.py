"""The generated Markdown pages: docs/events.md (every message, subject, stream and consumer) and docs/metrics.md."""

from __future__ import annotations

import json

from crashsafe import contract_access as access
from crashsafe import contract_catalog as cat
from crashsafe import stream_catalog
from crashsafe.contract_specs import GENERATED_BY
from crashsafe.contracts.run_events import event_id
from crashsafe.contracts.streams import RUNTIME_MAX_DELIVER


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or "—"


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) or "—"


def _seconds(s: float) -> str:
    if s == 0:
        return "forever"
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if s >= size and s % size == 0:
            return f"{int(s // size)} {unit}"
    return f"{s:g} s"


def events_md() -> str:
    users = access.roles()
    subjects = [t for t in cat.templates() if t.kind == "subject"]
    out = [
        "# Events, subjects and streams",
        "",
        f"> {GENERATED_BY}",
        "",
        f"The analytics contract: what crosses NATS, on which subject and stream, who may publish and read it, and "
        f"every message's fields. Names are shown for the default namespace `{cat.NS.name}`; a deployment's "
        "`CRASHSAFE_NAMESPACE` replaces the first subject token and the stream and bucket prefix. Who publishes and "
        "reads is read from the NATS users (`contracts/nats_permissions.py`, the same data the server's "
        "configuration is built from); the operator, allowed everything, is left out. Machine-readable: "
        "[asyncapi.json](asyncapi.json), one JSON Schema per message in [schemas/](schemas/); the evolution rule "
        "is in [contracts/README.md](../contracts/README.md#evolution-rule), enforced by `contracts/lock.json`.",
        "",
        "## Streams",
        "",
        "| stream | subjects | retention | max age | per subject | duplicate window | schedules |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in stream_catalog.streams():
        per_subject = (
            "unlimited"
            if s.max_msgs_per_subject < 0
            else f"{s.max_msgs_per_subject}{' (discard new)' if s.discard_new_per_subject else ''}"
        )
        out.append(
            f"| `{s.name}` | {_names(list(s.subjects))} | {s.retention.value} | {_seconds(s.max_age_s)} "
            f"| {per_subject} | {_seconds(s.duplicate_window_s)} | {'yes' if s.allow_msg_schedules else 'no'} |"
        )
    out += [
        "",
        "## Subjects",
        "",
        "A parameter is always one whole subject token. *Published by* lists the users allowed to publish to some "
        "instance of the subject; *read by* those allowed to create a consumer that sees it.",
        "",
        "| subject | stream | messages | published by | read by | consumers | why |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in subjects:
        w = cat.wildcard(t)
        stream = access.stream_of(w)
        carried = cat.CHANNEL_MESSAGES.get(t.method, ())
        durables = sorted({c.spec.durable if not t.params else c.declared_by for c in access.consumers_of(w)})
        out.append(
            f"| `{t.template}` | {f'`{stream.name}`' if stream else '—'} | "
            f"{', '.join(f'[`{m}`](#{_anchor(m)})' for m in carried) or '(empty body)'} | "
            f"{_names(access.publishers(w, users, access.narrower_than(t, subjects)))} | {_names(access.readers(w, users))} | {_names(durables)} | "
            f"{_cell(t.doc)} |"
        )
    wildcards = [t for t in cat.templates() if t.kind == "wildcard"]
    out += ["", "Filters and stream subjects: " + ", ".join(f"`{t.template}`" for t in wildcards) + ".", ""]
    out += [
        "## Consumers",
        "",
        "Every durable the services declare (`contracts/streams.py`), one per executor family partition and "
        "projection tool of the reference deployment (`crashsafe.services.agents:stayhub`).",
        "",
        "| durable | stream | filter | kind | ack wait | max deliver | max ack pending | declared by | created by |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in stream_catalog.consumers():
        spec = c.spec
        # No server limit: the service itself dead-letters a message taken too often (never a silent drop).
        most = (
            str(spec.max_deliver)
            if spec.max_deliver > 0
            else f"none: dead-lettered past {RUNTIME_MAX_DELIVER}"
        )
        out.append(
            f"| `{spec.durable}` | `{spec.stream}` | `{spec.filter_subject}` | {'pull' if spec.pull else 'push'} "
            f"| {_seconds(spec.ack_wait_s)} | {most} | {spec.max_ack_pending} | `{c.declared_by}` "
            f"| {_names(access.consumer_owners(spec, users))} |"
        )
    out += [
        "",
        "## Key-value buckets",
        "",
        "| bucket | stream | history | what |",
        "| --- | --- | --- | --- |",
    ]
    for kv, doc in stream_catalog.buckets():
        out.append(f"| `{kv.bucket}` | `{kv.stream}` | {kv.history} | {_cell(doc)} |")
    keys = [t for t in cat.templates() if t.kind == "key"]
    out += ["", "| key | built by | what |", "| --- | --- | --- |"]
    for t in keys:
        out.append(f"| `{t.template}` | `Namespace.{t.method}` | {_cell(t.doc)} |")
    out += ["", "## Headers", "", "| header | what |", "| --- | --- |"]
    for name, comment in cat.headers():
        out.append(f"| `{name}` | {_cell(comment)} |")
    out += [
        "",
        "## Event identity",
        "",
        f"`crashsafe.contracts.run_events.event_id(run_id, position)`: {' '.join((event_id.__doc__ or '').split())} "
        "A journal read in order gives positions 1, 2, 3, … per run subject; a consumer that stores "
        "`event_id` (or the stream sequence) as its position deduplicates redeliveries.",
    ]
    out += ["", "## NATS users", "", "| user | role |", "| --- | --- |"]
    for u in users:
        out.append(f"| `{u.name}` | {u.role.value} |")
    out += [
        "",
        "## Messages",
        "",
        "Every struct of `contracts/`: a tagged message carries its tag in `type`; an untagged one is a stored record "
        "or a part of another message. *Required* fields have no default; every field added later has one.",
        "",
    ]
    carriers: dict[str, list[str]] = {}
    for method, names in cat.CHANNEL_MESSAGES.items():
        template = next((t.template for t in subjects if t.method == method), method)
        for name in names:
            carriers.setdefault(name, []).append(template)
    for m in cat.messages():
        kind = "message" if cat.tag_of(m.cls) else ("record" if m.top_level else "part of other messages")
        out += [f"### `{m.name}`", "", f"`{m.module}.{m.cls.__name__}`, {kind}."]
        if m.name in carriers:
            out.append(f"On {_names(carriers[m.name])}.")
        if cat.tag_of(m.cls) or m.top_level:
            out.append(f"Schema: [schemas/{m.name}.json](schemas/{m.name}.json).")
        out += ["", m.doc, ""] if m.doc else [""]
        out += ["| field | type | required / default | what |", "| --- | --- | --- | --- |"]
        comments = m.comments
        if cat.tag_of(m.cls):
            out.append(f"| `type` | `{json.dumps(m.name)}` | tag | the message type, stable forever |")
        for f in m.info.fields:
            default = cat.default_of(f)
            out.append(
                f"| `{f.encode_name}` | `{_cell(cat.render_type(f.type))}` | "
                f"{'required' if default is None else f'`{_cell(default)}`'} | {_cell(comments.get(f.name, ''))} |"
            )
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _anchor(name: str) -> str:
    """GitHub's heading anchor for `### \\`name\\``."""
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def metrics_md() -> str:
    """Every metric a service exposes on /metrics, from contracts/metric_names.py (the one home of their names)."""
    from crashsafe.contracts.metric_names import ALL_METRICS, MetricKind

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [
        "# Metrics",
        "",
        "<!-- generated by `python -m crashsafe.contract_docs` from contracts/metric_names.py; do not edit -->",
        "",
        "Every service serves Prometheus text on `GET /metrics`: the gateway on its own port, the runtime,",
        "executors, projector and reconciler on their ops port (`CRASHSAFE_OPS_HOST`:`CRASHSAFE_OPS_PORT`,",
        "default 127.0.0.1:9464), beside `GET /healthz` (200 while the event loop turns; never asks NATS; a loop",
        "held past `CRASHSAFE_LOOP_STALL_S` answers nothing, then the process exits 70 to be restarted) and",
        '`GET /readyz` (200 `{"ready": true, "checks": {...}}`, or 503 naming each failed check and why).',
        "Counters carry prometheus-client's `_total` suffix, histograms `_bucket`, `_sum` and `_count`; a labelled",
        "series appears once its first value is set, and so does an unlabelled gauge (no process shows a 0 it never",
        "set: `crashsafe_synthetic_up` only on the reconciler). Label values are closed sets or names from the deployment's",
        "registry (agents, tools, routes, route templates), never a caller's text. Each process also exposes",
        "prometheus-client's `process_*` series (CPU seconds, resident memory, open file descriptors).",
        "",
        "| metric | kind | labels | set by | meaning |",
        "|---|---|---|---|---|",
    ]
    for m in ALL_METRICS:
        name = f"{m.name}_total" if m.kind is MetricKind.COUNTER else m.name
        labels = ", ".join(f"`{label}`" for label in m.labels) or "—"
        lines.append(f"| `{name}` | {m.kind.value} | {labels} | {', '.join(m.services)} | {cell(m.help)} |")
    buckets = sorted({b for m in ALL_METRICS for b in m.buckets})
    lines += [
        "",
        "Histogram buckets (seconds): " + ", ".join(f"{b:g}" for b in buckets) + ".",
        "",
    ]
    return "\n".join(lines)
