"""The gateway's pure rules about clients (domain/access.py), quotas (domain/token_buckets.py) and the
active-runs record (contracts/active.py). Over real HTTP: tests/e2e/test_trust.py."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from crashsafe.contracts.active import GRACE_S, ActiveRuns, entry_deadline
from crashsafe.contracts.clients import ApiKeyRecord, Scope, format_key, secret_hash, split_key
from crashsafe.contracts.errors import (
    AgentNotAllowed,
    ApproverStartedRun,
    ApproverStartsRuns,
    Forbidden,
    Unauthenticated,
)
from crashsafe.deployment import DECIDING_KEY_FILES, api_key_for
from crashsafe.domain.access import (
    Client,
    authenticate,
    parse_bearer,
    require,
    require_agent,
    require_approver,
    require_not_starter,
)
from crashsafe.domain.token_buckets import Rate, TokenBuckets

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
KEY_ID = "0123456789abcdef"
SECRET = secrets.token_urlsafe(32)


def record(**changes: object) -> ApiKeyRecord:
    fields: dict[str, object] = {
        "key_id": KEY_ID,
        "tenant": "acme",
        "scopes": ["events:write", "runs:read"],
        "secret_sha256": secret_hash(SECRET),
        "created_at": NOW - timedelta(days=1),
    }
    return ApiKeyRecord(**(fields | changes))  # type: ignore[arg-type]


# Keys ---------------------------------------------------------------------------------------------------------


def test_a_key_is_its_id_and_its_secret_and_parses_back() -> None:
    key = format_key(KEY_ID, SECRET)
    assert key.startswith(f"csk_{KEY_ID}_") and split_key(key) == (KEY_ID, SECRET)
    assert parse_bearer(f"Bearer {key}") == (KEY_ID, SECRET)
    assert parse_bearer(f"bearer   {key} ") == (KEY_ID, SECRET)  # the scheme is case-insensitive


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        pytest.param(None, "missing", id="no-header"),
        pytest.param("  ", "missing", id="blank"),
        pytest.param(f"Basic {format_key(KEY_ID, SECRET)}", "malformed", id="other-scheme"),
        pytest.param("Bearer ", "malformed", id="no-key"),
        pytest.param(f"Bearer xsk_{KEY_ID}_{SECRET}", "malformed", id="other-prefix"),
        pytest.param(f"Bearer csk_{KEY_ID[:-1]}_{SECRET}", "malformed", id="short-id"),
        pytest.param(f"Bearer csk_{KEY_ID}_short", "malformed", id="short-secret"),
        pytest.param(f"Bearer csk_{KEY_ID}_{SECRET[:-1]}*", "malformed", id="bad-character"),
    ],
)
def test_an_unreadable_authorization_is_unauthenticated_naming_why(header: str | None, reason: str) -> None:
    with pytest.raises(Unauthenticated) as refused:
        parse_bearer(header)
    assert refused.value.details() == {"reason": reason}
    assert SECRET not in refused.value.message


def test_the_right_secret_authenticates_its_tenant_and_scopes() -> None:
    client = authenticate(KEY_ID, SECRET, record())
    assert client == Client(KEY_ID, "acme", frozenset({"events:write", "runs:read"}))


@pytest.mark.parametrize(
    ("secret", "stored", "reason"),
    [
        pytest.param(SECRET, None, "invalid", id="unknown-id"),
        pytest.param(secrets.token_urlsafe(32), record(), "invalid", id="wrong-secret"),
        pytest.param(SECRET, record(key_id="f" * 16), "invalid", id="record-of-another-id"),
        pytest.param(SECRET, record(revoked_at=NOW - timedelta(seconds=1)), "revoked", id="revoked"),
        # A revocation stamped by a clock ahead of the gateway's holds all the same.
        pytest.param(SECRET, record(revoked_at=NOW + timedelta(days=1)), "revoked", id="revoked-ahead"),
        # Only the holder of the right secret learns that a key was revoked.
        pytest.param(secrets.token_urlsafe(32), record(revoked_at=NOW), "invalid", id="revoked-wrong-secret"),
    ],
)
def test_a_key_that_proves_nothing_is_unauthenticated(
    secret: str, stored: ApiKeyRecord | None, reason: str
) -> None:
    with pytest.raises(Unauthenticated) as refused:
        authenticate(KEY_ID, secret, stored)
    assert refused.value.reason == reason


def test_a_scope_is_required_and_admin_holds_every_scope_and_tenant() -> None:
    client = authenticate(KEY_ID, SECRET, record())
    require(client, Scope.EVENTS_WRITE)
    with pytest.raises(Forbidden) as refused:
        require(client, Scope.RUNS_OPERATE)
    assert refused.value.details() == {"scope": "runs:operate", "key_id": KEY_ID}
    assert client.sees("acme") and not client.sees("globex") and not client.sees("")
    admin = authenticate(KEY_ID, SECRET, record(scopes=["admin"]))
    for scope in Scope:
        require(admin, scope)
    assert admin.sees("globex") and admin.sees("")


def test_a_key_starts_only_the_agents_it_names_and_one_naming_none_only_the_default() -> None:
    """Issue 17: a tenant's booking key sent `?agent=support` and refunded another tenant's guest."""
    named = authenticate(KEY_ID, SECRET, record(agents=["booking"]))
    require_agent(named, "booking", "booking")
    with pytest.raises(AgentNotAllowed) as refused:
        require_agent(named, "support", "booking")
    assert refused.value.details() == {
        "agent": "support",
        "allowed": "booking",
        "tenant": "acme",
        "key_id": KEY_ID,
    }
    older = authenticate(KEY_ID, SECRET, record())  # minted before keys named agents: the default agent only
    require_agent(older, "booking", "booking")
    with pytest.raises(AgentNotAllowed):
        require_agent(older, "support", "booking")
    every = authenticate(KEY_ID, SECRET, record(agents=["*"]))
    require_agent(every, "support", "booking")
    require_agent(Client(key_id="a", tenant="ops", scopes=frozenset({"admin"})), "support", "booking")


def test_an_approval_needs_a_managers_key_never_one_that_starts_runs() -> None:
    """Issue 17: the key whose run held a refund for a manager approved it itself (runs:operate sufficed)."""
    starter = Client(
        key_id="k1", tenant="evil", scopes=frozenset({"events:write", "runs:read", "runs:operate"})
    )
    with pytest.raises(Forbidden) as missing:
        require_approver(starter)
    assert missing.value.details()["scope"] == "approvals:decide"
    both = Client(key_id="k2", tenant="evil", scopes=frozenset({"events:write", "approvals:decide"}))
    with pytest.raises(ApproverStartsRuns):
        require_approver(both)
    require_approver(Client(key_id="k3", tenant="evil", scopes=frozenset({"approvals:decide", "runs:read"})))
    require_approver(Client(key_id="k4", tenant="ops", scopes=frozenset({"admin"})))


def test_the_key_that_started_a_run_never_decides_its_approvals_an_admin_key_included() -> None:
    """Issue 31, item 9: `crashsafe up` mints one admin key, which starts the stack's runs and passes the scope
    rule (admin holds approvals:decide), so the key that asked approved. The run's starting key is refused by id."""
    with pytest.raises(ApproverStartedRun) as refused:
        require_not_starter("k_admin", "k_admin", "run_1")
    assert refused.value.code.value == "forbidden" and "run_1" in refused.value.message
    assert "approver_key" in refused.value.message  # where the stack's deciding key is
    require_not_starter("k_approver", "k_admin", "run_1")  # another key (the stack's approver) decides
    # A run journaled by 0.2.0 recorded no starting key: not known, so the scope rule alone decides, as before.
    require_not_starter("k_admin", "", "run_2")


