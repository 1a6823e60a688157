"""NATS users on disk: an nkey per role (the seed 0600 for the client, the public key in the server's config)."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import nkeys  # type: ignore[import-untyped]

from crashsafe.contracts.errors import InvalidSetting
from crashsafe.contracts.nats_permissions import NatsUser, Role, user_name, users
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace

CREDS_VARIABLE = "CRASHSAFE_NATS_CREDS"
_HEADER = "# crashsafe NATS credentials: an nkey seed. Keep this file private (0600); the server holds only its public key."


@dataclass(frozen=True, slots=True)
class Credential:
    """One user's identity: the name (it picks the inbox prefix) and its nkey seed."""

    user: str
    seed: str

    @property
    def public_key(self) -> str:
        pair = nkeys.from_seed(bytearray(self.seed.encode()))
        try:
            return str(pair.public_key.decode())
        finally:
            pair.wipe()


def new_credential(user: str) -> Credential:
    seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    return Credential(user, seed.decode())


def creds_text(credential: Credential) -> str:
    return f"{_HEADER}\nuser: {credential.user}\nseed: {credential.seed}\n"


def read_credential(path: Path, variable: str = CREDS_VARIABLE) -> Credential:
    """A credential file as `write_credentials` writes it; anything else is an InvalidSetting naming `variable`."""
    expected = "a crashsafe NATS credential file (user: and seed: lines), readable by this process"
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidSetting(
            variable=variable, value=str(path), expected=f"{expected}: {exc.strerror}"
        ) from None
    fields = dict(
        (key.strip(), value.strip())
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
        for key, sep, value in [line.partition(":")]
        if sep
    )
    credential = Credential(fields.get("user", ""), fields.get("seed", ""))
    try:
        if not credential.user:
            raise ValueError("no user")
        credential.public_key  # noqa: B018 (decodes the seed: a bad one fails here, not at connect)
    except (ValueError, nkeys.NkeysError, TypeError):
        raise InvalidSetting(variable=variable, value=str(path), expected=expected) from None
    return credential


def write_private(path: Path, text: str) -> None:
    """Write a secret file readable by its owner only, never for a moment by anyone else."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # a new directory: its owner alone lists it
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def creds_path(directory: Path, user: str) -> Path:
    return directory / f"{user}.creds"


def ensure_credentials(directory: Path, users: list[NatsUser]) -> dict[str, Credential]:
    """Each user's credential under `directory`: kept if already there (a restart keeps its clients working),
    made otherwise."""
    out: dict[str, Credential] = {}
    for user in users:
        path = creds_path(directory, user.name)
        if path.exists():
            out[user.name] = read_credential(path, variable=str(path))
        else:
            out[user.name] = new_credential(user.name)
            write_private(path, creds_text(out[user.name]))
    return out


def authorization_block(users: list[NatsUser], credentials: dict[str, Credential]) -> str:
    """The server's `authorization` section: each user's public nkey and permissions (no secret in it)."""

    def quoted(subjects: tuple[str, ...]) -> str:
        return "[" + ", ".join(json.dumps(s) for s in subjects) + "]"

    entries = []
    for user in users:
        p = user.permissions
        deny = f", deny: {quoted(p.publish_deny)}" if p.publish_deny else ""
        responses = ",\n      allow_responses: true" if p.allow_responses else ""
        entries.append(
            f"    # {user.name}\n"
            f"    {{ nkey: {credentials[user.name].public_key}, permissions: {{\n"
            f"      publish: {{ allow: {quoted(p.publish)}{deny} }},\n"
            f"      subscribe: {{ allow: {quoted(p.subscribe)} }}{responses}\n"
            f"    }} }}"
        )
    return "authorization {\n  users: [\n" + ",\n".join(entries) + "\n  ]\n}"


@dataclass
class NatsAuth:
    """The users a server admits (public nkeys and permissions) and, under `directory`, each one's credential
    file (0600) to hand to the process of that role."""

    users: list[NatsUser]
    directory: Path
    credentials: dict[str, Credential] = field(default_factory=dict)

    @classmethod
    def for_deployment(
        cls,
        directory: Path,
        ns: Namespace | None,
        families: Iterable[str],
        partitions: int = DEFAULT_ACTION_PARTITIONS,
    ) -> NatsAuth:
        return cls(users(ns, families, partitions), directory)

    def prepare(self) -> None:
        if not self.credentials:
            self.credentials = ensure_credentials(self.directory, self.users)

    def creds(self, role: Role, family: str | None = None) -> Path:
        self.prepare()
        return creds_path(self.directory, user_name(role, family))

    def config(self) -> str:
        self.prepare()
        return authorization_block(self.users, self.credentials)
