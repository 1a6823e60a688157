"""NATS over TLS as configuration: a certificate this test makes, a real nats-server requiring TLS, a service's
Broker connecting over tls:// with its role's credentials, and a plaintext client refused."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from crashsafe.contracts.errors import BrokerUnavailable
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.streams import stream_specs
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.natsd import NatsAuth, NatsServer, ServerTls
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.nats_users import write_private
from crashsafe.services.platform.settings import NatsAccess, Settings

NS = Namespace("tlsns")


def _pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it; returns (ca, cert, key) PEM paths."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "crashsafe test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_private(paths[2], _pem(key))
    return paths


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, NatsAuth, Path]]:
    root = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_certificates(root)
    auth = NatsAuth.for_deployment(root / "auth", NS, ["booking"])
    server = NatsServer(root / "nats", auth=auth, tls=ServerTls(cert, key)).start()
    yield server, auth, ca
    server.stop()


async def test_a_service_connects_over_tls_with_settings_from_the_environment(
    tls_server: tuple[NatsServer, NatsAuth, Path],
) -> None:
    server, auth, ca = tls_server
    assert server.url.startswith("tls://")
    operator = await Broker.connect(
        server.url, "tls-operator", access=NatsAccess(creds=auth.creds(Role.OPERATOR), tls_ca_file=ca)
    )
    try:
        for spec in stream_specs(NS):
            await operator.ensure_stream(spec)
    finally:
        await operator.close()
    # The gateway as a pod would configure it: URL, credential and CA from the environment.
    settings = Settings.from_env(
        {
            "CRASHSAFE_NATS_URL": server.url,
            "CRASHSAFE_NATS_CREDS": str(auth.creds(Role.GATEWAY)),
            "CRASHSAFE_NATS_TLS_CA_FILE": str(ca),
        }
    )
    gateway = await Broker.connect(settings.nats_url, "tls-gateway", access=settings.nats_access)
    try:
        published = await gateway.publish(NS.inbound("r1"), b"{}")
        assert published.seq == 1
        assert gateway.nc.connected_url is not None and gateway.nc.connected_url.scheme == "tls"
        await gateway.require_stream(NS.stream(StreamKind.INBOUND))
    finally:
        await gateway.close()


async def test_a_client_that_does_not_trust_the_ca_is_refused(
    tls_server: tuple[NatsServer, NatsAuth, Path],
) -> None:
    server, auth, _ = tls_server
    with pytest.raises(BrokerUnavailable):
        await Broker.connect(
            server.url, "untrusting", fail_fast=True, access=NatsAccess(creds=auth.creds(Role.GATEWAY))
        )


async def test_a_plaintext_client_is_refused(tls_server: tuple[NatsServer, NatsAuth, Path]) -> None:
    server, _, _ = tls_server
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        info = await asyncio.wait_for(reader.readline(), 5)
        assert json.loads(info.split(b" ", 1)[1])["tls_required"] is True
        writer.write(b'CONNECT {"verbose":false}\r\nPING\r\n')
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(1024), 5)
        assert b"PONG" not in answer  # the server never talks plaintext: it errs or hangs up
    finally:
        writer.close()
