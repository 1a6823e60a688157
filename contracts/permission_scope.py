"""The namespace a permission table is written for: one deployment's, or every namespace's (the test suite's)."""

from __future__ import annotations

from dataclasses import dataclass

from crashsafe.contracts.streams import ConsumerSpec
from crashsafe.contracts.subjects import Namespace, StreamKind


@dataclass(frozen=True, slots=True)
class Scope:
    """The subjects of one namespace, or of every namespace (`ns=None`: `*` in place of each namespace token,
    for the test suite's shared server, whose tests each use a fresh namespace). A deployment uses its own."""

    ns: Namespace | None

    @property
    def n(self) -> str:
        return self.ns.name if self.ns else "*"

    def stream(self, kind: StreamKind) -> str:
        return self.ns.stream(kind) if self.ns else "*"

    def bucket(self, name: str) -> str:
        return f"{self.ns.name}_{name}" if self.ns else "*"

    def kv_stream(self, name: str) -> str:
        return f"KV_{self.ns.name}_{name}" if self.ns else "*"

    def kv(self, name: str, keys: str) -> str:
        return f"$KV.{self.bucket(name)}.{keys}"

    def consumer(self, spec: ConsumerSpec) -> ConsumerSpec:
        """`spec` with this scope's stream token (the spec is built for a concrete namespace)."""
        if self.ns:
            return spec
        kind = next(k for k in StreamKind if spec.stream.endswith(k.value.upper()))
        return ConsumerSpec(
            stream=self.stream(kind),
            durable=spec.durable,
            filter_subject="*." + spec.filter_subject.split(".", 1)[1],
            pull=spec.pull,
        )
