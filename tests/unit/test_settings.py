"""Settings: the one reader of the environment, its one-line errors, and the README table that documents it."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from crashsafe.services.platform.environment_variables import VARIABLES
from crashsafe.services.platform.settings import InvalidSetting, Settings, parse_partitions
from tests.support.paths import ROOT


def test_the_readme_table_lists_exactly_the_variables_settings_reads() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Configuration (environment)", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Z_<>]+)` \| `([^`]*)` \|", section, flags=re.M)
    assert [name for name, _ in rows] == [v.name for v in VARIABLES]
    assert dict(rows) == {v.name: v.default for v in VARIABLES}


def test_nothing_but_settings_reads_the_environment() -> None:
    """`os.environ` / `os.getenv` appear only in settings.py and in the supervisor that hands env to children."""
    allowed = {
        ROOT / "services/platform/settings.py",
        ROOT / "crashsafe/stack.py",
        ROOT / "crashsafe/stack_env.py",
        ROOT / "crashsafe/forkserver.py",  # sets each forked service's environment, as Popen(env=) does
    }
    readers: list[str] = []
    for top in ("contracts", "services", "sandbox", "crashsafe"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "os"
                    and node.attr in {"environ", "getenv", "environb"}
                    and path not in allowed
                ):
                    readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not readers, f"environment read outside Settings: {readers}"


def test_every_variable_is_read_and_checked(tmp_path: Path) -> None:
    cert, key = tmp_path / "gateway.crt", tmp_path / "gateway.key"
    cert.write_text("cert")
    key.write_text("key")
    files = {
        name: tmp_path / name for name in ("nats.creds", "ca.pem", "cert.pem", "key.pem", "synthetic.key")
    }
    for path in files.values():
        path.write_text("x")
    env = {
        "CRASHSAFE_NATS_URL": "nats://nats:4222",
        "CRASHSAFE_NAMESPACE": "stayhub",
        "CRASHSAFE_REGISTRY": "bench.workloads:registry",
        "CRASHSAFE_ACTION_PARTITIONS": "8",
        "CRASHSAFE_PARTITIONS": "2-3,7",
        "CRASHSAFE_DATA_DIR": "/data",
        "CRASHSAFE_SQLITE_SYNC": "full",
        "CRASHSAFE_ACK_WAIT_S": "2.5",
        "CRASHSAFE_STREAM_REPLICAS": "3",
        "CRASHSAFE_GATEWAY_HOST": "0.0.0.0",
        "CRASHSAFE_GATEWAY_PORT": "9000",
        "CRASHSAFE_SANDBOX_URL": "http://sandbox:8090",
        "CRASHSAFE_SANDBOX_PORT": "9001",
        "CRASHSAFE_WORKER_ID": "pod-1",
        "CRASHSAFE_LOG_LEVEL": "debug",
        "CRASHSAFE_CRASH_AT": "executor.after_intent",
        "CRASHSAFE_MODEL": "gpt-x",
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": "https://models.example/v1",
        "OPENAI_ORG_ID": "org-1",
        "OPENAI_PROJECT_ID": "proj-1",
        "CRASHSAFE_API_KEY": "csk_0123456789abcdef_" + "s" * 43,
        "CRASHSAFE_TLS_CERT_FILE": str(cert),
        "CRASHSAFE_TLS_KEY_FILE": str(key),
        "CRASHSAFE_RATE_PER_CLIENT": "50",
        "CRASHSAFE_RATE_PER_GUEST": "0",
        "CRASHSAFE_RECONCILE_PER_MINUTE": "2.5",
        "CRASHSAFE_ACTIVE_RUNS_PER_GUEST": "3",
        "CRASHSAFE_TURNS_PER_RUN": "7",
        "CRASHSAFE_RUN_INBOX": "0",
        "CRASHSAFE_CAPABILITY_SIGNING_KEY": "/keys/capability.key",
        "CRASHSAFE_CAPABILITY_VERIFY_KEYS": "/keys/old.pub, /keys/new.pub",
        "CRASHSAFE_NATS_CREDS": str(files["nats.creds"]),
        "CRASHSAFE_NATS_TLS_CA_FILE": str(files["ca.pem"]),
        "CRASHSAFE_NATS_TLS_CERT_FILE": str(files["cert.pem"]),
        "CRASHSAFE_NATS_TLS_KEY_FILE": str(files["key.pem"]),
        "CRASHSAFE_PROJECTION_TIME_SCALE": "0.01",
        "CRASHSAFE_SYNTHETIC_GATEWAY_URL": "http://gateway:8080",
        "CRASHSAFE_SYNTHETIC_KEY_FILE": str(files["synthetic.key"]),
        "CRASHSAFE_SYNTHETIC_EVERY_S": "60",
        "CRASHSAFE_SYNTHETIC_BUDGET_S": "12.5",
        "CRASHSAFE_KNOWLEDGE_DIR": "/knowledge",
        "CRASHSAFE_OPS_HOST": "0.0.0.0",
        "CRASHSAFE_OPS_PORT": "0",
        "CRASHSAFE_LOOP_STALL_S": "12.5",
        "CRASHSAFE_HOOK_LIMIT_S": "2.5",
        "CRASHSAFE_RETENTION_SESSIONS_S": "864000",
        "CRASHSAFE_RETENTION_ACTIVE_S": "0",
        "CRASHSAFE_RETENTION_APPROVALS_S": "86400",
        "CRASHSAFE_RETENTION_DEAD_MARKS_S": "3000000",
        "CRASHSAFE_RETENTION_RECEIPTS_S": "172800",
        "CRASHSAFE_RETENTION_STEP_ROWS_S": "90000",
        "CRASHSAFE_RETENTION_BUSINESS_ROWS_S": "0",
        "CRASHSAFE_PRUNE_EVERY_S": "30",
        "CRASHSAFE_PRUNE_BATCH": "100",
        "CRASHSAFE_RETENTION_JOURNALS_S": "86400",
        "CRASHSAFE_ARCHIVE_DIR": "/archive",
        "CRASHSAFE_ARCHIVE_EVERY_S": "30",
        "CRASHSAFE_STORE_BACKUP_DIR": "/backups",
        "CRASHSAFE_STORE_BACKUP_EVERY_S": "60",
        "CRASHSAFE_RETENTION_KEY_FACTS_S": "604800",
    }
    # A `<NAME>` variable is one per provider: tests/unit/test_provider_settings.py reads them.
    assert set(env) == {v.name for v in VARIABLES if "<NAME>" not in v.name}
    s = Settings.from_env(env)
    assert (s.nats_url, s.namespace.name, s.registry) == (
        "nats://nats:4222",
        "stayhub",
        "bench.workloads:registry",
    )
    assert (s.partitions, s.owned_partitions) == (8, (2, 3, 7))
    assert (s.data_dir, s.sqlite_sync, s.ack_wait_s, s.stream_replicas) == (Path("/data"), "FULL", 2.5, 3)
    assert (s.gateway_host, s.gateway_port, s.sandbox_url, s.sandbox_port) == (
        "0.0.0.0",
        9000,
        "http://sandbox:8090",
        9001,
    )
    assert (s.worker_id, s.log_level, s.crash_at, s.model) == (
        "pod-1",
        "DEBUG",
        "executor.after_intent",
        "gpt-x",
    )
    assert (s.openai_api_key, s.openai_base_url) == ("sk-test", "https://models.example/v1")
    assert (s.openai_organization, s.openai_project) == ("org-1", "proj-1")
    assert (s.api_key, s.tls_cert_file, s.tls_key_file) == (env["CRASHSAFE_API_KEY"], cert, key)
    assert (s.rate_per_client, s.rate_per_guest, s.reconcile_per_minute) == (50.0, 0.0, 2.5)
    assert s.active_runs_per_guest == 3
    assert (s.turns_per_run, s.run_inbox) == (7, 0)
    assert s.projection_time_scale == 0.01
    assert (s.ops_host, s.ops_port, s.loop_stall_s) == ("0.0.0.0", 0, 12.5)
    assert s.capability_signing_key == Path("/keys/capability.key")
    assert s.capability_verify_keys == (Path("/keys/old.pub"), Path("/keys/new.pub"))
    access = s.nats_access
    assert (access.creds, access.tls_ca_file, access.tls_cert_file, access.tls_key_file) == (
        files["nats.creds"],
        files["ca.pem"],
        files["cert.pem"],
        files["key.pem"],
    )
    assert s.projection_time_scale == 0.01
    assert (s.synthetic_gateway_url, s.synthetic_key_file) == ("http://gateway:8080", files["synthetic.key"])
    assert (s.synthetic_every_s, s.synthetic_budget_s, s.knowledge_dir) == (60.0, 12.5, Path("/knowledge"))
    kept = s.retention
    assert (kept.sessions_s, kept.active_s, kept.approvals_s) == (864000, 0, 86400)
    assert kept.dead_marks_s == 3000000
    assert (kept.receipts_s, kept.step_rows_s, kept.business_rows_s) == (172800, 90000, 0)
    assert (kept.prune_every_s, kept.prune_batch) == (30.0, 100)
    assert (kept.journals_s, kept.archive_every_s, s.archive_dir) == (86400, 30.0, Path("/archive"))
    assert (s.store_backups.dir, s.store_backups.every_s, kept.key_facts_s) == (
        Path("/backups"),
        60.0,
        604800,
    )


def test_defaults_point_the_model_at_the_sandbox() -> None:
    s = Settings.from_env({})
    assert s.owned_partitions == (0, 1, 2, 3) and s.registry == "crashsafe.services.agents:stayhub"
    assert (s.openai_api_key, s.openai_base_url) == ("sandbox", "http://127.0.0.1:8090/v1")


def test_defaults_fill_in_only_where_the_environment_is_silent() -> None:
    s = Settings.from_env(
        {"CRASHSAFE_NAMESPACE": "env"},
        defaults={"CRASHSAFE_NAMESPACE": "file", "CRASHSAFE_NATS_URL": "nats://f"},
    )
    assert (s.namespace.name, s.nats_url) == ("env", "nats://f")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CRASHSAFE_ACTION_PARTITIONS", "four"),
        ("CRASHSAFE_ACTION_PARTITIONS", "0"),
        ("CRASHSAFE_PARTITIONS", "5"),
        ("CRASHSAFE_PARTITIONS", "a-b"),
        ("CRASHSAFE_NAMESPACE", "Not A Token"),
        ("CRASHSAFE_SQLITE_SYNC", "sometimes"),
        ("CRASHSAFE_ACK_WAIT_S", "-1"),
        ("CRASHSAFE_GATEWAY_PORT", "70000"),
        ("CRASHSAFE_STREAM_REPLICAS", "many"),
        ("CRASHSAFE_LOG_LEVEL", "loud"),
        ("CRASHSAFE_RATE_PER_CLIENT", "-1"),
        ("CRASHSAFE_ACTIVE_RUNS_PER_GUEST", "1.5"),
        ("CRASHSAFE_TLS_CERT_FILE", "/no/such/file.pem"),
        ("CRASHSAFE_NATS_CREDS", "/nonexistent/operator.creds"),
        ("CRASHSAFE_NATS_TLS_CA_FILE", "/nonexistent/ca.pem"),
        ("CRASHSAFE_PROJECTION_TIME_SCALE", "0"),
        ("CRASHSAFE_PROJECTION_TIME_SCALE", "fast"),
        ("CRASHSAFE_OPS_PORT", "65536"),
        ("CRASHSAFE_OPS_PORT", "ops"),
        # A retention below what its late readers need would expire a record still in use.
        ("CRASHSAFE_RETENTION_SESSIONS_S", "3600"),
        ("CRASHSAFE_RETENTION_DEAD_MARKS_S", "2592000"),
        ("CRASHSAFE_RETENTION_APPROVALS_S", "-1"),
        ("CRASHSAFE_RETENTION_RECEIPTS_S", "1.5"),
        ("CRASHSAFE_RETENTION_STEP_ROWS_S", "60"),
        ("CRASHSAFE_PRUNE_EVERY_S", "0"),
        ("CRASHSAFE_PRUNE_BATCH", "none"),
        # A journal purged inside the reconciler's look-back, or after its receipts expired (never archivable).
        ("CRASHSAFE_RETENTION_JOURNALS_S", "3600"),
        ("CRASHSAFE_RETENTION_JOURNALS_S", "604800"),
        ("CRASHSAFE_ARCHIVE_EVERY_S", "0"),
        ("CRASHSAFE_STORE_BACKUP_EVERY_S", "0"),
        # Facts that expire where no backup restores a moved partition's store: the facts are all it has.
        ("CRASHSAFE_RETENTION_KEY_FACTS_S", "604800"),
        ("CRASHSAFE_RETENTION_KEY_FACTS_S", "-1"),
    ],
)
def test_an_unusable_value_names_the_variable_and_what_it_accepts(name: str, value: str) -> None:
    with pytest.raises(InvalidSetting) as raised:
        Settings.from_env({name: value})
    assert raised.value.variable == name
    assert raised.value.message.startswith(f"{name}={value!r} is not usable: ")


def test_gateway_tls_wants_both_files_or_neither(tmp_path: Path) -> None:
    cert = tmp_path / "gateway.crt"
    cert.write_text("cert")
    with pytest.raises(InvalidSetting) as raised:
        Settings.from_env({"CRASHSAFE_TLS_CERT_FILE": str(cert)})
    assert raised.value.variable == "CRASHSAFE_TLS_KEY_FILE"
    assert Settings.from_env({}).tls_cert_file is None  # plaintext is the default


def test_partitions_spec() -> None:
    assert parse_partitions("all", 4) == (0, 1, 2, 3)
    assert parse_partitions("0-1", 4) == (0, 1)
    assert parse_partitions("3,1", 4) == (1, 3)
    for bad in ("4", "x", "1-", "-1"):
        with pytest.raises(ValueError):
            parse_partitions(bad, 4)


def test_a_bad_setting_stops_a_service_with_one_line_and_no_traceback() -> None:
    env = {**os.environ, "CRASHSAFE_ACTION_PARTITIONS": "four"}
    done = subprocess.run(
        [sys.executable, "-m", "crashsafe.cli", "serve", "runtime"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "crashsafe: CRASHSAFE_ACTION_PARTITIONS='four' is not usable: a whole number >= 1"
    )


def test_an_executor_for_a_family_the_deployment_lacks_is_refused_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "crashsafe.cli", "serve", "executor", "--tool", "noop"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "booking, memory, notify, payment" in done.stderr


def test_no_journal_leaves_the_stream_unless_an_archive_is_configured() -> None:
    s = Settings.from_env({})
    assert s.archive_dir is None and s.retention.journals_s == 3 * 86_400  # the window waits for an archive


def test_key_facts_expire_only_with_backups_and_never_before_a_backup_round_and_a_lease() -> None:
    """Unset, facts are kept forever (0.2.0's behaviour) and nothing is backed up; with backups, a TTL below the
    round + the lease + the margin is refused, naming the variable and the floor."""
    s = Settings.from_env({})
    assert (s.store_backups.dir, s.store_backups.every_s, s.retention.key_facts_s) == (None, 300.0, 0)
    backed = {"CRASHSAFE_STORE_BACKUP_DIR": "/backups", "CRASHSAFE_STORE_BACKUP_EVERY_S": "600"}
    floor = 600 + Settings.lease_s + 120
    assert (
        Settings.from_env({**backed, "CRASHSAFE_RETENTION_KEY_FACTS_S": str(floor)}).retention.key_facts_s
        == floor
    )
    assert Settings.from_env({**backed, "CRASHSAFE_RETENTION_KEY_FACTS_S": "0"}).retention.key_facts_s == 0
    with pytest.raises(InvalidSetting) as raised:
        Settings.from_env({**backed, "CRASHSAFE_RETENTION_KEY_FACTS_S": str(floor - 1)})
    assert raised.value.variable == "CRASHSAFE_RETENTION_KEY_FACTS_S"
    assert f">= {floor}" in raised.value.message and "CRASHSAFE_STORE_BACKUP_DIR" in raised.value.message
