"""Operator tasks against a running deployment: show a run, reconcile, audit, declare streams, stop a stack."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import cast

import httpx
import msgspec
from rich.console import Console

from crashsafe.contracts.clients import Scope
from crashsafe.contracts.errors import InvalidSetting
from crashsafe.contracts.run_events import RunEvent, UnknownEvent
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain import registry as registries
from crashsafe.domain.effect_audit import unknown_events
from crashsafe.domain.fold import replay, summarize
from crashsafe.sandbox.listing import SandboxListing
from crashsafe.services.platform.asks import reconcile_run
from crashsafe.services.platform.clients import ClientKeys
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.journal import RunJournal
from crashsafe.services.platform.nats_users import creds_path, write_private
from crashsafe.services.platform.natsd import NatsAuth
from crashsafe.services.platform.providers import Providers
from crashsafe.services.platform.provisioning import provision
from crashsafe.services.platform.settings import Settings
from crashsafe.services.reconciler.provider_audit import audit_all
from crashsafe.stack_keys import API_KEY_FILE, SYNTHETIC_KEY_FILE
from crashsafe.stack_processes import ProcessIdentity
from crashsafe.timeline import timeline


def stack_file(state_dir: Path) -> dict[str, object]:
    path = state_dir / "stack.json"
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text()))


def settings_for(state_dir: Path) -> Settings:
    """Settings from the environment, filled in from a running stack's stack.json where the environment is silent."""
    stack = stack_file(state_dir)
    known = {
        "nats_url": "CRASHSAFE_NATS_URL",
        "namespace": "CRASHSAFE_NAMESPACE",
        "sandbox_url": "CRASHSAFE_SANDBOX_URL",
        # The operator's NATS credential `up` wrote (a path; the seed stays in its 0600 file).
        "operator_creds": "CRASHSAFE_NATS_CREDS",
    }
    return Settings.from_env(defaults={var: str(stack[key]) for key, var in known.items() if stack.get(key)})


def api_key_for(state_dir: Path) -> str | None:
    """The key a script talks to the gateway with: CRASHSAFE_API_KEY, else the one `crashsafe up` wrote."""
    settings = Settings.from_env()
    if settings.api_key:
        return settings.api_key
    path = state_dir / API_KEY_FILE
    return path.read_text().strip() or None if path.exists() else None


async def keys_create(
    state_dir: Path, tenant: str, scopes: list[str], name: str, agents: list[str] | None = None
) -> int:
    """Mint a key; the key is printed once, here, and stored only as the hash of its secret. `agents`: what it
    may start (`*`: every agent); none, the default agent only."""
    settings = settings_for(state_dir)
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-keys", fail_fast=True, access=settings.nats_access
    )
    try:
        keys = ClientKeys(broker, settings.namespace, settings.stream_replicas)
        await keys.ensure()
        minted = await keys.create(tenant, [Scope(s) for s in scopes], name, agents)
    finally:
        await broker.close()
    record = minted.record
    print(minted.key)
    print(
        f"key {record.key_id} for tenant {record.tenant}, scopes {', '.join(record.scopes)}, agents"
        f" {', '.join(record.agents) if record.agents else 'the default agent only'}: shown once, keep it"
        " secret (only a hash of it is stored)",
        file=sys.stderr,
    )
    return 0


async def keys_list(state_dir: Path) -> int:
    settings = settings_for(state_dir)
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-keys", fail_fast=True, access=settings.nats_access
    )
    try:
        records = await ClientKeys(broker, settings.namespace).all()
    finally:
        await broker.close()
    for r in sorted(records, key=lambda r: r.created_at):
        state = f"revoked {r.revoked_at:%Y-%m-%d %H:%M:%S}" if r.revoked_at else "active"
        print(
            f"{r.key_id}  tenant {r.tenant}  scopes {','.join(r.scopes)}  "
            f"agents {','.join(r.agents) if r.agents else '(default)'}  {state}  "
            f"created {r.created_at:%Y-%m-%d %H:%M:%S}  {r.name}".rstrip()
        )
    if not records:
        print("no keys")
    return 0


async def keys_revoke(state_dir: Path, key_id: str) -> int:
    settings = settings_for(state_dir)
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-keys", fail_fast=True, access=settings.nats_access
    )
    try:
        revoked = await ClientKeys(broker, settings.namespace).revoke(key_id)
    finally:
        await broker.close()
    if revoked is None:
        print(f"crashsafe: no key {key_id} in namespace {settings.namespace.name}", file=sys.stderr)
        return 1
    print(f"key {key_id} revoked: every gateway refuses it from its next request")
    return 0


