"""`crashsafe new agent NAME`: an adopter's first agent as a package of their own, written from the templates the
wheel ships (crashsafe/templates/agent), using only crashsafe.sdk and crashsafe.testing."""

from __future__ import annotations

import importlib.util
import keyword
import re
import string
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from crashsafe.contracts.errors import InvalidSetting

TEMPLATES = Path(__file__).parent / "templates" / "agent"
SUFFIX = ".tmpl"
# The agent's name is its package's, its tool family's and its NATS subjects' token at once.
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")


def _checked(name: str) -> str:
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise InvalidSetting(
            variable="NAME",
            value=name,
            expected="a lowercase Python package name: a letter, then letters, digits or _ (at most 41)",
        )
    if importlib.util.find_spec(name) is not None:
        raise InvalidSetting(
            variable="NAME",
            value=name,
            expected=f"a name no installed module has ({name} imports already: the package would be shadowed)",
        )
    return name


def class_name(name: str) -> str:
    """`desk_booking` -> `DeskBooking`: the agent's class is `DeskBookingAgent`."""
    return "".join(part.capitalize() for part in name.split("_") if part)


def new_agent(name: str, into: Path) -> list[Path]:
    """Write the package `into/name`; refuses to write over anything that is there. Returns the files written."""
    name = _checked(name)
    package = into / name
    if package.exists():
        raise InvalidSetting(variable="--dir", value=str(package), expected="a path with nothing there yet")
    values = {"name": name, "Name": class_name(name)}
    written: list[Path] = []
    for template in sorted(TEMPLATES.rglob(f"*{SUFFIX}")):
        target = package / template.relative_to(TEMPLATES).with_suffix("")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(string.Template(template.read_text()).substitute(values))
        written.append(target)
    return written


def new_agent_command(name: str, into: Path) -> int:
    where = into.resolve()  # `--dir` is relative by default (`.`): every path printed is under this one
    written = new_agent(name, where)
    print(f"wrote {len(written)} files under {where / name}:")
    for path in written:
        print(f"  {path.relative_to(where)}")
    day = (datetime.now(UTC) + timedelta(days=2)).date().isoformat()
    print(
        f"\nits tests (one on a real stack):  cd {where} && python -m pytest -q {name}\n"
        f"the stack, running your agent, from {where}:\n"
        f"  python -m {name}.provider --port 8765 &  # its provider (a stub)\n"
        f"  python -m crashsafe.testing {name}.model:script --port 8766 &  # its model (a script)\n"
        f"  crashsafe up --registry {name}.registry:registry --providers http://127.0.0.1:8765 "
        "--model-url http://127.0.0.1:8766/v1\n"
        f"a conversation killed at every seam in turn (the provider above running), from {where}:\n"
        f"  crashsafe crash-test --registry {name}.registry:registry --providers http://127.0.0.1:8765 "
        f"--model {name}.model:script --say 'A slot on {day}'",
        file=sys.stdout,
    )
    return 0
