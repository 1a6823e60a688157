"""The gateway over HTTPS when CRASHSAFE_TLS_CERT_FILE / _KEY_FILE are set: a real process, a certificate this
test generates, a real request (plaintext stays the default: every other test)."""

from __future__ import annotations

import ipaddress
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from crashsafe.contracts.clients import Scope
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.subjects import Namespace
from crashsafe.natsd import NatsServer, free_port
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.provisioning import provision
from crashsafe.services.records.client_keys import ClientKeys
from tests.support.nats_users import access
from tests.support.stack import auth_header, guest_event
from tests.support.waiting import eventually


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, signed by its own key (P-256), valid for a day."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "crashsafe-gateway-test")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "gateway.crt", directory / "gateway.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


@pytest.fixture
async def https_gateway(
    tmp_path: Path, nats_server: NatsServer, namespace: Namespace, broker: Broker
) -> AsyncIterator[tuple[str, Path, Path]]:
    """`crashsafe serve gateway` with a certificate; yields (its https URL, the certificate, its log)."""
    await provision(broker, namespace)  # the operator's job: the gateway's NATS user may not make streams
    creds = access(nats_server.url, Role.GATEWAY).creds
    cert, key = self_signed(tmp_path)
    port = free_port()
    log = tmp_path / "gateway.log"
    env = {
        **os.environ,
        "CRASHSAFE_NATS_URL": nats_server.url,
        "CRASHSAFE_NAMESPACE": namespace.name,
        "CRASHSAFE_GATEWAY_PORT": str(port),
        "CRASHSAFE_TLS_CERT_FILE": str(cert),
        "CRASHSAFE_TLS_KEY_FILE": str(key),
        "CRASHSAFE_WORKER_ID": "gateway-tls",
        **({"CRASHSAFE_NATS_CREDS": str(creds)} if creds is not None else {}),
    }
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "crashsafe.cli", "serve", "gateway"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        yield f"https://127.0.0.1:{port}", cert, log
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_the_gateway_serves_https_with_the_configured_certificate(
    https_gateway: tuple[str, Path, Path], broker: Broker, namespace: Namespace
) -> None:
    url, cert, log = https_gateway
    trusted = ssl.create_default_context(cafile=str(cert))
    keys = ClientKeys(broker, namespace)
    await keys.ensure()
    key = (await keys.create("acme", [Scope.EVENTS_WRITE])).key
    async with httpx.AsyncClient(base_url=url, verify=trusted, timeout=5) as https:

        async def ready() -> bool:
            try:
                return (await https.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(ready, what=f"the HTTPS gateway to be ready (log {log})", timeout_s=30)
        accepted = await https.post("/v1/events", json=guest_event(text="hello"), headers=auth_header(key))
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["run_id"].startswith("run_")
    assert "listening on https://" in log.read_text()
    # A client that does not trust the certificate is refused by TLS, and plaintext is not served on the port.
    async with httpx.AsyncClient(base_url=url, timeout=5) as untrusting:
        with pytest.raises(httpx.ConnectError):
            await untrusting.get("/healthz")
    async with httpx.AsyncClient(base_url=url.replace("https://", "http://"), timeout=5) as plain:
        with pytest.raises(httpx.HTTPError):
            response = await plain.get("/healthz")
            response.raise_for_status()