def test_a_scope_a_newer_writer_granted_is_kept_and_never_matches_a_known_one() -> None:
    client = authenticate(KEY_ID, SECRET, record(scopes=["runs:approve"]))
    assert not any(client.may(scope) for scope in Scope)


# Rates --------------------------------------------------------------------------------------------------------


def test_a_bucket_grants_its_burst_then_one_token_per_interval() -> None:
    buckets = TokenBuckets(Rate(per_s=2.0, burst=3.0))
    assert [buckets.take("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a", 0.0) == pytest.approx(0.5)  # the next token comes in half a second
    assert buckets.take("b", 0.0) == 0.0  # another key has its own bucket
    assert buckets.take("a", 0.5) == 0.0
    assert buckets.take("a", 0.5) == pytest.approx(0.5)
    assert [buckets.take("a", 100.0) for _ in range(4)][:3] == [
        0.0,
        0.0,
        0.0,
    ]  # refilled, never past the burst


def test_a_rate_of_zero_is_no_limit_and_idle_buckets_are_forgotten() -> None:
    unlimited = TokenBuckets(Rate.of(0.0))
    assert all(unlimited.take("a", 0.0) == 0.0 for _ in range(10_000))
    small = TokenBuckets(Rate(per_s=1.0, burst=1.0), max_keys=2)
    for key in ("a", "b", "c"):
        assert small.take(key, 0.0) == 0.0
    assert small.take("a", 0.0) == 0.0  # "a" was the least recently used: forgotten, so full again
    assert small.take("c", 0.0) > 0.0


def test_a_bucket_full_again_is_forgotten_so_a_gateway_keeps_only_the_recent_guests() -> None:
    buckets = TokenBuckets(Rate(per_s=20.0, burst=40.0))  # full again 2 s after its last take
    for guest in range(1_000):
        assert buckets.take(f"g{guest}", 0.0) == 0.0
    for _ in range(40):
        buckets.take("flood", 1.0)
    assert len(buckets) == 1_001
    assert buckets.take("late", 2.5) == 0.0
    assert len(buckets) == 2  # the thousand idle since 0.0 are full again: forgotten; the flood is not
    assert buckets.take("flood", 2.5) == 0.0 and buckets.take("g1", 2.5) == 0.0
    assert [buckets.take("flood", 2.5) for _ in range(40)].count(
        0.0
    ) == 29  # 1.5 s refilled 30; one taken above


# Active runs --------------------------------------------------------------------------------------------------


def test_an_active_run_counts_once_until_its_deadline_or_its_end() -> None:
    until = entry_deadline(NOW)
    assert until == NOW + timedelta(seconds=90 + GRACE_S)
    one = ActiveRuns().with_run("run_a", until, NOW)
    again = one.with_run("run_a", until + timedelta(hours=1), NOW)
    assert again.live(NOW) == {"run_a": until}  # the same run twice counts once, with its first deadline
    two = again.with_run("run_b", until, NOW)
    assert len(two.live(NOW)) == 2 and two.without_run("run_a", NOW).live(NOW) == {"run_b": until}
    # Past its deadline an entry no longer counts (a crash never wedges a guest), and the next write drops it.
    later = until + timedelta(seconds=1)
    assert two.live(later) == {} and two.with_run(
        "run_c", later + timedelta(minutes=2), later
    ).runs.keys() == {"run_c"}
    assert two.retry_after_s(NOW) == pytest.approx(90 + GRACE_S) and ActiveRuns().retry_after_s(NOW) == 1.0


def test_scripts_read_the_key_from_the_environment_else_the_stacks_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CRASHSAFE_API_KEY", raising=False)
    assert api_key_for(tmp_path) is None
    (tmp_path / "api_key").write_text("csk_from_file\n")
    assert api_key_for(tmp_path) == "csk_from_file"
    monkeypatch.setenv("CRASHSAFE_API_KEY", "csk_from_env")
    assert api_key_for(tmp_path) == "csk_from_env"


def test_the_cli_decides_with_the_stacks_approver_key_and_lists_with_its_admin_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin key starts the stack's runs, so it may not decide their approvals: `crashsafe approvals
    approve|reject` sends `<state>/approver_key`; a state dir from before it had one, its admin key."""
    monkeypatch.delenv("CRASHSAFE_API_KEY", raising=False)
    (tmp_path / "api_key").write_text("csk_admin\n")
    assert api_key_for(tmp_path, DECIDING_KEY_FILES) == "csk_admin"
    (tmp_path / "approver_key").write_text("csk_approver\n")
    assert api_key_for(tmp_path, DECIDING_KEY_FILES) == "csk_approver"
    assert api_key_for(tmp_path) == "csk_admin"
    monkeypatch.setenv("CRASHSAFE_API_KEY", "csk_from_env")  # the operator's own choice comes first
    assert api_key_for(tmp_path, DECIDING_KEY_FILES) == "csk_from_env"
