"""The pure permission table: the issue's least-privilege rules hold for any namespace and registry."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crashsafe.contracts.archive_permissions import PURGE_ANY
from crashsafe.contracts.jetstream_api import DESTRUCTIVE
from crashsafe.contracts.nats_permissions import Role, user_for, users
from crashsafe.contracts.subjects import Namespace, StreamKind

# Family names that cannot collide with a fixed subject token (`action`, `lease`, the namespace).
FAMILIES = st.sets(st.from_regex(r"fam[a-z0-9]{1,6}", fullmatch=True), min_size=1, max_size=4)


@given(FAMILIES)
def test_only_the_runtime_appends_journals_or_asks_for_actions_and_an_executor_only_its_receipts(
    families: set[str],
) -> None:
    ns = Namespace("prod")
    for user in users(ns, families):
        publishes = user.permissions.publish
        if user.role is Role.OPERATOR:
            continue  # the administrator (docs/security.md)
        receipts = {s for s in publishes if s.startswith("prod.run.*.receipt.")}
        journal = any(s.startswith("prod.run.") for s in set(publishes) - receipts)
        actions = any(s.startswith("prod.action.") for s in publishes)
        assert journal == actions == (user.role is Role.RUNTIME), user.name
        # The journal as the bus: an executor appends receipts into journals, on its own family's subject only.
        expected = {f"prod.run.*.receipt.{user.family}"} if user.role is Role.EXECUTOR else set()
        assert receipts == expected, user.name


@given(FAMILIES)
def test_an_executor_publishes_and_consumes_only_its_own_family(families: set[str]) -> None:
    all_users = users(Namespace("prod"), families)
    for family in families:
        executor = user_for(all_users, Role.EXECUTOR, family)
        others = families - {family}
        for subject in executor.permissions.publish:
            tokens = subject.replace("_", ".").split(".")
            assert not others & set(tokens), f"{executor.name} may reach {subject}"
        assert f"prod.outcome.{family}.*" in executor.permissions.publish


def test_no_service_role_may_change_or_remove_a_stream() -> None:
    for user in users(Namespace("prod"), {"payment"}):
        if user.role is Role.OPERATOR:
            assert not user.permissions.publish_deny
            continue
        # The reconciler archives journals: it alone may purge, and only RUNS (contracts/archive_permissions.py).
        kept = [d for d in DESTRUCTIVE if user.role is not Role.RECONCILER or d != PURGE_ANY]
        assert list(user.permissions.publish_deny[: len(kept)]) == kept
        assert not any(".STREAM.CREATE" in s or ".STREAM.UPDATE" in s for s in user.permissions.publish)


def test_only_the_reconciler_purges_and_only_the_runs_stream() -> None:
    ns = Namespace("prod")
    every = users(ns, {"payment"})
    purgers = {u.role: [s for s in u.permissions.publish if ".STREAM.PURGE." in s] for u in every}
    assert {role for role, found in purgers.items() if found} == {Role.RECONCILER}
    assert purgers[Role.RECONCILER] == [f"$JS.API.STREAM.PURGE.{ns.stream(StreamKind.RUNS)}"]
    denied = user_for(every, Role.RECONCILER).permissions.publish_deny
    assert {f"$JS.API.STREAM.PURGE.{ns.stream(k)}" for k in StreamKind if k is not StreamKind.RUNS} <= set(
        denied
    )


def test_analytics_reads_the_runs_stream_and_publishes_nothing_in_the_namespace() -> None:
    analytics = user_for(users(Namespace("prod"), {"payment"}), Role.ANALYTICS)
    assert not [s for s in analytics.permissions.publish if s.startswith(("prod.", "$KV."))]
    assert all("PROD_RUNS" in s or "PROD_SUPPORT" in s for s in analytics.permissions.publish)


def test_only_the_runtime_and_the_reconciler_publish_support_tickets() -> None:
    every = users(Namespace("prod"), {"payment"})
    publishers = {u.role for u in every if "prod.support.*.*" in u.permissions.publish}
    assert publishers == {Role.RUNTIME, Role.RECONCILER}


def test_every_user_listens_only_on_its_own_inbox_and_its_own_deliveries() -> None:
    for user in users(Namespace("prod"), {"payment"}):
        inbox, *rest = user.permissions.subscribe
        assert inbox == f"_INBOX.{user.name}.>"
        if user.role is Role.RUNTIME:
            # It pulls its three durables (flow control, issue 17): it asks for messages, none are pushed to it.
            assert rest == []
            assert {
                "$JS.API.CONSUMER.MSG.NEXT.PROD_INBOUND.runtime_inbound",
                "$JS.API.CONSUMER.MSG.NEXT.PROD_OUTCOMES.runtime_outcomes",
                "$JS.API.CONSUMER.MSG.NEXT.PROD_TIMERS.runtime_timers",
            } <= set(user.permissions.publish)
        elif user.role is Role.OPERATOR:
            assert rest == ["prod.>"]
        elif user.role is Role.EXECUTOR:
            assert rest == [f"prod.provider_view.{user.family}"]  # its own family's provider views (issue 11)
        else:
            assert rest == []


def test_the_any_namespace_scope_keeps_the_roles_apart() -> None:
    gateway = user_for(users(None, {"payment"}), Role.GATEWAY)
    assert "*.inbound.*" in gateway.permissions.publish
    assert not any(".action." in s or ".run." in s for s in gateway.permissions.publish)


def test_analytics_may_not_take_the_projectors_run_events() -> None:
    """Its own durables on RUNS, never the planner's: a reader pulling and acking them would take runs' ends
    (and their emails and CRM records) away from the projector."""
    analytics = user_for(users(Namespace("prod"), {"payment"}), Role.ANALYTICS)
    denied = analytics.permissions.publish_deny
    assert "$JS.API.CONSUMER.MSG.NEXT.PROD_RUNS.projector_planner" in denied
    assert "$JS.ACK.PROD_RUNS.projector_planner.>" in denied
    assert "$JS.API.CONSUMER.CREATE.PROD_RUNS.projector_planner.>" in denied


@given(FAMILIES)
def test_each_service_writes_only_its_own_version_heartbeats(families: set[str]) -> None:
    every = users(Namespace("prod"), families)
    for user in every:
        beats = [s for s in user.permissions.publish if s.startswith("$KV.prod_versions.")]
        if user.role is Role.OPERATOR:
            assert "$KV.>" in user.permissions.publish  # it writes and reads them all
        elif user.role is Role.ANALYTICS:
            assert beats == []
        else:
            assert beats == [f"$KV.prod_versions.beat.{user.name}.*"], user.name
