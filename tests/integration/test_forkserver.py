"""A service forked from the warm server is the process a fresh interpreter would be: its own environment, import
path, log, exit status and session, and a child of the stack's process that SIGKILL kills like any other."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crashsafe.forkserver import ForkedService, ForkServer, ForkServerError


@pytest.fixture
def server() -> ForkServer:
    return ForkServer.shared(dict(os.environ))


def _wait(process: ForkedService) -> int:
    return process.wait(timeout=30)


def test_a_forked_service_gets_its_own_environment_and_import_path_and_says_why_it_exits(
    server: ForkServer, tmp_path: Path
) -> None:
    (tmp_path / "adopter_registry_probe.py").write_text(
        'raise SystemExit("probe imported from PYTHONPATH")\n'
    )
    log = tmp_path / "runtime.log"
    env = {**os.environ, "CRASHSAFE_REGISTRY": "adopter_registry_probe:registry", "PYTHONPATH": str(tmp_path)}
    process = server.fork(["serve", "runtime"], env, log)
    assert _wait(process) == 1, "sys.exit with a message is status 1, as in a fresh interpreter"
    assert "probe imported from PYTHONPATH" in log.read_text(), (
        "the request's PYTHONPATH and registry were used"
    )

    process = server.fork(["serve", "runtime"], {**env, "CRASHSAFE_REGISTRY": "no_such_registry_xyz"}, log)
    assert _wait(process) == 1
    assert "CRASHSAFE_REGISTRY='no_such_registry_xyz'" in log.read_text(), "the environment is the request's"

    process = server.fork(["serve", "no-such-service"], env, log)
    assert _wait(process) == 2, "argparse's own status"
    assert "invalid choice: 'no-such-service'" in log.read_text()


def test_a_forked_service_is_a_child_of_the_stacks_process_in_a_session_of_its_own(
    server: ForkServer, tmp_path: Path
) -> None:
    # A service that runs until killed: a runtime with no broker keeps retrying its connection.
    env = {**os.environ, "CRASHSAFE_NATS_URL": "nats://127.0.0.1:1", "CRASHSAFE_DATA_DIR": str(tmp_path)}
    process = server.fork(["serve", "runtime"], env, tmp_path / "runtime.log")

    def stat_fields() -> list[str]:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()

    assert int(stat_fields()[1]) == os.getpid(), "adopted: this process waits on it and reads its status"
    # The service's first act is its own session: the pid is known before it has run (a loaded machine may not
    # have scheduled it yet), so it is looked at until then, for at most 10 s.
    deadline = time.monotonic() + 10
    while int(stat_fields()[3]) != process.pid and time.monotonic() < deadline:
        time.sleep(0.01)
    assert int(stat_fields()[3]) == process.pid, (
        "its own session, as start_new_session gives a fresh interpreter"
    )
    assert process.poll() is None
    os.kill(process.pid, signal.SIGKILL)
    assert _wait(process) == -signal.SIGKILL
    assert process.poll() == -signal.SIGKILL, "the status stays known once read"


def test_a_server_that_died_is_started_again_and_a_dead_server_is_a_typed_error(tmp_path: Path) -> None:
    first = ForkServer.shared(dict(os.environ))
    first._process.kill()
    first._process.wait()
    with pytest.raises(ForkServerError):
        first.fork(["serve", "no-such-service"], dict(os.environ), tmp_path / "x.log")
    again = ForkServer.shared(dict(os.environ))
    assert again is not first
    assert _wait(again.fork(["serve", "no-such-service"], dict(os.environ), tmp_path / "x.log")) == 2


def test_a_fresh_interpreter_exits_as_the_forked_service_does(tmp_path: Path) -> None:
    """The fallback path, where there is no fork server: the same command, the same status."""
    fresh = subprocess.run(
        [sys.executable, "-m", "crashsafe.cli", "serve", "no-such-service"], capture_output=True, text=True
    )
    assert fresh.returncode == 2
    assert "invalid choice: 'no-such-service'" in fresh.stderr
