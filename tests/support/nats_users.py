"""The NATS users a test connects as: every nats-server a test starts has users on (as a deployment does), and
each in-process service connects with its own role's credential, so a permission a service lacks fails here.

Test code that injects what no service may send (a forged request, a raw journal append, a consumer's state)
connects as `operator`: the administrator role, which may do anything in a namespace (docs/security.md).
"""

from __future__ import annotations

from pathlib import Path

from crashsafe.contracts.nats_permissions import Role
from crashsafe.natsd import NatsAuth, NatsCluster, NatsServer
from crashsafe.services.platform.settings import NatsAccess

_BY_URL: dict[str, NatsAuth] = {}


def admit(server: NatsServer | NatsCluster) -> None:
    """Remember the users of a server (or cluster) a test started, by its URL."""
    if server.auth is not None:
        _BY_URL[server.url] = server.auth


def auth_for(url: str) -> NatsAuth | None:
    return _BY_URL.get(url.split(",")[0].strip())


def access(url: str, role: Role, family: str | None = None) -> NatsAccess:
    """The credential of `role` on the server at `url` (none if that server admits anyone)."""
    auth = auth_for(url)
    return NatsAccess(creds=auth.creds(role, family)) if auth is not None else NatsAccess()


def creds_dir(url: str) -> Path | None:
    auth = auth_for(url)
    if auth is None:
        return None
    auth.prepare()
    return auth.directory
