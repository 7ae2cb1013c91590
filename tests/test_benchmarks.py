"""The benchmarks run at their smallest size and their numbers are consistent (no timing thresholds)."""

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_throughput_benchmark_smallest_size(tmp_path):
    import throughput

    out = tmp_path / "throughput.json"
    assert throughput.main(["--latency", "0.05", "--agents", "2", "--items-per-agent", "10", "--max-items", "5",
                            "--overhead-items-per-agent", "20", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    for concurrency in (4, 1):
        case = results[f"concurrency_{concurrency}"]
        assert case["batch_calls"] == 2 * 2
        assert case["all_calls"] > case["batch_calls"]  # globals at least
        # each call takes at least the latency and at most max_concurrency run at once: the ideal is a ceiling
        assert 0 < case["ratio_to_ideal"] <= 1.0
    assert results["concurrency_1"]["max_in_flight"] >= 1
    assert results["overhead"]["items"] == 80 and results["overhead"]["ratio"] > 0
