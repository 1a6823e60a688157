"""`crashsafe infra nats-auth` for a real cluster: private files, no secret in the server's config, and a
nats-server that includes the fragment admits each role as the table says."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from crashsafe import infra
from crashsafe.contracts.errors import NotPermitted
from crashsafe.natsd import free_port, nats_server_binary
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.nats_users import read_credential
from crashsafe.services.platform.settings import NatsAccess


def test_credentials_are_private_and_the_config_holds_only_public_keys(tmp_path: Path) -> None:
    assert infra.infra_nats_auth(tmp_path, "stayhub", "crashsafe.services.agents:stayhub", 4) == 0
    creds = sorted((tmp_path / "creds").glob("*.creds"))
    names = {p.stem for p in creds}
    assert names == {
        "gateway", "runtime", "executor-booking", "executor-memory", "executor-notify", "executor-payment",
        "reconciler", "operator", "analytics", "projector",
    }  # fmt: skip
    config = (tmp_path / "auth.conf").read_text()
    for path in [*creds, tmp_path / "auth.conf"]:
        assert path.stat().st_mode & 0o777 == 0o600, path
    for path in creds:
        credential = read_credential(path)
        assert credential.seed not in config and credential.public_key in config
    # Run again (a registry change): the same identities, so running pods keep working.
    seeds = {p.name: read_credential(p).seed for p in creds}
    infra.infra_nats_auth(tmp_path, "stayhub", "crashsafe.services.agents:stayhub", 4)
    assert {p.name: read_credential(p).seed for p in creds} == seeds


async def test_a_server_including_the_fragment_admits_each_role_to_its_subjects(tmp_path: Path) -> None:
    infra.infra_nats_auth(tmp_path, "stayhub", "crashsafe.services.agents:stayhub", 4)
    port = free_port()
    (tmp_path / "nats.conf").write_text(
        f"listen: 127.0.0.1:{port}\njetstream {{ store_dir: {tmp_path / 'js'} }}\ninclude ./auth.conf\n"
    )
    log = tmp_path / "nats.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [nats_server_binary(), "-c", str(tmp_path / "nats.conf")], stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 20
        while "Server is ready" not in log.read_text() and time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()
            time.sleep(0.02)
        url = f"nats://127.0.0.1:{port}"
        gateway = await Broker.connect(url, "g", access=NatsAccess(creds=tmp_path / "creds/gateway.creds"))
        try:
            with pytest.raises(NotPermitted):
                await gateway.publish("stayhub.action.payment.0", b"{}", timeout_s=5)
        finally:
            await gateway.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
