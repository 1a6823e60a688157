"""The `crashsafe` command's arguments: every command, its options and their help, parsed before anything runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from crashsafe import crash_test_command
from crashsafe.contracts.clients import Scope
from crashsafe.contracts.release import VERSION
from crashsafe.contracts.run_events import RunStatus
from crashsafe.services.platform.crashpoints import SEAMS

DEFAULT_STATE_DIR = Path(".crashsafe")
SERVICES = ("gateway", "runtime", "executor", "reconciler", "projector", "sandbox")


def _position(text: str) -> int:
    """A journal position: 1 is the run's first event (`run.started`), as in its events' ids `<run_id>/<n>`."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a journal position (1, 2, …)")
    return int(text)


def _scale(text: str) -> dict[str, int]:
    from crashsafe.stack_plan import ScaleError, parse_scale

    try:
        return parse_scale(text)
    except ScaleError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _base_url(option: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise argparse.ArgumentTypeError(f"{option} wants an http(s):// base URL, got {text!r}")
        return text

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crashsafe", description="A crash-safe runtime for AI agents on NATS JetStream."
    )
    parser.add_argument("--version", action="version", version=f"crashsafe {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one service in the foreground (as a container would)")
    serve.add_argument("service", choices=SERVICES)
    serve.add_argument("--tool", help="tool family for an executor: booking, payment, notify, …")
    serve.add_argument("--partitions", help="key partitions this executor owns: all, 0-3, 0,2 (default all)")

    demo = sub.add_parser("demo", help="run the booking with a worker killed at the worst moment")
    demo.add_argument(
        "--crash", choices=SEAMS, default="executor.after_provider_ack", help="the seam to SIGKILL at"
    )
    demo.add_argument(
        "--state-dir", default=None, help="keep the demo's data here (default: a temporary dir)"
    )
    demo.add_argument(
        "--keep-up",
        action="store_true",
        help="keep the stack running after the booking, to look at it in the console (Ctrl-C stops it)",
    )

    up = sub.add_parser("up", help="start the whole stack and supervise it")
    up.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    up.add_argument("--nats-url", default=None, help="use this NATS instead of an embedded nats-server")
    up.add_argument(
        "--scale",
        type=_scale,
        default={},
        metavar="NAME=N[,NAME=N…]",
        help="replicas per service, as a Deployment's pods: executor-payment=3,runtime=2",
    )

    up.add_argument(
        "--providers",
        type=_base_url("--providers"),
        default=None,
        metavar="URL",
        help="no sandbox: executors and the projector talk to the providers at URL (a staging provider)",
    )
    up.add_argument(
        "--model-url",
        type=_base_url("--model-url"),
        default=None,
        metavar="URL",
        help="the model's Responses API base URL, /v1 included (default: OPENAI_BASE_URL, else the sandbox's "
        "scripted model); `up` prints which one the runtime uses",
    )
    up.add_argument(
        "--registry",
        default=None,
        metavar="MODULE:FUNCTION",
        help="the deployment's agents and tools (default: CRASHSAFE_REGISTRY, else StayHub's); one executor "
        "starts per tool family it declares. A package in the current directory imports as with `python -m`",
    )
    up.add_argument(
        "--crash",
        action="append",
        default=[],
        metavar="SEAM[@FAMILY]",
        help="SIGKILL a service once at a seam of docs/failure-modes.md, then the supervisor restarts it: "
        "executor.after_provider_ack@deposits (an executor's seam names its tool family). Repeatable; default: "
        "CRASHSAFE_CRASH_AT",
    )

    crash_test_command.add_parser(sub)

    new = sub.add_parser("new", help="write a starting point of your own")
    new_sub = new.add_subparsers(dest="new_command", required=True)
    new_agent = new_sub.add_parser(
        "agent", help="a package with an agent, its tools, a provider stub and tests (crashsafe.sdk only)"
    )
    new_agent.add_argument("name", help="the agent's name, also its package's: lowercase, e.g. desks")
    new_agent.add_argument("--dir", default=".", help="where the package goes (default: here)")

    down = sub.add_parser("down", help="stop a stack started with `up`")
    down.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    runs = sub.add_parser("runs", help="inspect runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    show = runs_sub.add_parser("show", help="a run's journal as a timeline")
    show.add_argument("run_id")
    show.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    show.add_argument("--json", action="store_true", help="print the events as JSON lines")
    runs_listing = runs_sub.add_parser(
        "list", help="runs, newest first: id, agent, guest, status, times, steps"
    )
    runs_listing.add_argument("--status", choices=[s.value for s in RunStatus])
    runs_listing.add_argument("--guest", help="only this guest's runs")
    runs_listing.add_argument("--since", help="started since: 30m, 2h, 7d, or an ISO 8601 time")
    runs_listing.add_argument("--limit", type=int, default=50, help="at most this many (0: all; default 50)")
    runs_listing.add_argument("--json", action="store_true", help="one JSON object per run")
    runs_listing.add_argument("--stats", action="store_true", help="say on stderr what the listing read")
    runs_listing.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    evidence = runs_sub.add_parser(
        "export", help="one run's evidence bundle: journal, chain, checkpoints, keys, provider answers"
    )
    evidence.add_argument("--evidence", required=True, metavar="RUN", help="the run whose evidence to write")
    evidence.add_argument("--out", default=None, metavar="F", help="write here (default: stdout)")
    evidence.add_argument(
        "--no-providers", action="store_true", help="do not ask the providers by key (effects go unchecked)"
    )
    evidence.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    verify = sub.add_parser(
        "verify",
        help="check a run's evidence bundle offline (no broker, no credentials), or --live every run of a range",
    )
    verify.add_argument("bundle", nargs="?", help="an evidence bundle (`crashsafe runs export --evidence`)")
    verify.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="PEM",
        help="a public key of the deployment's runtime to pin (repeatable); without it the bundle's own keys",
    )
    verify.add_argument(
        "--registry",
        metavar="MODULE:FUNCTION",
        help="the agents whose code replays the run (default: CRASHSAFE_REGISTRY, else StayHub's)",
    )
    verify.add_argument("--json", action="store_true", help="one JSON document")
    verify.add_argument("--live", action="store_true", help="check the running deployment instead of a file")
    verify.add_argument(
        "--since", help="--live: runs started since (30m, 2h, 7d, or an ISO time); default all"
    )
    verify.add_argument("--until", help="--live: and before (default: now)")
    verify.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    tail = sub.add_parser("tail", help="follow run events as they are journaled (ctrl-C stops)")
    tail.add_argument("--run", dest="run_id", help="one run's events, from its start")
    tail.add_argument("--session", dest="session_id", help="the events of a session's runs")
    tail.add_argument(
        "--type", dest="types", action="append", default=[], help="run.completed, run.action_*; repeatable"
    )
    tail.add_argument("--since", help="start this far back (30m, or an ISO time); default: now")
    tail.add_argument("--json", action="store_true", help="one JSON object per event, with its stream seq")
    tail.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    replay = sub.add_parser(
        "replay",
        help="rebuild a run's state from its journal with the runtime's fold, and what it would do next",
    )
    replay.add_argument("run_id", nargs="?", help="the run (optional with --file)")
    replay.add_argument(
        "--until", type=_position, default=None, metavar="SEQ", help="stop at journal position SEQ (from 1)"
    )
    replay.add_argument("--diff", action="store_true", help="show what each event changed in the state")
    replay.add_argument("--file", default=None, metavar="F", help="replay an export offline (no NATS)")
    replay.add_argument(
        "--json", action="store_true", help="one JSON document: transitions, state, next move"
    )
    replay.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    export = sub.add_parser(
        "export", help="a run's journal as JSON Lines (a header, then each event as journaled)"
    )
    export.add_argument("run_id")
    export.add_argument("--out", default=None, metavar="F", help="write here (default: stdout)")
    export.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    reconcile = sub.add_parser(
        "reconcile", help="resolve open actions by key and wake runs (one run, or every open run)"
    )
    reconcile.add_argument("run_id", nargs="?")
    reconcile.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    audit = sub.add_parser(
        "audit", help="cross-check every run's journal against the providers; prints disagreements"
    )
    audit.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    projections = sub.add_parser(
        "projections", help="confirmation emails, CRM records, the audit trail: what was delivered, what died"
    )
    projections_sub = projections.add_subparsers(dest="projections_command", required=True)
    projections_list = projections_sub.add_parser(
        "list", help="every projection receipt: tool, key, run, status, attempts, next attempt, detail"
    )
    projections_list.add_argument("--status", help="pending, delivered or dead")
    projections_list.add_argument("--run", help="only this run's projections")
    projections_list.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    projections_retry = projections_sub.add_parser(
        "retry",
        help="send a dead projection again (re-planned from its run's journal) once its receiver is fixed",
    )
    projections_retry.add_argument("key", help="the projection's key, as `projections list` prints it")
    projections_retry.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    dead = sub.add_parser("dead-letters", help="messages a service gave up on: list, replay once, discard")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True)
    dead_list = dead_sub.add_parser(
        "list", help="open dead letters: seq, when, service, subject, code, reason"
    )
    dead_list.add_argument("--all", action="store_true", help="also the replayed and discarded ones")
    dead_replay = dead_sub.add_parser(
        "replay", help="send one again, once, where its consumer dedupes by key (else refused, saying why)"
    )
    dead_discard = dead_sub.add_parser("discard", help="mark one discarded: it is never replayed")
    for command in (dead_replay, dead_discard):
        command.add_argument("seq", type=int, help="the dead letter's sequence, as `list` prints it")
    for command in (dead_list, dead_replay, dead_discard):
        command.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    keys = sub.add_parser("keys", help="API keys of the gateway's clients")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="mint a key (printed once; only its hash is stored)")
    create.add_argument("--tenant", required=True)
    create.add_argument(
        "--scope",
        action="append",
        required=True,
        choices=[s.value for s in Scope],
        help="repeat for several scopes",
    )
    create.add_argument(
        "--agent",
        action="append",
        default=None,
        help="an agent the key may start with ?agent= (repeat for several; * for every agent);"
        " none: the default agent only",
    )
    create.add_argument("--name", default="", help="what the key is for (shown by `keys list`)")
    listing = keys_sub.add_parser("list", help="every key: id, tenant, scopes, state (never a secret)")
    revoke = keys_sub.add_parser("revoke", help="refuse a key from every gateway's next request on")
    revoke.add_argument("key_id")
    for command in (create, listing, revoke):
        command.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    guests = sub.add_parser("guests", help="guest profiles: verified address, corporate manager, preferences")
    guests_sub = guests.add_subparsers(dest="guests_command", required=True)
    guest_show = guests_sub.add_parser("show", help="a guest's profile as runs read it")
    guest_set = guests_sub.add_parser("set", help="set a guest's verified email (and corporate manager)")
    guest_set.add_argument(
        "--email",
        "--verified-email",
        dest="email",
        default=None,
        help="the only address a message to the guest may go to",
    )
    guest_set.add_argument("--corporate", action="store_true", default=None, help="bookings need a manager")
    guest_set.add_argument("--manager", default=None, help="who approves a corporate traveller's bookings")
    for command in (guest_show, guest_set):
        command.add_argument("guest_id")
        command.add_argument("--tenant", default="demo", help="default: the stack's own tenant")
        command.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    approvals = sub.add_parser(
        "approvals", help="actions held for a manager's approval (through the gateway)"
    )
    approvals_sub = approvals.add_subparsers(dest="approvals_command", required=True)
    approvals_list = approvals_sub.add_parser("list", help="approvals of your tenant (an admin key: all)")
    approvals_list.add_argument("--status", choices=["pending", "approved", "rejected", "expired"])
    approve = approvals_sub.add_parser("approve", help="approve a pending approval (once; 409 if decided)")
    reject = approvals_sub.add_parser("reject", help="reject a pending approval (once; 409 if decided)")
    for command in (approve, reject):
        command.add_argument("approval_id")
        command.add_argument("--approver", required=True, help="who decides (journaled as manager:NAME)")
        command.add_argument("--reason", default="")
    for command in (approvals_list, approve, reject):
        command.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
        command.add_argument("--gateway-url", default=None, help="default: the running stack's gateway")
    capability_key = sub.add_parser("capability-key", help="the runtime's capability signing keys")
    capability_key_sub = capability_key.add_subparsers(dest="capability_key_command", required=True)
    new_key = capability_key_sub.add_parser(
        "new", help="write a new Ed25519 key pair: PATH (0600, for the runtime) and PATH.pub (for executors)"
    )
    new_key.add_argument("--out", required=True, help="the private key's path, e.g. keys/capability-2.key")

    config = sub.add_parser(
        "config", help="the configuration catalog (agents' tools, rules, budgets, routes)"
    )
    config_sub = config.add_subparsers(dest="config_command", required=True)
    config_show = config_sub.add_parser(
        "show", help="the newest catalog revision, or --revision N (0: built-in)"
    )
    config_show.add_argument("--revision", type=int, default=None)
    config_validate = config_sub.add_parser("validate", help="check a catalog file against this deployment")
    config_validate.add_argument("file")
    config_publish = config_sub.add_parser(
        "publish", help="validate a catalog file and publish it as the next revision (operator); prints it"
    )
    config_publish.add_argument("file")
    config_publish.add_argument("--label", default=None, help="name this revision (shown by `config show`)")
    for command in (config_show, config_validate, config_publish):
        command.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    check = sub.add_parser("check", help="end-to-end checks of a running deployment")
    check_sub = check.add_subparsers(dest="check_command", required=True)
    synthetic = check_sub.add_parser(
        "synthetic",
        help="one synthetic turn: the test tenant's hotel search through gateway, runtime, model and executor",
    )
    synthetic.add_argument("--gateway", help="the gateway's URL (default: the running stack's)")
    synthetic.add_argument(
        "--key", help="the synthetic tenant's API key (default: <state-dir>/synthetic_key)"
    )
    synthetic.add_argument("--budget", type=float, help="seconds before the turn counts as slow (default 30)")
    synthetic.add_argument(
        "--record", action="store_true", help="also publish the result on ops.synthetic.cli (operator's NATS)"
    )
    synthetic.add_argument("--json", action="store_true", help="the result as one JSON line")
    synthetic.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    infra = sub.add_parser("infra", help="declare streams and consumers")
    infra_sub = infra.add_subparsers(dest="infra_command", required=True)
    apply = infra_sub.add_parser(
        "apply",
        help="create every stream and bucket, or add what this release needs (additive, idempotent; operator)",
    )
    contract = infra_sub.add_parser(
        "contract",
        help="take away what only an older release used (old journal layout, old subjects); refused while a"
        " process of an older release is alive (operator)",
    )
    for command in (apply, contract):
        command.add_argument(
            "--state-dir", default=None, help="a running stack's (its URL and operator credential)"
        )
    nats_auth = infra_sub.add_parser(
        "nats-auth", help="write NATS users (server config fragment) and per-role credentials for a cluster"
    )
    nats_auth.add_argument("--out", required=True, help="directory for auth.conf and creds/<user>.creds")
    nats_auth.add_argument("--namespace", default="crashsafe")
    nats_auth.add_argument("--registry", default="crashsafe.services.agents:stayhub")
    nats_auth.add_argument("--partitions", type=int, default=4, help="CRASHSAFE_ACTION_PARTITIONS")

    upgrade = sub.add_parser(
        "upgrade", help="a rolling upgrade: which releases are alive (version heartbeats)"
    )
    upgrade_sub = upgrade.add_subparsers(dest="upgrade_command", required=True)
    upgrade_check = upgrade_sub.add_parser(
        "check",
        help=f"before a rollout: every live process's release; exit 1 if {VERSION} may not run beside one",
    )
    upgrade_status = upgrade_sub.add_parser(
        "status", help="after a rollout: `converged on X` (exit 0) once every live process runs one release"
    )
    for command in (upgrade_check, upgrade_status):
        command.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    return parser