async def reconcile(state_dir: Path, run_id: str | None) -> int:
    settings = settings_for(state_dir)
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-reconcile", fail_fast=True, access=settings.nats_access
    )
    try:
        if run_id:
            run_ids = [run_id]
        else:
            journals = await RunJournal(broker, settings.namespace).read_all()
            # Open runs, and ended runs that left an action pending at hand-off (a deadline passed under it).
            run_ids = [
                rid
                for rid, events in journals.items()
                if (s := replay(events)) is not None and (not s.terminal or s.pending)
            ]
        for rid in run_ids:
            done = await reconcile_run(broker, settings, rid, by="operator:cli")
            asked = ", ".join(done.asked) or "nothing open"
            print(f"{rid}: {done.status}; asked to resolve: {asked}")
        if not run_ids:
            print("no open runs")
    finally:
        await broker.close()
    return 0


async def audit(state_dir: Path) -> int:
    settings = settings_for(state_dir)
    registry = registries.load(settings.registry)
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-audit", fail_fast=True, access=settings.nats_access
    )
    try:
        async with Providers.connect(settings.sandbox_url) as providers:
            listing = SandboxListing(providers.http)
            findings, stats = await audit_all(broker, settings, registry, providers, listing)
        # Runs a newer writer journaled events for that this version cannot read: named, never fatal.
        unreadable = unknown_events(await RunJournal(broker, settings.namespace).read_all())
    finally:
        await broker.close()
    listed = f", {stats.listed_effects} provider effects listed" if stats.listed_effects is not None else ""
    print(
        f"audited {stats.runs} runs, {stats.keyed_intents} keyed intents ({stats.looked_up} looked up){listed}"
    )
    for finding in findings:
        print(f"WRONG {finding.kind}: run {finding.run_id or '(none)'} key {finding.key}: {finding.detail}")
    for run_id, tags in sorted(unreadable.items()):
        print(
            f"NOTE run {run_id}: {len(tags)} event(s) of a type this version does not know "
            f"({', '.join(sorted(set(tags)))}): kept and skipped; audit them with a newer crashsafe"
        )
    if not findings:
        print(
            "nothing wrong: every effect has one journaled intent and every journaled success has its effect"
        )
    return 1 if findings else 0


async def runs_show(state_dir: Path, run_id: str, as_json: bool) -> int:
    settings = settings_for(state_dir)
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-cli", fail_fast=True, access=settings.nats_access
    )
    try:
        events = await RunJournal(broker, settings.namespace).read_with_seqs(run_id)
    finally:
        await broker.close()
    console = Console()
    if not events:
        # One plain line on stderr: a console would wrap it at the terminal's width.
        print(
            f"crashsafe: no run {run_id} in namespace {settings.namespace.name} at {settings.nats_url}",
            file=sys.stderr,
        )
        return 1
    if as_json:
        for seq, event in events:
            body = (
                msgspec.json.decode(event.data)
                if isinstance(event, UnknownEvent)
                else msgspec.to_builtins(event)
            )
            print(json.dumps({"seq": seq, **body}))
        return 0
    # The timeline names an event type it does not know by its class; the note below says which tag it was.
    console.print(timeline(cast(list[tuple[int, RunEvent]], events), title=f"run {run_id}"))
    unknown = sorted({e.type for _, e in events if isinstance(e, UnknownEvent)})
    if unknown:
        console.print(f"[yellow]kept but not understood by this version:[/yellow] {', '.join(unknown)}")
    state = replay(e for _, e in events)
    assert state is not None
    s = summarize(state)
    console.print(f"status [bold]{s.status}[/bold], {s.steps} steps, {s.tokens_used} tokens")
    return 0


def down(state_dir: Path, timeout_s: float = 30.0) -> int:
    """Stop the stack `up` started: its supervisor first, then anything of ours still alive; never a stranger.

    Every pid is checked against the identity `up` recorded (start time and command line): a pid the kernel
    has since given to another process is left alone.
    """
    stack = stack_file(state_dir)
    if not stack:
        print(f"no stack recorded in {state_dir}/stack.json")
        return 1
    if stack.get("status") == "stopped":
        print(f"the stack in {state_dir} is already stopped")
        return 0
    supervisor = ProcessIdentity.from_json(_mapping(stack.get("supervisor")))
    if supervisor is not None and supervisor.signal(signal.SIGTERM):
        print(f"asked the supervisor (pid {supervisor.pid}) to stop the stack")
        _wait_gone([supervisor], timeout_s)
        stack = stack_file(state_dir) or stack
    else:
        print(f"supervisor {stack.get('supervisor_pid')} is not running; stopping what it recorded")
    ours: list[ProcessIdentity] = []
    services = stack.get("services")
    for entry in services if isinstance(services, list) else []:
        identity = ProcessIdentity.from_json(_mapping(entry.get("identity")))
        if identity is not None and identity.signal(signal.SIGTERM):
            ours.append(identity)
        elif entry.get("pid") and _pid_exists(int(entry["pid"])):
            print(f"{entry.get('name')}: pid {entry['pid']} is not the process crashsafe started; left alone")
    for identity in _wait_gone(ours, timeout_s=10):
        identity.signal(signal.SIGKILL)
    if stack.get("status") != "stopped":
        _write_stack_file(state_dir, {**stack, "status": "stopped"})
    print("stack stopped")
    return 0


