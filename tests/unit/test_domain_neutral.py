"""The runtime speaks no domain: no module under contracts/, domain/ or services/ names StayHub's bookings.

Issue 20: crashsafe is a runtime and StayHub's booking agent one adapter around its contracts. An adopter's agent
must not meet `booking_id` in a policy, a default agent called `booking`, or a reply about "booking rules". The
adapter itself is aside: `services/agents/` (the booking, support and synthetic agents) and
`services/knowledge/stayhub/` (StayHub's policy library). The word is matched case-insensitively anywhere in a
module (code, comments, docstrings), so `bookings`, `booking_id` and `scripted-booking` count too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("contracts", "domain", "services")
# StayHub's adapter: the only place the domain is spelled.
ADAPTER = ("services/agents/", "services/knowledge/stayhub/")
WORD = re.compile("booking", re.IGNORECASE)

# Modules other issue-20 work still makes neutral (policies, the agent port, the registry, settings); the lead
# empties this at merge. Each must still name the domain: one cleaned is taken off, so the list cannot rot.
PENDING: set[str] = set()


def mentions(root: Path) -> dict[str, list[int]]:
    """Every module under the runtime's folders of `root` that names the domain, outside the adapter:
    {path relative to `root`: the line numbers}. Links are not followed (crashsafe/ links to these folders)."""
    found: dict[str, list[int]] = {}
    for folder in FOLDERS:
        for here, dirs, files in os.walk(root / folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = Path(here) / name
                relative = path.relative_to(root).as_posix()
                if relative.startswith(ADAPTER):
                    continue
                lines = path.read_text(encoding="utf-8").splitlines()
                hits = [n for n, line in enumerate(lines, 1) if WORD.search(line)]
                if hits:
                    found[relative] = hits
    return found


def test_no_runtime_module_names_the_booking_domain() -> None:
    found = {path: lines for path, lines in mentions(ROOT).items() if path not in PENDING}
    assert not found, (
        "the runtime names StayHub's domain; say it in neutral terms (a hold, a reservation, a charge, an "
        "effect) or move it into the adapter (services/agents/):\n"
        + "\n".join(f"  {path}: lines {', '.join(map(str, lines))}" for path, lines in sorted(found.items()))
    )


def test_every_pending_module_still_names_the_domain() -> None:
    cleaned = sorted(PENDING - set(mentions(ROOT)))
    assert not cleaned, f"no longer name the domain: take them off PENDING: {', '.join(cleaned)}"


def test_a_mention_anywhere_outside_the_adapter_is_found(tmp_path: Path) -> None:
    """The walk itself: a comment, an identifier, any case; the adapter and non-Python files aside."""
    planted = {
        "contracts/inbound.py": 'agent: str = "x"  # a Booking\n',
        "domain/rules.py": "ok = 1\nBOOKING_ID = 'booking_id'\n",
        "services/gateway/app.py": "x = 'scripted-booking'\n",
        "services/knowledge/library.py": '"""Policies for bookings."""\n',
        "services/agents/booking/tools.py": "create_booking = 1\n",
        "services/knowledge/stayhub/faq.py": "booking = 1\n",
        "services/gateway/readme.md": "booking\n",
        "domain/neutral.py": "hold = 1\n",
    }
    for path, text in planted.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert mentions(tmp_path) == {
        "contracts/inbound.py": [1],
        "domain/rules.py": [2],
        "services/gateway/app.py": [1],
        "services/knowledge/library.py": [1],
    }
