"""Every NATS role tried against every subject class and JetStream API call on a real nats-server with the
generated users: what is allowed and refused must be exactly the intended matrix, and docs/security.md shows it.

Regenerate the table after an intended change: `UPDATE_DOCS=1 pytest tests/integration/test_nats_permissions.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from crashsafe.contracts.nats_permissions import NatsUser, Role, users
from crashsafe.contracts.streams import KvSpec, catalog_spec, leases_spec, stream_specs
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind
from crashsafe.natsd import NatsAuth, NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.nats_users import read_credential
from crashsafe.services.platform.settings import NatsAccess
from tests.support.paths import ROOT

NS = Namespace("sweep")
FAMILIES = ("booking", "memory", "notify", "payment")  # crashsafe.services.agents:stayhub's tool families
API = "$JS.API"
DOC = ROOT / "docs/security.md"
START, END = "<!-- nats-permissions:start -->", "<!-- nats-permissions:end -->"


@dataclass(frozen=True)
class Probe:
    """One thing a user might try: publish (a JetStream publish or API request) or subscribe to `subject`."""

    group: str
    label: str
    subject: str
    body: bytes = b""
    subscribe: bool = False


def _stream(kind: StreamKind) -> str:
    return NS.stream(kind)


def _consumer(stream: str, name: str, filter_subject: str, *, legacy: bool = False) -> Probe:
    config = {"name": name, "durable_name": name, "filter_subject": filter_subject, "ack_policy": "explicit"}
    subject = (
        f"{API}.CONSUMER.DURABLE.CREATE.{stream}.{name}"
        if legacy
        else f"{API}.CONSUMER.CREATE.{stream}.{name}.{filter_subject}"
    )
    how = "legacy DURABLE.CREATE " if legacy else ""
    return Probe(
        "consumers",
        f"{how}create `{name}` on {stream} (filter `{filter_subject}`)",
        subject,
        json.dumps({"stream_name": stream, "config": config}).encode(),
    )


INBOUND, RUNS, ACTIONS, OUTCOMES, DEAD = (
    _stream(k)
    for k in (
        StreamKind.INBOUND,
        StreamKind.RUNS,
        StreamKind.ACTIONS,
        StreamKind.OUTCOMES,
        StreamKind.DEAD_LETTERS,
    )
)
SUPPORT = _stream(StreamKind.SUPPORT)
CHECKPOINTS = _stream(StreamKind.CHECKPOINTS)
PROJECTIONS = _stream(StreamKind.PROJECTIONS)
KV_PROJECTIONS = "KV_sweep_projections"
KV_LEASES, KV_CLIENTS, KV_ACTIVE = (f"KV_sweep_{b}" for b in ("leases", "clients", "active"))
KV_CATALOG = "KV_sweep_catalog"
KV_GUESTS = "KV_sweep_guests"
KV_DEAD_MARKS = "KV_sweep_dead_marks"
KV_KEY_FACTS = "KV_sweep_key_facts"
KV_VERSIONS = "KV_sweep_versions"
BEATING = ("gateway", "runtime", *(f"executor-{f}" for f in FAMILIES), "reconciler", "projector")


def probes() -> list[Probe]:
    out = [
        Probe("publish", "inbound event", NS.inbound("r1")),
        Probe("publish", "run journal append", NS.run_event("r1", EventClass.STEP)),
        Probe("publish", "run journal milestone", NS.run_event("r1", EventClass.MILESTONE)),
        # A subject beside the classes' would be folded into the run by every reader of `run.<id>.*`.
        Probe("publish", "run journal, no class", NS.run_event("r1", "other")),
        *(Probe("publish", f"action request: {f}", f"sweep.action.{f}.0") for f in FAMILIES),
        # The journal as the bus (issue 33): the runtime journals intents, each family appends its own receipts.
        *(Probe("publish", f"journal an intent: {f}", NS.run_intent("r1", f, 0)) for f in FAMILIES),
        *(Probe("publish", f"journal a receipt: {f}", NS.run_receipt("r1", f)) for f in FAMILIES),
        *(Probe("publish", f"outcome: {f}", f"sweep.outcome.{f}.r1") for f in FAMILIES),
        Probe("publish", "wake a run", "sweep.outcome._wake.r1"),
        # Signed checkpoints of run heads (issue 34): the runtime alone signs; nobody deletes one (a sealed stream).
        Probe("publish", "signed checkpoint", NS.checkpoints),
        Probe("publish", "support ticket", NS.support("t1", "r1")),
        Probe("publish", "dead letter: runtime", NS.dead_letters("runtime")),
        *(Probe("publish", f"dead letter: executor_{f}", NS.dead_letters(f"executor_{f}")) for f in FAMILIES),
        *(Probe("publish", f"KV leases: `lease.{f}.0`", f"$KV.sweep_leases.lease.{f}.0") for f in FAMILIES),
        # An action key's facts beside its partition's store (issue 17): each family's executors, their own only.
        *(
            Probe("publish", f"KV key facts: `fact.{f}.h`", f"$KV.sweep_key_facts.fact.{f}.h")
            for f in FAMILIES
        ),
        *(
            Probe(
                "direct get",
                f"read key facts: `fact.{f}.h`",
                f"{API}.DIRECT.GET.{KV_KEY_FACTS}.$KV.sweep_key_facts.fact.{f}.h",
            )
            for f in FAMILIES
        ),
        Probe("publish", "KV clients: `client.k1`", "$KV.sweep_clients.client.k1"),
        Probe("publish", "KV active: `guest.t1.h`", "$KV.sweep_active.guest.t1.h"),
        Probe("publish", "KV approvals: `approval.apr_1`", "$KV.sweep_approvals.approval.apr_1"),
        Probe("publish", "KV sessions: `session.t1.h`", "$KV.sweep_sessions.session.t1.h"),
        Probe("publish", "approval expiry schedule", NS.approval_timer("apr_1")),
        Probe("publish", "cancel an approval's schedule", NS.timer_cancelled("apr_1")),
        Probe("publish", "fired timer (only the server's scheduler)", NS.timer_fired("r1")),
        Probe("publish", "KV catalog: publish a revision", "$KV.sweep_catalog.catalog"),
        Probe("publish", "KV guests: `guest.t1.h` (a profile)", "$KV.sweep_guests.guest.t1.h"),
        Probe("publish", "projection task", NS.projection("update_crm", "r1")),
        Probe("publish", "dead letter: projector", NS.dead_letters("projector")),
        Probe("publish", "ops: projection failed", NS.ops("projection_failed", "update_crm")),
        Probe("publish", "KV projections: a receipt", "$KV.sweep_projections.projection.update_crm.h"),
        # The operating pages (issue 11): settle a dead letter once, ask a family's executors for a provider view.
        Probe("publish", "KV dead marks: `dead.1`", "$KV.sweep_dead_marks.dead.1"),
        *(Probe("publish", f"ask a provider view: {f}", NS.provider_view(f)) for f in FAMILIES),
        # Version heartbeats (issue 30): each service process its own user's keys, never another's.
        *(
            Probe(
                "publish", f"KV versions: `beat.{u}.w1`", f"$KV.sweep_versions.{NS.version_beat_key(u, 'w1')}"
            )
            for u in BEATING
        ),
        Probe(
            "streams",
            "create a stream",
            f"{API}.STREAM.CREATE.SWEEP_PROBE",
            json.dumps({"name": "SWEEP_PROBE", "subjects": ["sweep.probe.>"], "storage": "memory"}).encode(),
        ),
        Probe("streams", f"info {RUNS}", f"{API}.STREAM.INFO.{RUNS}"),
        *(
            Probe("direct get", f"direct get on {s}", f"{API}.DIRECT.GET.{s}", b'{"seq":1}')
            for s in (
                INBOUND,
                RUNS,
                CHECKPOINTS,
                ACTIONS,
                OUTCOMES,
                DEAD,
                SUPPORT,
                KV_LEASES,
                KV_CLIENTS,
                KV_ACTIVE,
                "KV_sweep_approvals",
                "KV_sweep_sessions",
                _stream(StreamKind.TIMERS),
                KV_CATALOG,
                KV_GUESTS,
                PROJECTIONS,
                KV_PROJECTIONS,
                KV_DEAD_MARKS,
                KV_KEY_FACTS,
                KV_VERSIONS,
            )
        ),
        _consumer(INBOUND, "runtime_inbound", "sweep.inbound.*"),
        _consumer(OUTCOMES, "runtime_outcomes", "sweep.outcome.>"),
        *(_consumer(ACTIONS, f"executor_{f}_p0", f"sweep.action.{f}.0") for f in FAMILIES),
        _consumer(ACTIONS, "executor_booking_p1", "sweep.action.payment.1"),  # its own name, payment's work
        _consumer(ACTIONS, "executor_booking_p2", "sweep.action.booking.2", legacy=True),
        _consumer(RUNS, "projector_planner", "sweep.run.*.milestone"),
        # The journal as the bus: each family pulls its own partitions' intents, the runtime every receipt.
        *(_consumer(RUNS, f"executor_{f}_p0_journal", f"sweep.run.*.intent.{f}.0") for f in FAMILIES),
        _consumer(RUNS, "executor_booking_p1_journal", "sweep.run.*.intent.payment.1"),  # its name, payment's
        _consumer(RUNS, "runtime_receipts", "sweep.run.*.receipt.*"),
        _consumer(PROJECTIONS, "projection_update_crm", "sweep.projection.update_crm.*"),
        _consumer(
            PROJECTIONS, "projection_update_crm", "sweep.run.*.*"
        ),  # its name, another stream's subjects
        *(
            _consumer(s, "probe", f)
            for s, f in (
                (INBOUND, "sweep.inbound.*"),
                (RUNS, "sweep.run.*.*"),
                (ACTIONS, "sweep.action.>"),
                (OUTCOMES, "sweep.outcome.>"),
                (DEAD, "sweep.dead.*"),
                (SUPPORT, "sweep.support.>"),
            )
        ),
        Probe(
            "consumers",
            f"ephemeral consumer on {RUNS}",
            f"{API}.CONSUMER.CREATE.{RUNS}",
            json.dumps({"stream_name": RUNS, "config": {"ack_policy": "none"}}).encode(),
        ),
        Probe(
            "consumers",
            f"ephemeral consumer on {KV_CATALOG} (watch the catalog)",
            f"{API}.CONSUMER.CREATE.{KV_CATALOG}",
            json.dumps({"stream_name": KV_CATALOG, "config": {"ack_policy": "none"}}).encode(),
        ),
        *(
            Probe(
                "consumers",
                f"pull next from `executor_{f}_p0`",
                f"{API}.CONSUMER.MSG.NEXT.{ACTIONS}.executor_{f}_p0",
                b'{"batch":1,"no_wait":true}',
            )
            for f in FAMILIES
        ),
        Probe(
            "consumers",
            "pull next from `projector_planner`",
            f"{API}.CONSUMER.MSG.NEXT.{RUNS}.projector_planner",
            b'{"batch":1,"no_wait":true}',
        ),
        Probe(
            "consumers",
            "pull next from `projection_update_crm`",
            f"{API}.CONSUMER.MSG.NEXT.{PROJECTIONS}.projection_update_crm",
            b'{"batch":1,"no_wait":true}',
        ),
        Probe(
            "consumers",
            "pull next from `runtime_inbound`",
            f"{API}.CONSUMER.MSG.NEXT.{INBOUND}.runtime_inbound",
            b'{"batch":1,"no_wait":true}',
        ),
        # Pulled since issue 17: nobody, the runtime included, listens on the old push deliveries.
        Probe(
            "subscribe",
            "the runtime's old push deliveries (inbound)",
            f"_deliver.{INBOUND}.runtime_inbound",
            subscribe=True,
        ),
        Probe("subscribe", "raw `sweep.action.>` (snoop requests)", "sweep.action.>", subscribe=True),
        Probe("subscribe", "the runtime's reply inbox", "_INBOX.runtime.>", subscribe=True),
        Probe("subscribe", "the gateway's reply inbox", "_INBOX.gateway.>", subscribe=True),
        *(
            Probe("subscribe", f"answer provider views: {f}", NS.provider_view(f), subscribe=True)
            for f in FAMILIES
        ),
        # Destructive ones last: the operator really does them.
        Probe("streams", f"delete message 1 of {RUNS}", f"{API}.STREAM.MSG.DELETE.{RUNS}", b'{"seq":1}'),
        # Archiving journals (issue 31): the reconciler purges one run's subjects of RUNS, no other stream's.
        Probe(
            "streams", f"purge {INBOUND}", f"{API}.STREAM.PURGE.{INBOUND}", b'{"filter":"sweep.inbound.r1"}'
        ),
        Probe("streams", f"purge {RUNS}", f"{API}.STREAM.PURGE.{RUNS}", b'{"filter":"sweep.run.r1.>"}'),
        Probe(
            "streams",
            f"update {RUNS}",
            f"{API}.STREAM.UPDATE.{RUNS}",
            json.dumps(
                {"name": RUNS, "subjects": ["sweep.run.*.*"], "storage": "file", "allow_direct": True}
            ).encode(),
        ),
        Probe("streams", f"delete {RUNS}", f"{API}.STREAM.DELETE.{RUNS}"),
    ]
    return out


def intended(user: NatsUser, probe: Probe) -> bool:
    """The matrix, written from the issue's rules (independently of contracts/nats_permissions.py)."""
    if user.role is Role.OPERATOR:
        # The admin does anything in its namespace, but never listens on another user's deliveries or inbox.
        return not (probe.subscribe and not probe.subject.startswith("sweep."))
    role, family, label = user.role, user.family, probe.label
    if label.startswith("KV versions: "):  # a service process's own heartbeat only; analytics runs none
        return role is not Role.ANALYTICS and label == f"KV versions: `beat.{user.name}.w1`"
    if label == "which stream takes a subject":  # every service proves where its writes land; analytics, none
        return role is not Role.ANALYTICS
    allowed: set[str] = set()
    if role is Role.GATEWAY:
        allowed = {"inbound event", "wake a run", "KV active: `guest.t1.h`", f"info {RUNS}"}
        allowed |= {f"direct get on {s}" for s in (INBOUND, RUNS, KV_CLIENTS, KV_ACTIVE)}
        # A manager's decision on an approval record; the session lane a new message claims.
        allowed |= {"KV approvals: `approval.apr_1`", "KV sessions: `session.t1.h`"}
        allowed |= {"direct get on KV_sweep_approvals", "direct get on KV_sweep_sessions"}
        # The operating pages: read the dead letters and settle each once (never delete a stream message), ask
        # any family for the provider's view by key; never a projection task (it says what the projector sends).
        allowed |= {f"direct get on {DEAD}", "KV dead marks: `dead.1`", f"direct get on {KV_DEAD_MARKS}"}
        allowed |= {"the gateway's reply inbox"}
        allowed |= {f"ask a provider view: {f}" for f in FAMILIES}
        allowed |= {f"direct get on {KV_PROJECTIONS}"}  # the console shows a run's projection receipts
        allowed |= {f"direct get on {CHECKPOINTS}"}  # a run's evidence bundle (the console's download)
    elif role is Role.RUNTIME:
        allowed = {
            "run journal append",
            "run journal milestone",
            "dead letter: runtime",
            "KV active: `guest.t1.h`",
            f"info {RUNS}",
        }
        allowed |= {"wake a run"}  # a run's deadline wake-up
        allowed |= {"support ticket"}  # a handed-off run's ticket
        allowed |= {f"action request: {f}" for f in FAMILIES}
        allowed |= {f"journal an intent: {f}" for f in FAMILIES}
        allowed |= {f"direct get on {s}" for s in (RUNS, KV_ACTIVE, KV_CATALOG, KV_GUESTS)}  # reads profiles
        allowed |= {"signed checkpoint", f"direct get on {CHECKPOINTS}"}  # after the last one, which it reads
        allowed |= {f"ephemeral consumer on {KV_CATALOG} (watch the catalog)"}  # reads it; never writes it
        # Approval records and their expiry schedules (never a fired timer), session lanes.
        allowed |= {
            "KV approvals: `approval.apr_1`",
            "KV sessions: `session.t1.h`",
            "approval expiry schedule",
            "cancel an approval's schedule",
        }
        allowed |= {"direct get on KV_sweep_approvals", "direct get on KV_sweep_sessions"}
        allowed |= {f"direct get on {_stream(StreamKind.TIMERS)}"}
        allowed |= {p.label for p in probes() if "`runtime_" in p.label}
        allowed |= {"the runtime's reply inbox"}
    elif role is Role.EXECUTOR:
        allowed = {f"outcome: {family}", f"dead letter: executor_{family}", f"KV leases: `lease.{family}.0`"}
        allowed |= {f"journal a receipt: {family}"}  # its own family's subject in a run, never another's
        allowed |= {f"KV key facts: `fact.{family}.h`", f"read key facts: `fact.{family}.h`"}
        allowed |= {f"direct get on {KV_LEASES}", f"pull next from `executor_{family}_p0`"}
        allowed |= {f"create `executor_{family}_p0` on {ACTIONS} (filter `sweep.action.{family}.0`)"}
        # Its intents straight from the journal (issue 33): its own durables on RUNS, never another family's.
        allowed |= {
            f"info {RUNS}",
            f"create `executor_{family}_p0_journal` on {RUNS} (filter `sweep.run.*.intent.{family}.0`)",
        }
        allowed |= {f"answer provider views: {family}"}  # its own family's, never another's
        allowed |= {
            f"direct get on {KV_VERSIONS}"
        }  # who is alive, what was contracted: may key facts expire?
        if family == "memory":  # the one writer of guest profiles
            allowed |= {"KV guests: `guest.t1.h` (a profile)", f"direct get on {KV_GUESTS}"}
    elif role is Role.RECONCILER:
        allowed = {"wake a run", f"info {RUNS}", f"direct get on {RUNS}", f"ephemeral consumer on {RUNS}"}
        allowed |= {"support ticket"}  # the backstop for a ticket the runtime could not publish
        allowed |= {"direct get on KV_sweep_approvals"}  # the expiry backstop reads records, never decides
        # Lost projections: it reads their receipts, never writes one, and publishes their tasks again.
        allowed |= {"projection task", f"direct get on {KV_PROJECTIONS}"}
        # Archiving journals: who is alive and what was contracted; purge a run's subjects of RUNS, nothing else.
        allowed |= {f"direct get on {KV_VERSIONS}", f"purge {RUNS}"}
    elif role is Role.ANALYTICS:
        # Named consumers only: a bare (ephemeral) create's body may name the projector's durable and rewrite it.
        allowed = {f"info {RUNS}", f"direct get on {RUNS}"}
        allowed |= {f"create `probe` on {RUNS} (filter `sweep.run.*.*`)"}
        allowed |= {f"direct get on {SUPPORT}", f"create `probe` on {SUPPORT} (filter `sweep.support.>`)"}
    elif role is Role.PROJECTOR:
        # The run journals it plans from, the tasks it publishes and pulls, their receipts, its dead letters and
        # operator events; never a journal append, an action, or another service's bucket.
        allowed = {"projection task", "dead letter: projector", "ops: projection failed"}
        allowed |= {"KV projections: a receipt", f"info {RUNS}", f"direct get on {RUNS}"}
        allowed |= {f"direct get on {KV_PROJECTIONS}"}
        allowed |= {f"create `projector_planner` on {RUNS} (filter `sweep.run.*.milestone`)"}
        allowed |= {
            f"create `projection_update_crm` on {PROJECTIONS} (filter `sweep.projection.update_crm.*`)"
        }
        allowed |= {"pull next from `projector_planner`", "pull next from `projection_update_crm`"}
    return label in allowed