def _mapping(value: object) -> dict[str, object]:
    return dict(value) if isinstance(value, dict) else {}


def _pid_exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _wait_gone(processes: list[ProcessIdentity], timeout_s: float) -> list[ProcessIdentity]:
    """Wait for these processes to exit; the ones still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in processes if p.alive()]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _write_stack_file(state_dir: Path, state: dict[str, object]) -> None:
    tmp = state_dir / "stack.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_dir / "stack.json")


async def infra_apply(state_dir: Path | None = None) -> int:
    """Provision the namespace's streams and buckets, as the operator (the only role that may)."""
    settings = settings_for(state_dir) if state_dir is not None else Settings.from_env()
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-infra", fail_fast=True, access=settings.nats_access
    )
    try:
        streams, buckets = await provision(broker, settings.namespace, settings.stream_replicas)
    finally:
        await broker.close()
    for spec in streams:
        print(f"stream {spec.name}: {', '.join(spec.subjects)}")
    for kv in buckets:
        print(f"key-value bucket {kv.bucket}")
    return 0


def infra_nats_auth(out: Path, namespace: str, registry: str, partitions: int) -> int:
    """Users, permissions and credentials for a real cluster: `auth.conf` to include in nats-server's config,
    and one credential file per role under `creds/` (0600) to mount as a Kubernetes secret."""
    auth = NatsAuth.for_deployment(
        out / "creds", Namespace(namespace), registries.load(registry).families, partitions
    )
    write_private(out / "auth.conf", auth.config() + "\n")
    for user in auth.users:
        print(f"{user.name}: {creds_path(auth.directory, user.name)}")
    print(f"server config fragment: {out / 'auth.conf'} (include it in nats-server.conf)")
    return 0


def capability_key_new(out: Path) -> int:
    """`crashsafe capability-key new --out PATH`: a key pair for a rotation (docs/security.md#capabilities)."""
    from crashsafe.services.platform.capability_keys import public_path, write_key_pair

    if out.exists():
        sys.exit(f"crashsafe: {out} exists; a key is never overwritten: choose another path")
    kid = write_key_pair(out)
    Console().print(f"key id {kid}\nprivate {out} (0600: the runtime's CRASHSAFE_CAPABILITY_SIGNING_KEY)")
    Console().print(f"public  {public_path(out)} (the executors' CRASHSAFE_CAPABILITY_VERIFY_KEYS)")
    return 0


# Approvals (through the gateway, as a manager would: the gateway is the one writer of a manager's decision) --------


def _gateway(state_dir: Path, gateway_url: str | None) -> tuple[str, dict[str, str]]:
    """The gateway's URL (`--gateway-url`, else the running stack's) and the API key's header."""
    url = gateway_url or str(stack_file(state_dir).get("gateway_url") or "")
    if not url:
        settings = Settings.from_env()
        url = f"http://{settings.gateway_host}:{settings.gateway_port}"
    key = api_key_for(state_dir)
    if not key:
        raise InvalidSetting(
            variable="CRASHSAFE_API_KEY",
            value="",
            expected=f"an API key with scope runs:read (approvals:decide to decide; or a stack started with `crashsafe up` in {state_dir})",
        )
    return url.rstrip("/"), {"authorization": f"Bearer {key}"}


def _say_error(response: httpx.Response) -> int:
    try:
        error = response.json()["error"]
        print(f"crashsafe: {response.status_code} {error['code']}: {error['message']}", file=sys.stderr)
    except (ValueError, KeyError, TypeError):
        print(f"crashsafe: gateway answered {response.status_code}: {response.text[:200]}", file=sys.stderr)
    return 1


async def approvals_list(state_dir: Path, status: str | None, gateway_url: str | None = None) -> int:
    url, headers = _gateway(state_dir, gateway_url)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as http:
        response = await http.get("/v1/approvals", params={"status": status} if status else None)
    if response.status_code != 200:
        return _say_error(response)
    approvals = response.json()["approvals"]
    for a in approvals:
        amount = (
            f"{a['amount_cents'] / 100:,.2f} {a['currency']}" if a.get("amount_cents") is not None else "-"
        )
        by = f" by {a['decided_by']}" if a.get("decided_by") else ""
        print(
            f"{a['approval_id']}  {a['status']}{by}  {a['tool']} {amount}  approver {a['approver']}  "
            f"run {a['run_id']}  tenant {a['tenant']}  expires {a['expires_at']}  ({a['reason']})"
        )
    if not approvals:
        print(f"no {status + ' ' if status else ''}approvals")
    return 0


