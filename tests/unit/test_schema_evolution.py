"""Schema evolution, enforced: fields are only added, with defaults; old messages decode forever; readers skip what
they do not know. A breaking change is a new event type (a new tag plus an upcaster), never an edit.

contracts/lock.json records every message's fields (type, required); `just docs` extends it with additive changes
only. The previous release's lock, as it shipped (contracts/releases/<version>.json), is checked as well, so a
lock.json rewritten by hand hides nothing. tests/golden/v<n>/<type>.json keeps every version of every message's
encoding, forever.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest

from crashsafe import contract_catalog as cat
from crashsafe import contract_docs, release_snapshot, wire_lock
from crashsafe.contract_lock import Lock, breaking_changes, current, entry_of, merged
from crashsafe.contracts.release import previous_release
from crashsafe.contracts.run_events import UnknownEvent, decode_event
from tests.support.paths import GOLDEN, ROOT

pytestmark = pytest.mark.unit

DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    m.name: msgspec.json.Decoder(m.cls) for m in cat.messages() if cat.tag_of(m.cls)
}
HISTORY = sorted(p for paths in contract_docs.golden_versions().values() for p in paths)


def test_the_contracts_break_nothing_the_lock_holds() -> None:
    problems = breaking_changes(contract_docs.read_lock(), current())
    assert not problems, (
        "a breaking change to the contracts (a breaking change is a new event type, with an upcaster):\n"
        + "\n".join(problems)
    )


def test_the_contracts_break_nothing_the_previous_release_locked() -> None:
    release = previous_release()
    if release is None:
        pytest.skip("the first release has no release before it")
    snapshot = release_snapshot.previous()
    assert snapshot is not None, f"contracts/releases/{release.version}.json is missing"
    problems = breaking_changes(snapshot["messages"], current())
    assert not problems, (
        f"a breaking change to the contracts of release {snapshot['version']} (a new event type, with an "
        "upcaster, instead):\n" + "\n".join(problems)
    )


def _lock() -> Lock:
    return {
        "run.example": {
            "run_id": {"type": "str", "required": True},
            "reply": {"type": "str | null", "required": False},
        }
    }


def _changed(change: Any) -> Lock:
    now = json.loads(json.dumps(_lock()))
    change(now["run.example"])
    return now


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda fields: fields.pop("reply"), "run.example.reply: removed"),
        (
            lambda fields: fields.update(reply={"type": "str", "required": False}),
            "run.example.reply: type changed from str | null to str",
        ),
        (
            lambda fields: fields.update(reply={"type": "str | null", "required": True}),
            "run.example.reply: was optional, now required",
        ),
        (
            lambda fields: fields.update(tenant={"type": "str", "required": True}),
            "run.example.tenant: a new field without a default",
        ),
    ],
    ids=["removed", "retyped", "lost_its_default", "new_required"],
)
def test_a_breaking_change_is_named(change: Any, says: str) -> None:
    problems = breaking_changes(_lock(), _changed(change))
    assert len(problems) == 1 and problems[0].startswith(says), problems


def _field_lock(annotation: Any, default: Any = msgspec.NODEFAULT) -> Lock:
    """The lock of a message whose one field `x` is declared as `annotation` (with `default`)."""
    spec = ("x", annotation) if default is msgspec.NODEFAULT else ("x", annotation, default)
    info = msgspec.inspect.type_info(msgspec.defstruct("Example", [spec], kw_only=True))
    assert isinstance(info, msgspec.inspect.StructType)
    return {"run.example": {"x": entry_of(info.fields[0])}}


@pytest.mark.parametrize(
    ("was", "now"),
    [
        ((list[str], []), (Annotated[list[str], msgspec.Meta(max_length=3)], [])),
        ((dict[str, int], {}), (Annotated[dict[str, int], msgspec.Meta(min_length=1)], {})),
        ((int, 0), (Annotated[int, msgspec.Meta(multiple_of=5)], 0)),
        ((str, "eur"), (str, "usd")),
        ((int, 0), (int, 1)),
    ],
    ids=["list_bounded", "dict_bounded", "multiple_of", "default_changed", "number_default_changed"],
)
def test_a_narrowed_type_or_a_changed_default_is_breaking(was: Any, now: Any) -> None:
    """A bound on a list or a dict, a `multiple_of`, refuse what old writers wrote; a changed default changes what
    every old message without the field (and every `omit_defaults` one holding the old default) reads as."""
    assert breaking_changes(_field_lock(*was), _field_lock(*now)), (was, now)
    assert not breaking_changes(_field_lock(*was), _field_lock(*was))


def test_a_removed_message_type_is_breaking() -> None:
    assert breaking_changes(_lock(), {}) == [
        "run.example: the message type was removed (a type is kept forever)"
    ]


def test_additive_changes_pass_and_extend_the_lock() -> None:
    now = _changed(lambda fields: fields.update(tenant={"type": "str", "required": False}))
    now["run.example_v2"] = {"run_id": {"type": "str", "required": True}}
    loosened = _changed(lambda fields: fields.update(run_id={"type": "str", "required": False}))
    assert breaking_changes(_lock(), now) == [] and breaking_changes(_lock(), loosened) == []
    assert merged(_lock(), now) == now


def test_the_lock_spells_what_decoding_depends_on() -> None:
    """A field's type string changes with anything an old reader would refuse: a closed enum's values, a struct
    behind a reference, nullability, a bound."""
    lock = current()
    assert (
        lock["action.outcome"]["status"]["type"] == "enum OutcomeStatus(conflict, failed, succeeded, unknown)"
    )
    assert lock["run.action_completed"]["evidence"] == {
        "type": "list[Evidence]",
        "required": False,
        "default": "[]",
    }
    assert lock["run.started"]["run_id"] == {"type": "str", "required": True}
    assert lock["GuestMessage"]["text"]["type"] == "str(min_length=1, max_length=4000)"


# `just docs` renders every document from the source as written, not mutmut's rewrite of it.
renders_documents = pytest.mark.skipif(
    "MUTANT_UNDER_TEST" in os.environ, reason="renders the unmutated source"
)


@renders_documents
def test_just_docs_refuses_to_write_a_breaking_change(tmp_path: Path) -> None:
    locked = contract_docs.read_lock()
    locked["run.completed"]["outcome_code"] = {"type": "str", "required": False}  # a field that is gone today
    (tmp_path / "contracts").mkdir()
    (tmp_path / contract_docs.LOCK).write_text(json.dumps(locked))
    assert contract_docs.main(tmp_path) == 1
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()) == [contract_docs.LOCK]


@renders_documents
def test_just_docs_refuses_a_break_of_the_previous_release_the_locks_in_the_tree_hide(tmp_path: Path) -> None:
    """lock.json and wire.json rewritten to today's: the previous release's snapshot still names the break."""
    release = previous_release()
    if release is None:
        pytest.skip("the first release has no release before it")
    locked = current()
    shipped = {**locked, "run.gone": {"run_id": {"type": "str", "required": True}}}
    wire = wire_lock.current()
    wire["consumers"]["runtime_inbound"] = {**wire["consumers"]["runtime_inbound"], "max_deliver": 7}
    snapshot = {"version": release.version, "commit": release.commit, "wire": wire, "messages": shipped}
    release_snapshot.path_of(release.version, tmp_path).parent.mkdir(parents=True)
    release_snapshot.path_of(release.version, tmp_path).write_text(json.dumps(snapshot))
    (tmp_path / contract_docs.LOCK).write_text(json.dumps(locked))
    assert contract_docs.main(tmp_path) == 1
    assert release_snapshot.breaks(snapshot, wire_lock.current(), locked) == [
        f"against {release.version}: consumer runtime_inbound: redefined in place (max_deliver 7 to -1): a"
        " durable the previous release uses keeps its shape; a new shape takes a new durable name",
        f"against {release.version}: run.gone: the message type was removed (a type is kept forever)",
    ]


@renders_documents
def test_just_docs_writes_an_additive_change_into_the_lock(tmp_path: Path) -> None:
    locked = contract_docs.read_lock()
    older = {name: fields for name, fields in locked.items() if name != "support.ticket"}
    older["run.completed"] = {k: v for k, v in locked["run.completed"].items() if v["required"]}
    (tmp_path / "contracts").mkdir()
    (tmp_path / contract_docs.LOCK).write_text(json.dumps(older))
    assert contract_docs.main(tmp_path) == 0
    assert json.loads((tmp_path / contract_docs.LOCK).read_bytes()) == current()


# Every version of every message decodes with today's decoder ----------------------------------------------------


def test_every_current_golden_is_kept_as_its_newest_version() -> None:
    """Change a message additively, regenerate its golden (test_contracts.py), then `just docs` keeps the new
    encoding as the next version; the old one stays."""
    versions = contract_docs.golden_versions()
    for current_file in sorted(GOLDEN.glob("*.json")):
        kept = versions.get(current_file.name)
        assert kept and kept[-1].read_bytes() == current_file.read_bytes(), (
            f"{current_file.name} has no kept version equal to it: run `just docs`"
        )
    assert contract_docs.new_golden_versions() == {}


def _same_values(old: Any, decoded: Any, where: str) -> None:
    """Every value the old message holds is in the decoded one, unchanged (new fields hold their defaults)."""
    if isinstance(old, dict) and isinstance(decoded, dict):
        for key, value in old.items():
            assert key in decoded, f"{where}.{key} was dropped"
            _same_values(value, decoded[key], f"{where}.{key}")
    elif isinstance(old, list) and isinstance(decoded, list):
        assert len(old) == len(decoded), where
        for i, (a, b) in enumerate(zip(old, decoded, strict=True)):
            _same_values(a, b, f"{where}[{i}]")
    else:
        assert old == decoded, f"{where}: {old!r} became {decoded!r}"


@pytest.mark.parametrize("path", HISTORY, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_kept_golden_decodes_with_todays_decoder_to_the_same_values(path: Path) -> None:
    old = json.loads(path.read_bytes())
    cls = DECODERS[old["type"]].type
    # Decoding one struct type, msgspec accepts a message without its tag: a renamed tag field (`type` ->
    # `kind`) would pass the decode below while every tagged-union reader refuses the old messages.
    assert old.get(cls.__struct_config__.tag_field) == cls.__struct_config__.tag, "the tag field was renamed"
    decoded = DECODERS[old["type"]].decode(path.read_bytes())
    _same_values(old, json.loads(msgspec.json.encode(decoded)), old["type"])


@pytest.mark.parametrize("path", HISTORY, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_readers_ignore_a_field_they_do_not_know(path: Path) -> None:
    old = json.loads(path.read_bytes())
    widened = {**old, "field_from_the_future": {"any": ["shape", 1]}}
    decoder = DECODERS[old["type"]]
    assert decoder.decode(json.dumps(widened).encode()) == decoder.decode(path.read_bytes())


@pytest.mark.parametrize(
    "path", [p for p in HISTORY if p.name.startswith("run.")], ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_a_journal_reader_skips_an_event_type_it_does_not_know(path: Path) -> None:
    """A newer writer's event (a new tag) reads as an UnknownEvent, kept as journaled, never an error."""
    future = {**json.loads(path.read_bytes()), "type": "run.from_the_future"}
    data = json.dumps(future).encode()
    event = decode_event(data)
    assert isinstance(event, UnknownEvent) and event.data == data
    assert not isinstance(decode_event(path.read_bytes()), UnknownEvent) or path.name == "run.wake.json"


def test_the_history_holds_every_message_type() -> None:
    assert {p.name for p in HISTORY} >= {f"{name}.json" for name in DECODERS}, "run `just docs`"
    assert all(p.is_relative_to(ROOT / "tests" / "golden") for p in HISTORY)