async def _connect(server: NatsServer, auth: NatsAuth, user: NatsUser, violations: list[str]) -> Client:
    credential = read_credential(auth.directory / f"{user.name}.creds")

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    return await nats.connect(
        server.url,
        nkeys_seed_str=credential.seed,
        inbox_prefix=user.inbox_prefix,
        error_cb=on_error,
        allow_reconnect=False,
    )


async def _try(nc: Client, probe: Probe, violations: list[str]) -> bool:
    """True if the server let the user do it; a permission refusal arrives before the flush's PONG."""
    before = len(violations)
    if probe.subscribe:
        sub = await nc.subscribe(probe.subject)
        await nc.flush()
        await asyncio.sleep(0.02)
        await sub.unsubscribe()
        word = "subscription"
    else:
        await nc.publish(probe.subject, probe.body, reply=nc.new_inbox())
        await nc.flush()
        await asyncio.sleep(0.02)
        word = "publish"
    refused = [v for v in violations[before:] if "permissions violation" in v.lower() and word in v.lower()]
    return not refused


@pytest.fixture(scope="module")
def sweep_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[NatsServer, NatsAuth]]:
    root = tmp_path_factory.mktemp("sweep")
    auth = NatsAuth.for_deployment(root / "auth", NS, FAMILIES)
    server = NatsServer(root / "nats", auth=auth).start()
    yield server, auth
    server.stop()


