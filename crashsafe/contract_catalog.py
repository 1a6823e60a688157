"""What `contracts/` declares, read by introspection: messages, subjects, streams, consumers, buckets, headers.

The generated documents (docs/events.md, docs/schemas/, docs/asyncapi.json, contracts/lock.json) all render from
these functions, so a field, subject or consumer added to the contracts shows up in them by itself; nothing here
is a hand-kept list of what exists, only of what travels where (`CHANNEL_MESSAGES`, checked complete by a test).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

import crashsafe.contracts
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tokens import digest as _digest

# The documents describe the default namespace; a deployment's `CRASHSAFE_NAMESPACE` replaces its first token.
NS = Namespace()
REGISTRY = "crashsafe.services.agents:stayhub"


# Messages -------------------------------------------------------------------------------------------------------


def _contract_modules() -> Iterator[Any]:
    """Every module of the contracts, those of its packages (`contracts/errors/`) too."""
    found = pkgutil.walk_packages(crashsafe.contracts.__path__, prefix="crashsafe.contracts.")
    for info in sorted(found, key=lambda i: i.name):
        yield importlib.import_module(info.name)


def _structs() -> list[type[msgspec.Struct]]:
    found = []
    for module in _contract_modules():
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, msgspec.Struct)
                and value.__module__ == module.__name__
                and not value.__name__.startswith("_")
            ):
                found.append(value)
    return found


def tag_of(cls: type[msgspec.Struct]) -> str | None:
    tag = cls.__struct_config__.tag
    return str(tag) if cls.__struct_config__.tag_field is not None and isinstance(tag, str) else None


def name_of(cls: type[Any]) -> str:
    """A message's stable name: its wire tag; a struct without one (a KV record, a nested part) its class name."""
    return (tag_of(cls) if issubclass(cls, msgspec.Struct) else None) or cls.__name__


@dataclass(frozen=True, slots=True)
class Message:
    cls: type[msgspec.Struct]
    top_level: bool  # sent or stored on its own (not only inside another message)

    @property
    def name(self) -> str:
        return name_of(self.cls)

    @property
    def module(self) -> str:
        return self.cls.__module__

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.cls.__doc__ or "")

    @property
    def comments(self) -> dict[str, str]:
        """Each field's comment in the source (trailing, or the `#` lines right above it): why it exists."""
        return field_comments(self.cls)

    @property
    def info(self) -> mi.StructType:
        info = mi.type_info(self.cls)
        assert isinstance(info, mi.StructType)
        return info


_FIELD = re.compile(r"^\s+(\w+)\s*:[^#]*?(?:#\s*(.*))?$")


def field_comments(cls: type[Any]) -> dict[str, str]:
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    above: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = _FIELD.match(line)
        if match and match.group(1) in cls.__struct_fields__:
            found[match.group(1)] = " ".join([*above, match.group(2) or ""]).strip()
        above = []
    return {k: v for k, v in found.items() if v}


