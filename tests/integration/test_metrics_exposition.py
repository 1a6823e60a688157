"""What a fresh service process's /metrics says before it has set anything: no unlabelled gauge reads 0 in a
process that never sets it (the reconciler's crashsafe_synthetic_up, the runtime's knowledge and catalog)."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from crashsafe.contracts.metric_names import ALL_METRICS, MetricKind

_UNLABELLED_GAUGES = {m.name for m in ALL_METRICS if m.kind is MetricKind.GAUGE and not m.labels}


def _fresh_exposition(code: str = "") -> dict[str, float]:
    script = f"from crashsafe.services.platform import metrics\n{code}\nprint(metrics.exposition().decode())"
    text = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_an_unlabelled_gauge_is_absent_until_its_process_sets_it() -> None:
    assert {"crashsafe_synthetic_up", "crashsafe_knowledge_available"} <= _UNLABELLED_GAUGES
    fresh = _fresh_exposition()
    # An alert on `crashsafe_synthetic_up == 0` must not page for the gateway, runtime, executors and projector.
    assert not _UNLABELLED_GAUGES & fresh.keys(), sorted(_UNLABELLED_GAUGES & fresh.keys())
    set_once = _fresh_exposition("metrics.SYNTHETIC_UP.set(0)")
    assert set_once["crashsafe_synthetic_up"] == 0.0