def _table(results: dict[str, dict[str, bool]], all_users: list[NatsUser]) -> str:
    names = [u.name for u in all_users]
    lines = ["| group | attempt | " + " | ".join(f"`{n}`" for n in names) + " |"]
    lines.append("|---|---|" + "---|" * len(names))
    for probe in probes():
        cells = " | ".join("allowed" if results[n][probe.label] else "refused" for n in names)
        lines.append(f"| {probe.group} | {probe.label} | {cells} |")
    return "\n".join(lines)


async def test_every_role_can_do_exactly_what_it_needs(sweep_server: tuple[NatsServer, NatsAuth]) -> None:
    server, auth = sweep_server
    all_users = users(NS, FAMILIES)
    operator = await Broker.connect(
        server.url, "sweep-operator", access=NatsAccess(creds=auth.creds(Role.OPERATOR))
    )
    try:
        for spec in stream_specs(NS):
            await operator.ensure_stream(spec)
        for bucket in (leases_spec(NS), KvSpec("sweep_clients"), KvSpec("sweep_active"), catalog_spec(NS)):
            await operator.ensure_kv(bucket)
        await operator.publish(NS.run_event("r0", EventClass.STEP), b"{}")
    finally:
        await operator.close()
    # The operator goes last: it really purges and deletes the RUNS stream.
    ordered = sorted(all_users, key=lambda u: u.role is Role.OPERATOR)
    results: dict[str, dict[str, bool]] = {}
    for user in ordered:
        violations: list[str] = []
        nc = await _connect(server, auth, user, violations)
        try:
            results[user.name] = {p.label: await _try(nc, p, violations) for p in probes()}
        finally:
            await nc.close()
    wrong = [
        f"{user.name}: {probe.label} was {'allowed' if results[user.name][probe.label] else 'refused'}"
        for user in all_users
        for probe in probes()
        if results[user.name][probe.label] != intended(user, probe)
    ]
    assert not wrong, "\n".join(wrong)
    _check_doc(_table(results, all_users))


def _check_doc(table: str) -> None:
    text = DOC.read_text()
    current = text.split(START, 1)[1].split(END, 1)[0].strip() if START in text else ""
    if os.environ.get("UPDATE_DOCS") and current != table:
        head, _, rest = text.partition(START)
        tail = rest.split(END, 1)[1] if rest else "\n"
        DOC.write_text(f"{head}{START}\n{table}\n{END}{tail}")
        return
    assert current == table, "docs/security.md's NATS permission table is stale: rerun with UPDATE_DOCS=1"


def test_the_doc_names_every_role() -> None:
    text = Path(DOC).read_text()
    for user in users(NS, FAMILIES):
        assert f"`{user.name}`" in text
