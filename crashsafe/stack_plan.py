"""Which services a stack runs: the `--scale` an operator asks for, and one executor per tool family of the
registry the services load."""

from __future__ import annotations


class ScaleError(ValueError):
    """A `--scale` the stack cannot start: says which names it knows."""


class RegistryUnusable(ValueError):
    """The registry the stack would run (`CRASHSAFE_REGISTRY`) cannot be loaded: says which and why."""


def registry_families(spec: str) -> tuple[str, ...]:
    """The tool families of the registry `spec`: one executor each, so an adopter's registry gets its own
    executors, not the demo's four."""
    from crashsafe.domain import registry as registries

    try:
        return tuple(sorted(registries.load(spec).families))
    except (ImportError, ValueError) as exc:
        raise RegistryUnusable(f"CRASHSAFE_REGISTRY={spec!r}: {exc}") from exc


def parse_scale(text: str) -> dict[str, int]:
    """`executor-payment=3,runtime=2` as {name: replicas}; names are checked against the stack by `Stack`."""
    scale: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, count = part.partition("=")
        if not sep or not name.strip() or not count.strip().isdigit() or int(count) < 1:
            raise ScaleError(f"--scale wants NAME=N[,NAME=N…] with N >= 1, got {part!r}")
        scale[name.strip()] = int(count)
    return scale
