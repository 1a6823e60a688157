"""The generated contract documents are current: regenerating each in memory gives the checked-in file.

On a failure: run `just docs` and commit what it wrote (it refuses a breaking change to the contracts).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

from crashsafe import contract_access as access
from crashsafe import contract_catalog as cat
from crashsafe import contract_docs, stream_catalog
from tests.support.paths import ROOT

# Under `just mutate` the sources are mutmut's rewrite (trampolines beside every function, comments moved): the
# documents describe the code as written, so they are compared only outside it.
UNDER_MUTMUT = "MUTANT_UNDER_TEST" in os.environ
pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(UNDER_MUTMUT, reason="the documents describe the unmutated source"),
]

DOCUMENTS = {} if UNDER_MUTMUT else contract_docs.documents(contract_docs.read_lock())


@pytest.mark.parametrize("path", sorted(DOCUMENTS), ids=str)
def test_every_generated_document_is_current(path: Any) -> None:
    target = ROOT / path
    assert target.exists(), f"{path} is missing: run `just docs` and commit it"
    assert target.read_bytes() == DOCUMENTS[path], f"{path} is stale: run `just docs` and commit the diff"


def test_no_schema_is_left_over_from_a_message_that_is_gone() -> None:
    on_disk = {p.relative_to(ROOT) for p in (ROOT / contract_docs.SCHEMAS).glob("*.json")}
    assert on_disk == {p for p in DOCUMENTS if p.parent == contract_docs.SCHEMAS}, "run `just docs`"


def test_every_subject_says_what_it_carries() -> None:
    """The one hand-kept table (which message travels where) covers every subject builder and names real messages."""
    subjects = {t.method for t in cat.templates() if t.kind == "subject"}
    names = {m.name for m in cat.messages()}
    assert subjects == set(cat.CHANNEL_MESSAGES), "add the new subject to contract_catalog.CHANNEL_MESSAGES"
    for carried in cat.CHANNEL_MESSAGES.values():
        assert set(carried) <= names, carried


def test_every_message_and_stream_is_in_events_md() -> None:
    text = DOCUMENTS[contract_docs.Path("docs/events.md")].decode()
    for m in cat.messages():
        assert f"### `{m.name}`" in text
        for f in m.info.fields:
            assert f"| `{f.encode_name}` |" in text
    for s in stream_catalog.streams():
        assert f"| `{s.name}` |" in text
    for c in stream_catalog.consumers():
        assert f"| `{c.spec.durable}` |" in text
    for kv, _ in stream_catalog.buckets():
        assert f"| `{kv.bucket}` |" in text


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        own = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return own + [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve"
        node = node[part]
    return node


def test_the_asyncapi_document_has_the_3_0_structure() -> None:
    doc = json.loads(DOCUMENTS[contract_docs.Path("docs/asyncapi.json")])
    assert doc["asyncapi"] == "3.0.0"
    assert {"title", "version"} <= set(doc["info"])
    key = re.compile(r"^[\w.\-]+$")
    for server in doc["servers"].values():
        assert {"host", "protocol"} <= set(server)
    for name, channel in doc["channels"].items():
        assert key.match(name)
        placeholders = re.findall(r"\{(\w+)\}", channel["address"])
        assert sorted(placeholders) == sorted(channel.get("parameters", {})), name
        assert set(channel) <= {
            "address",
            "title",
            "summary",
            "description",
            "messages",
            "parameters",
            "servers",
        }
    for name, operation in doc["operations"].items():
        assert key.match(name)
        assert operation["action"] in ("send", "receive")
        channel = operation["channel"]["$ref"]
        for message in operation["messages"]:
            # AsyncAPI 3.0: an operation's messages are a subset of its channel's.
            assert message["$ref"].startswith(channel + "/messages/"), (name, message)
    for message in doc["components"]["messages"].values():
        assert message["payload"]["$ref"].startswith("#/components/schemas/")
    for ref in _refs(doc):
        _resolve(doc, ref)
    # Every documented message travels somewhere, every role that publishes has an operation.
    assert {m["name"] for m in doc["components"]["messages"].values()} == {
        n for names in cat.CHANNEL_MESSAGES.values() for n in names
    }
    assert {"gateway.send.inbound", "runtime.receive.inbound", "runtime.send.run_event"} <= set(
        doc["operations"]
    )


def test_the_openapi_document_describes_the_real_api() -> None:
    doc = json.loads(DOCUMENTS[contract_docs.Path("docs/openapi.json")])
    assert doc["info"]["title"] == "crashsafe gateway" and doc["info"]["version"]
    assert doc["components"]["securitySchemes"]["api_key"]["scheme"] == "bearer"
    accept = doc["paths"]["/v1/events"]["post"]
    assert set(accept["responses"]) == {"202", "400", "401", "403", "409", "413", "422", "429", "503"}
    assert accept["security"] == [{"api_key": []}]
    decide = doc["paths"]["/v1/approvals/{approval_id}"]["post"]
    assert decide["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "ApprovalDecisionBody"
    )
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                schema = response["content"]["application/json"]["schema"]
                assert schema and schema != {}, (path, method, status)
                if int(status) >= 400 and path != "/readyz":
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (path, method, status)
    for name, schema in doc["components"]["schemas"].items():
        assert schema.get("properties") or schema.get("enum"), f"{name} is an empty schema"
    for ref in _refs(doc):
        _resolve(doc, ref)


def test_subject_matching_follows_nats() -> None:
    assert access.matches("a.*.c", "a.b.c") and not access.matches("a.*", "a.b.c")
    assert access.matches("a.>", "a.b.c") and not access.matches("a.>", "a")
    assert access.overlaps("a.b.*", "a.*.c") and not access.overlaps("a.b.c", "a.d.*")
    assert access.overlaps("a.>", "a.*.*") and not access.overlaps("a.b", "a.b.*")