def _referenced(t: mi.Type) -> Iterator[type[Any]]:
    """The struct classes a field's type names (inside lists, unions, dicts)."""
    if isinstance(t, mi.StructType):
        yield t.cls
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            yield from _referenced(member)
    elif isinstance(t, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        yield from _referenced(t.item_type)
    elif isinstance(t, mi.TupleType):
        for member in t.item_types:
            yield from _referenced(member)
    elif isinstance(t, mi.DictType):
        yield from _referenced(t.key_type)
        yield from _referenced(t.value_type)


def messages() -> list[Message]:
    """Every struct of the contracts, abstract tagged bases left out, ordered by name."""
    structs = _structs()
    tagged = [c for c in structs if c.__struct_config__.tag_field is not None]
    bases = {c for c in tagged if any(o is not c and issubclass(o, c) for o in tagged)}
    concrete = [c for c in structs if c not in bases]
    nested = {
        ref
        for c in concrete
        for f in mi.type_info(c).fields  # type: ignore[attr-defined]
        for ref in _referenced(f.type)
    }
    return sorted((Message(c, c not in nested) for c in concrete), key=lambda m: m.name)


def render_type(t: mi.Type) -> str:
    """A field's type as the lock and the docs spell it; any change of this string is a change of the wire."""
    simple = {
        mi.StrType: "str",
        mi.IntType: "int",
        mi.FloatType: "float",
        mi.BoolType: "bool",
        mi.NoneType: "null",
        mi.AnyType: "any",
        mi.DateTimeType: "datetime",
        mi.DateType: "date",
        mi.BytesType: "bytes",
    }
    for kind, spelled in simple.items():
        if isinstance(t, kind):
            constraints = [
                f"{c}={getattr(t, c)}"
                for c in ("min_length", "max_length", "pattern", "ge", "gt", "le", "lt", "multiple_of", "tz")
                if getattr(t, c, None) is not None
            ]
            return f"{spelled}({', '.join(constraints)})" if constraints else spelled
    if isinstance(t, mi.StructType):
        return name_of(t.cls)
    if isinstance(t, mi.UnionType):
        return " | ".join(render_type(m) for m in t.types)
    if isinstance(t, mi.ListType):
        return f"list[{render_type(t.item_type)}]{_bounds(t)}"
    if isinstance(t, mi.VarTupleType):
        return f"tuple[{render_type(t.item_type)}, ...]{_bounds(t)}"
    if isinstance(t, mi.TupleType):
        return f"tuple[{', '.join(render_type(m) for m in t.item_types)}]"
    if isinstance(t, (mi.SetType, mi.FrozenSetType)):
        return f"set[{render_type(t.item_type)}]{_bounds(t)}"
    if isinstance(t, mi.DictType):
        return f"dict[{render_type(t.key_type)}, {render_type(t.value_type)}]{_bounds(t)}"
    if isinstance(t, mi.EnumType):
        return f"enum {t.cls.__name__}({', '.join(sorted(str(m.value) for m in t.cls))})"
    if isinstance(t, mi.LiteralType):
        return f"literal({', '.join(sorted(repr(v) for v in t.values))})"
    return type(t).__name__.removesuffix("Type").lower()


def _bounds(t: mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType | mi.DictType) -> str:
    """A container's length bounds (a bound added refuses what old writers wrote): `(max_length=3)`, or ""."""
    bounds = [f"{c}={getattr(t, c)}" for c in ("min_length", "max_length") if getattr(t, c, None) is not None]
    return f"({', '.join(bounds)})" if bounds else ""


def default_of(field: mi.Field) -> str | None:
    """A field's default as JSON (None: required)."""
    if field.default is not msgspec.NODEFAULT:
        value = field.default
    elif field.default_factory is not msgspec.NODEFAULT:
        value = field.default_factory()
    else:
        return None
    try:
        return msgspec.json.encode(value).decode()
    except TypeError:
        return repr(value)


# Subjects, keys and names of a namespace ------------------------------------------------------------------------

# Builders that parse a subject rather than build one.
_NOT_BUILDERS = {"stream", "outcome_source", "fired_run", "actions_for_key"}


@dataclass(frozen=True, slots=True)
class Template:
    method: str  # the Namespace member that builds it
    kind: str  # subject | wildcard | consumer | bucket | key
    template: str  # with `{param}` where a parameter goes
    params: tuple[str, ...]
    doc: str

    def sample(self) -> str:
        """A concrete instance (each parameter a literal token), to match against permissions."""
        return re.sub(
            r"\{digest\((\w+)\)\}|\{(\w+)\}", lambda m: f"x_{m.group(1) or m.group(2)}", self.template
        )


def _sentinel(param: str) -> str:
    return f"qq{param}qq"  # a valid token of every kind (family names are lower-case, `_` inside)


def _comment_above(lines: list[str], line_no: int) -> str:
    """The `#` comment block right above a definition (decorators skipped): why a subject exists."""
    out: list[str] = []
    i = line_no - 2
    while i >= 0 and lines[i].strip().startswith("@"):
        i -= 1
    while i >= 0 and lines[i].strip().startswith("#"):
        out.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(out)


def templates(ns: Namespace = NS) -> list[Template]:
    """Every subject, durable, bucket and key template `Namespace` builds, in source order."""
    source, first = inspect.getsourcelines(Namespace)
    found = []
    for name, member in vars(Namespace).items():
        if name.startswith("_") or name in _NOT_BUILDERS:
            continue
        build: Callable[..., Any]
        params: tuple[str, ...]
        if isinstance(member, property) and member.fget is not None:
            build, params, func = (lambda f=member.fget: f(ns)), (), member.fget
        elif inspect.isfunction(member):
            params = tuple(p for p in inspect.signature(member).parameters if p != "self")
            build, func = (lambda f=member, ps=params: f(ns, *map(_sentinel, ps))), member
        else:
            continue
        value = build()
        if not isinstance(value, str):
            continue
        for p in params:
            value = value.replace(_sentinel(p), f"{{{p}}}").replace(_digest(_sentinel(p)), f"{{digest({p})}}")
        doc = inspect.cleandoc(func.__doc__ or "") or _comment_above(
            source, func.__code__.co_firstlineno - first + 1
        )
        if name.endswith("_consumer"):
            kind = "consumer"
        elif name.endswith("_bucket"):
            kind = "bucket"
        elif not value.startswith(f"{ns.name}."):
            kind = "key"
        elif "*" in value or ">" in value:
            kind = "wildcard"
        else:
            kind = "subject"
        found.append(Template(name, kind, value, params, " ".join(doc.split())))
    return found


# What travels on each subject: the one hand-kept table here, keyed by `Namespace` builder and checked complete
# (tests/unit/test_contract_docs.py: every subject builder has an entry, every name is a message).
CHANNEL_MESSAGES: dict[str, tuple[str, ...]] = {
    "inbound": ("inbound.guest_message",),
    "run_event": (
        "run.started",
        "run.model_asked",
        "run.model_answered",
        "run.model_rejected",
        "run.action_requested",
        "run.tool_rejected",
        "run.policy_denied",
        "run.approval_requested",
        "run.approval_decided",
        "run.action_completed",
        "run.turn_received",
        "run.nudged",
        "run.resumed",
        "run.completed",
        "run.handed_off",
    ),
    # The journal as the bus (issue 33): an intent on its executor's subject, a receipt on its family's.
    "run_intent": ("run.action_requested",),
    "run_receipt": ("run.action_completed",),
    "actions": ("action.request",),
    "outcomes": ("action.outcome",),
    "wakes": ("run.wake",),
    "dead_letters": ("dead_letter",),
    "support": ("support.ticket",),
    "projection": ("projection.task",),
    "ops": ("ops.projection_failed", "ops.synthetic"),
    "approval_timer": ("run.wake",),  # a schedule: its body fires to timer.fired.<run_id>
    "timer_cancelled": (),  # an empty body with `Nats-Schedule-Next: purge`
    "timer_fired": ("run.wake",),
    # Request/reply (issue 11): the gateway asks a family's executors what the provider says about a key.
    "provider_view": ("provider_view.request", "provider_view.reply"),
    # Signed checkpoints of run heads (issue 34), one after the other.
    "checkpoints": ("checkpoint",),
}


# Headers ---------------------------------------------------------------------------------------------------------

_MEMBER = re.compile(r"^\s+(\w+)\s*=\s*\"([^\"]+)\"(?:\s*#\s*(.*))?$")


def headers() -> list[tuple[str, str]]:
    """Every `Header` name with its source comment (trailing, or the `#` lines above it)."""
    from crashsafe.contracts.headers import Header

    comments: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(Header).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = _MEMBER.match(line)
        if match:
            comments[match.group(2)] = " ".join([*above, match.group(3) or ""]).strip()
        above = []
    return [(h.value, comments.get(h.value, "")) for h in Header]


def wildcard(template: Template) -> str:
    """The template with each parameter as `*` (a parameter is always one whole token of a subject)."""
    return re.sub(r"\{[^}]+\}", "*", template.template)