async def approvals_decide(
    state_dir: Path,
    approval_id: str,
    decision: str,
    approver: str,
    reason: str,
    gateway_url: str | None = None,
) -> int:
    url, headers = _gateway(state_dir, gateway_url)
    body = {"decision": decision, "approver": approver, "reason": reason}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as http:
        response = await http.post(f"/v1/approvals/{approval_id}", json=body)
    if response.status_code != 200:
        return _say_error(response)
    record = response.json()
    print(f"{approval_id}: {record['status']} by {record['decided_by']}; the run continues")
    return 0


# Runs at a glance, and their events as they happen (crashsafe/runs.py) ------------------------------------------


async def runs_list(
    state_dir: Path,
    status: str | None,
    guest: str | None,
    since: str | None,
    as_json: bool,
    limit: int,
    stats: bool = False,
) -> int:
    from crashsafe import runs

    settings = settings_for(state_dir)
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-cli", fail_fast=True, access=settings.nats_access
    )
    try:
        return await runs.runs_list(
            broker,
            settings.namespace,
            status=status,
            guest=guest,
            since=since,
            as_json=as_json,
            limit=limit,
            stats=stats,
        )
    finally:
        await broker.close()


async def tail(
    state_dir: Path,
    run_id: str | None,
    session_id: str | None,
    types: list[str],
    as_json: bool,
    since: str | None,
) -> int:
    from crashsafe import runs

    settings = settings_for(state_dir)
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-tail", fail_fast=True, access=settings.nats_access
    )
    where = runs.TailFilter(run_id=run_id, session_id=session_id, types=tuple(types))
    try:
        return await runs.tail(broker, settings.namespace, where, as_json, since)
    finally:
        await broker.close()


# The synthetic turn (`crashsafe check synthetic`): the scoped test tenant's search, through the gateway ---------


def synthetic_target(state_dir: Path, gateway_url: str | None, key: str | None) -> tuple[str, str]:
    """The gateway (`--gateway`, CRASHSAFE_SYNTHETIC_GATEWAY_URL, the running stack's, else the settings') and
    the synthetic key (`--key`, the file CRASHSAFE_SYNTHETIC_KEY_FILE names, else `<state>/synthetic_key`)."""
    settings = Settings.from_env()
    url = (
        gateway_url
        or settings.synthetic_gateway_url
        or str(stack_file(state_dir).get("gateway_url") or "")
        or f"http://{settings.gateway_host}:{settings.gateway_port}"
    )
    if not key:
        path = settings.synthetic_key_file or state_dir / SYNTHETIC_KEY_FILE
        key = path.read_text().strip() if path.is_file() else ""
    if not key:
        raise InvalidSetting(
            variable="CRASHSAFE_SYNTHETIC_KEY_FILE",
            value="",
            expected="the synthetic tenant's key: --key, the file this names, or a stack started with "
            f"`crashsafe up` in {state_dir} (mint one: crashsafe keys create --tenant synthetic "
            "--scope events:write --scope runs:read)",
        )
    return url.rstrip("/"), key


async def check_synthetic(
    state_dir: Path,
    gateway_url: str | None,
    key: str | None,
    budget_s: float | None = None,
    record: bool = False,
    as_json: bool = False,
) -> int:
    """One synthetic turn; prints its result; 0 if ok, 1 if slow or failed. `record`: also publish it on
    `<ns>.ops.synthetic.cli` with the operator's NATS credential (the history the reconciler's turns go to)."""
    from crashsafe.contracts.synthetic_turn import SyntheticResult, synthetic_encoder
    from crashsafe.services.platform.synthetic import publish_turn, synthetic_turn

    url, secret = synthetic_target(state_dir, gateway_url, key)
    budget = budget_s if budget_s is not None else Settings.from_env().synthetic_budget_s
    turn = await synthetic_turn(url, secret, budget_s=budget, by="cli")
    if as_json:
        print(synthetic_encoder.encode(turn).decode())
    else:
        run = f" run {turn.run_id}" if turn.run_id else ""
        print(f"synthetic: {turn.result} in {turn.duration_s:.2f}s (budget {budget:g}s){run}: {turn.reason}")
    if record:
        settings = settings_for(state_dir)
        broker = await Broker.connect(
            settings.nats_url, "crashsafe-check", fail_fast=True, access=settings.nats_access
        )
        try:
            await publish_turn(broker, settings.namespace, turn, logging.getLogger("crashsafe.check"))
        finally:
            await broker.close()
    return 0 if turn.result == SyntheticResult.OK else 1
