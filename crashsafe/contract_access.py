"""Who may publish and read what, read from the NATS users (`crashsafe.contracts.nats_permissions.users()`), never spelled.

The server enforces exactly these permissions, so a document built from them cannot name a publisher the server
would refuse. Subject templates are compared with their parameters as `*` (a parameter is one whole token).
"""

from __future__ import annotations

from crashsafe.contract_catalog import NS, Template, wildcard
from crashsafe.contracts.jetstream_api import API, consumer_create
from crashsafe.contracts.nats_permissions import NatsUser, users
from crashsafe.contracts.stream_routes import matches
from crashsafe.contracts.streams import ConsumerSpec, StreamSpec
from crashsafe.contracts.subjects import Namespace
from crashsafe.stream_catalog import Consumer, consumers, registry, streams

_API = API.split(".")  # the JetStream API subject's leading tokens, as a permission spells them

# The NATS users of the reference deployment, and subject matching ---------------------------------------------


def roles(ns: Namespace = NS) -> list[NatsUser]:
    return users(ns, registry().families)


def overlaps(pattern: str, template: str) -> bool:
    """True if some subject matches both: a permission or filter against a template whose parameters are `*`."""
    pat, sub = pattern.split("."), template.split(".")
    for i, token in enumerate(pat):
        if token == ">" or (i < len(sub) and sub[i] == ">"):
            return len(sub) > i
        if i >= len(sub) or (token != "*" and sub[i] != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


def _users_but_operator(all_users: list[NatsUser]) -> list[NatsUser]:
    return [u for u in all_users if u.role.value != "operator"]


def _within(pattern: str, template: str) -> bool:
    """Every subject `pattern` matches is an instance of `template` (both with `*` parameters)."""
    pat, tem = pattern.split("."), template.split(".")
    return len(pat) == len(tem) and all(t == "*" or t == p for p, t in zip(pat, tem, strict=True))


def publishers(subject: str, all_users: list[NatsUser], narrower: tuple[str, ...] = ()) -> list[str]:
    """The users allowed to publish to some instance of `subject` (the operator, allowed all, left out); a
    permission wholly inside a `narrower` template (`outcome._wake.*` inside `outcome.*.*`) counts for that one."""
    return sorted(
        u.name
        for u in _users_but_operator(all_users)
        if any(
            overlaps(p, subject) and not any(_within(p, n) for n in narrower) for p in u.permissions.publish
        )
        and not any(matches(p, subject) for p in u.permissions.publish_deny)
    )


def narrower_than(template: Template, all_templates: list[Template]) -> tuple[str, ...]:
    """The other subject templates wholly inside this one (a literal where this one has a parameter)."""
    mine = wildcard(template)
    return tuple(
        wildcard(t)
        for t in all_templates
        if t.kind == "subject" and t.method != template.method and _within(wildcard(t), mine)
    )


def consumers_of(subject: str, ns: Namespace = NS) -> list[Consumer]:
    return [c for c in consumers(ns) if overlaps(c.spec.filter_subject, subject)]


def consumer_owners(spec: ConsumerSpec, all_users: list[NatsUser]) -> list[str]:
    """The users allowed to create (hence read) this very durable: a named create that names it, not a wildcard."""
    create = consumer_create(spec)
    return sorted(
        u.name
        for u in _users_but_operator(all_users)
        for p in u.permissions.publish
        if p.split(".")[5:6] == [spec.durable] and matches(p, create)
    )


def stream_of(subject: str, ns: Namespace = NS) -> StreamSpec | None:
    return next((s for s in streams(ns) if any(overlaps(p, subject) for p in s.subjects)), None)


def readers(subject: str, all_users: list[NatsUser], ns: Namespace = NS) -> list[str]:
    """The users allowed to create a consumer that sees some instance of `subject`: a named create whose filter
    overlaps it, a create of any name on its stream (`>`), or an ephemeral one (any filter within the stream)."""
    stream = stream_of(subject, ns)
    if stream is None:
        return []
    found = set()
    for u in _users_but_operator(all_users):
        for p in u.permissions.publish:
            tokens = p.split(".")
            if tokens[:4] == [*_API, "CONSUMER", "CREATE"] and tokens[4:5] in ([stream.name], ["*"]):
                rest = tokens[5:]
                if not rest or rest == [">"] or (len(rest) > 1 and overlaps(".".join(rest[1:]), subject)):
                    found.add(u.name)
            elif tokens[:5] == [*_API, "CONSUMER", "DURABLE", "CREATE"] and tokens[5:6] == [stream.name]:
                found.add(u.name)
    return sorted(found)
