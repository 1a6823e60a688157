"""The `crashsafe` command: parses arguments (crashsafe/cli_arguments.py) and hands over to a service's composition root
or to the command module that prints an operator task's result (crashsafe/<command>.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from crashsafe.cli_arguments import DEFAULT_STATE_DIR, SERVICES, build_parser
from crashsafe.contracts.errors import CrashsafeError, InvalidSetting

__all__ = ["DEFAULT_STATE_DIR", "SERVICES", "build_parser", "main"]


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _serve(args: argparse.Namespace) -> int:
    from crashsafe.domain import registry as registries
    from crashsafe.services.platform import collector
    from crashsafe.services.platform.settings import Settings

    settings = Settings.from_env()
    stop = _stop_event()
    if args.service == "sandbox":
        from crashsafe.sandbox.app import serve

        await serve(host="127.0.0.1", port=settings.sandbox_port, data_dir=settings.data_dir / "sandbox")
        return 0
    try:
        registry = registries.load(settings.registry)
    except (ImportError, ValueError) as exc:
        sys.exit(f"crashsafe: CRASHSAFE_REGISTRY={settings.registry!r}: {exc}")
    collector.settle()
    match args.service:
        case "gateway":
            from crashsafe.services.console.console_router import console_router
            from crashsafe.services.gateway import bootstrap as gateway

            # The evidence console at /console, in the gateway's process: mounted here, the gateway knows no console.
            await gateway.run(settings, registry, stop, mounted=[console_router()])
        case "runtime":
            from crashsafe.services.runtime import bootstrap as runtime

            await runtime.run(settings, registry, stop)
        case "executor":
            from crashsafe.services.executor import bootstrap as executor

            families = sorted(registry.families)
            if args.tool not in registry.families:
                sys.exit(f"crashsafe serve executor needs --tool FAMILY, one of {', '.join(families)}")
            if args.partitions:
                settings = settings.with_partitions(args.partitions)
            await executor.run(settings, registry, stop, args.tool)
        case "reconciler":
            from crashsafe.services.reconciler import bootstrap as reconciler

            await reconciler.run(settings, registry, stop)
        case "projector":
            from crashsafe.services.projector import bootstrap as projector

            await projector.run(settings, registry, stop)
    return 0


# Operator commands: each module imported when its command runs (services start without rich or the sandbox).


async def _keys(args: argparse.Namespace) -> int:
    from crashsafe import keys_command

    state_dir = Path(args.state_dir)
    match args.keys_command:
        case "create":
            return await keys_command.keys_create(state_dir, args.tenant, args.scope, args.name, args.agent)
        case "list":
            return await keys_command.keys_list(state_dir)
        case _:
            return await keys_command.keys_revoke(state_dir, args.key_id)


async def _config(args: argparse.Namespace) -> int:
    from crashsafe import config

    state_dir = Path(args.state_dir)
    match args.config_command:
        case "validate":
            return config.validate(state_dir, Path(args.file))
        case "show":
            return await config.show(state_dir, args.revision)
        case _:
            return await config.publish(state_dir, Path(args.file), args.label)


async def _guests(args: argparse.Namespace) -> int:
    from crashsafe import guests

    if args.guests_command == "show":
        return await guests.guests_show(Path(args.state_dir), args.tenant, args.guest_id)
    if args.corporate and not args.manager:
        raise InvalidSetting(variable="--manager", value="", expected="the manager of a corporate traveller")
    return await guests.guests_set(
        Path(args.state_dir),
        args.tenant,
        args.guest_id,
        email=args.email,
        corporate=args.corporate,
        manager=args.manager,
    )


async def _projections(args: argparse.Namespace) -> int:
    from crashsafe import projections_command

    if args.projections_command == "list":
        return await projections_command.projections_list(Path(args.state_dir), args.status, args.run)
    return await projections_command.projections_retry(Path(args.state_dir), args.key)


def _verify(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    """Offline (a bundle file; no broker, no credentials) or `--live` against the deployment."""
    from crashsafe.verify_command import trusted_keys, verify_command

    if not args.live:
        if args.bundle is None:
            print("crashsafe verify: name a bundle file, or --live", file=sys.stderr)
            return 2
        return verify_command(Path(args.bundle), [Path(p) for p in args.trust], args.json, args.registry)
    from crashsafe.evidence_command import verify_live_command
    from crashsafe.verify_command import BadTrustedKey

    try:
        keys = trusted_keys([Path(p) for p in args.trust])
    except BadTrustedKey as exc:
        print(f"crashsafe verify: {exc}", file=sys.stderr)
        return 2
    return verify_live_command(Path(args.state_dir), args.since, args.until, keys, args.json)


async def _runs(args: argparse.Namespace) -> int:
    from crashsafe import runs

    state_dir = Path(args.state_dir)
    if args.command == "tail":
        return await runs.tail(state_dir, args.run_id, args.session_id, args.types, args.json, args.since)
    if args.runs_command == "export":
        from crashsafe.evidence_command import export_evidence_command

        out = Path(args.out) if args.out else None
        return await export_evidence_command(state_dir, args.evidence, out, not args.no_providers)
    if args.runs_command == "list":
        return await runs.runs_list(
            state_dir, args.status, args.guest, args.since, args.json, args.limit, args.stats
        )
    return await runs.runs_show(state_dir, args.run_id, args.json)


async def _approvals(args: argparse.Namespace) -> int:
    from crashsafe import approvals_command

    state_dir = Path(args.state_dir)
    if args.approvals_command == "list":
        return await approvals_command.approvals_list(state_dir, args.status, args.gateway_url)
    decision = "approve" if args.approvals_command == "approve" else "reject"
    return await approvals_command.approvals_decide(
        state_dir, args.approval_id, decision, args.approver, args.reason, args.gateway_url
    )


async def _replay(args: argparse.Namespace) -> int:
    from crashsafe.replay import export_command, replay_command

    if args.command == "export":
        out = Path(args.out) if args.out else None
        return await export_command(Path(args.state_dir), args.run_id, out)
    file = Path(args.file) if args.file else None
    return await replay_command(Path(args.state_dir), args.run_id, args.until, args.diff, file, args.json)


def _operate(args: argparse.Namespace) -> Coroutine[Any, Any, int] | int:
    """The command's task: a coroutine for the event loop, or (for the ones that need no broker) its exit code."""
    match args.command:
        case "demo":
            from crashsafe.demo import run_demo

            return run_demo(
                args.crash, Path(args.state_dir) if args.state_dir else None, keep_up=args.keep_up
            )
        case "up":
            from crashsafe.demo import run_up

            return run_up(
                Path(args.state_dir),
                args.nats_url,
                args.scale,
                args.providers,
                args.model_url,
                registry=args.registry,
                crash=args.crash,
            )
        case "crash-test":
            from crashsafe.crash_test_command import crash_test_command

            return crash_test_command(args)
        case "new":
            from crashsafe.new_agent_command import new_agent_command

            return new_agent_command(args.name, Path(args.dir))
        case "down":
            from crashsafe.down import down

            return down(Path(args.state_dir))
        case "runs" | "tail":
            return _runs(args)
        case "replay" | "export":
            return _replay(args)
        case "verify":
            return _verify(args)
        case "infra":
            from crashsafe import infra

            if args.infra_command == "nats-auth":
                return infra.infra_nats_auth(Path(args.out), args.namespace, args.registry, args.partitions)
            state_dir = Path(args.state_dir) if args.state_dir else None
            if args.infra_command == "contract":
                return infra.infra_contract(state_dir)
            return infra.infra_apply(state_dir)
        case "upgrade":
            from crashsafe import upgrade_command

            if args.upgrade_command == "check":
                return upgrade_command.upgrade_check(Path(args.state_dir))
            return upgrade_command.upgrade_status(Path(args.state_dir))
        case "reconcile" | "audit":
            from crashsafe import audit_command

            if args.command == "audit":
                return audit_command.audit(Path(args.state_dir))
            return audit_command.reconcile(Path(args.state_dir), args.run_id)
        case "keys":
            return _keys(args)
        case "projections":
            return _projections(args)
        case "dead-letters":
            from crashsafe.dead_letters_command import dead_letters_command

            seq, show_all = getattr(args, "seq", None), getattr(args, "all", False)
            return dead_letters_command(Path(args.state_dir), args.dead_command, seq, show_all)
        case "guests":
            return _guests(args)
        case "approvals":
            return _approvals(args)
        case "config":
            return _config(args)
        case "check":
            from crashsafe.check import check_synthetic

            state_dir = Path(args.state_dir)
            return check_synthetic(state_dir, args.gateway, args.key, args.budget, args.record, args.json)
        case _:
            from crashsafe.keys_command import capability_key_new

            return capability_key_new(Path(args.out))


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # An adopter's registry in the directory they run `crashsafe` from imports as it would with `python -m`
    # (the console script's own folder is first on the path, not theirs); last, so nothing installed is shadowed.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        if args.command == "serve":
            sys.exit(asyncio.run(_serve(args)))
        task = _operate(args)
        sys.exit(task if isinstance(task, int) else asyncio.run(task))
    except CrashsafeError as exc:
        # A setting or an argument the product cannot use: one line that says what to change, no traceback.
        sys.exit(f"crashsafe: {exc.message}")


if __name__ == "__main__":
    main()
