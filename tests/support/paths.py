"""Where things are in the repository, for tests that read files."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Committed wire samples and recorded journals (see contracts/README.md).
GOLDEN = ROOT / "tests" / "golden"
