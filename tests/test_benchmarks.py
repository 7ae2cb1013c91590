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
                            "--concurrency", "2", "--overhead-agents", "2", "--overhead-items-per-agent", "20",
                            "--overhead-max-items", "5", "--no-process-mode", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    case = results["concurrency_default"]
    assert case["calls_by_kind"]["batch"] == 2 * 2 and case["calls_by_kind"]["global"] == 2
    assert case["minimum_calls"] == 2 * (2 + 1) and case["calls"] >= case["minimum_calls"]
    # each call takes at least the latency and at most max_concurrency run at once: 1.0 is a ceiling
    assert 0 < case["concurrency_ratio"] <= 1.0
    overhead = results["overhead"]
    assert overhead["items"] == 40 and overhead["bare_over_ours"] > 0
    assert overhead["minimum_calls"] == 2 * (4 + 1) and overhead["calls"] >= overhead["minimum_calls"]


def test_strategy_benchmark_smallest_sizes(tmp_path):
    import strategies

    out = tmp_path / "strategies"
    assert strategies.main(["--sizes", "10", "60", "--agents", "2", "--max-items", "4", "--fan-in", "8",
                            "--latency", "0", "--context-window", "4096", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    rows = {(r["items_per_agent"], r["strategy"]): r for r in results["rows"]}
    window = results["context_window"]
    # single-pass: one call per agent while it fits; shown failing (no call) once the request overflows
    assert rows[(10, "single_pass")]["calls"] == 2 and not rows[(10, "single_pass")]["failed"]
    overflow = rows[(60, "single_pass")]
    assert overflow["failed"] and overflow["calls"] == 0 and overflow["largest_request"] > window
    assert "exceeds the context window" in overflow["failure"]
    for size, batches in ((10, 3), (60, 15)):  # ceil(size / 4) batches per agent
        batched, tree = rows[(size, "batched")], rows[(size, "hierarchical")]
        # batched (depth single): the batch calls, then a global over all batch summaries per agent (more than
        # one call where they do not fit one request)
        assert batched["calls"] >= 2 * (batches + 1)
        merges = tree["merges"]
        assert merges == 2 * (batches // 8)  # full groups of fan_in=8 at level 1, one level here
        # the hierarchical tree: the batch calls, its merges, and one global call per agent
        assert tree["calls"] == 2 * batches + merges + 2
        for row in (batched, tree):
            assert row["largest_request"] <= window and not row["failed"] and 0 < row["retention"] <= 1
    assert (out / "results.md").read_text().count("| 60 |") == 3
    assert (out / "cost_vs_items.png").stat().st_size > 1000 and (out / "retention_vs_items.png").exists()


def test_budget_benchmark_smallest_size(tmp_path):
    """Against a chars/4 provider that refuses over-window prompts: none refused, requests fill the budget."""
    import budgets

    out = tmp_path / "budgets.json"
    assert budgets.main(["--agents", "2", "--items-per-agent", "100", "--huge-sentences", "150",
                         "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    ours, base = results["flink_memory"], results["baseline"]
    assert ours["over_window"] == 0 and ours["rejected"] == 0
    assert base["over_window"] == 2  # the one-request baseline cannot be sent at this window
    assert results["ratios"]["largest_request_over_budget"] >= 0.7
    assert ours["prompt_tokens"] < 1.5 * base["prompt_tokens"]



def test_budget_benchmark_runs_send_the_same_requests(tmp_path):
    """--runs: runs from nothing with other latencies and subtasks send one set of requests (issue 45)."""
    import budgets

    out = tmp_path / "runs.json"
    assert budgets.main(["--agents", "2", "--items-per-agent", "40", "--huge-sentences", "30", "--runs", "2",
                         "--shape", "mixed", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["distinct_request_sets"] == 1 and results["calls_spread"] == 0
    assert [r["parallelism"] for r in results["runs"]] == [1, 2]

def test_recall_benchmark_smallest_size(tmp_path):
    """The store finds every planted fact the summaries kept; the global alone cannot do better than the store."""
    import recall

    out = tmp_path / "recall.json"
    assert recall.main(["--sizes", "28", "--agents", "2", "--max-items", "4", "--distractors", "3",
                        "--mentions", "1", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    (row,) = results["rows"]
    assert row["facts"] == 2 * (28 // 5)  # one fact per 1 + 3 distractors + 1 mention notes, per agent
    assert row["in_any_live_node"] == 1.0  # the scripted summarizer keeps names and numbers in batch nodes
    assert row["recall_at_k"] == 1.0 and 0 < row["recall_at_1"] <= row["recall_at_k"]
    assert row["global_alone"] <= row["recall_at_k"] and row["live_nodes_per_agent"] >= 7 + 1


def test_service_load_benchmark_smallest_size(tmp_path):
    """A served store under a few clients: every request answered with hits, distinct questions, the CPU of
    server and clients accounted, the CLI baseline timed (no timing thresholds)."""
    import service_load

    out = tmp_path / "load.json"
    assert service_load.main(["--rows", "2000", "--agent-units", "1000", "--others", "2", "--clients", "4",
                              "--seconds", "2", "--warmup", "0.5", "--cli-questions", "1", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    service = results["service"]
    assert service["errors"] == 0 and service["requests"] > 4 and service["p50_ms"] <= service["p99_ms"]
    assert service["questions_asked"] <= service["distinct_questions"]  # no question asked twice
    assert service["cpu"]["server_ms_per_request"] > 0 and service["cpu"]["client_cores"] < 1
    assert results["cli"]["questions"] == 1 and results["service_over_cli_requests_per_s"] > 0


def test_capacity_benchmark_smallest_size(tmp_path):
    """Every part is timed, and the calls are those of full batches and the tree's merges and globals."""
    import capacity

    out = tmp_path / "capacity.json"
    assert capacity.main(["--items", "200", "--agents", "2", "--recalls", "10", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    parts = results["per_item_s"]
    assert {"stage: planner", "stage: batcher", "stage: merger", "parse and validate"} <= set(parts)
    assert all(seconds > 0 for seconds in parts.values())
    assert results["calls"] == 2 * (2 + 1)  # two batches of 50 and one global per agent
    assert set(results["per_request_s"]) == {"recall: keyword", "recall: hybrid"}


def test_heldout_recall_benchmark_smallest_size(tmp_path):
    """Every fact of the held-out data is asked both ways, in every set, and literal questions are found."""
    import recall_heldout

    out = tmp_path / "heldout.json"
    assert recall_heldout.main(["--models", "keyword", "e5-static", "--agents", "1", "--subjects", "2",
                                "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    keyword, static = results["models"]
    assert {(r["set"], r["wording"]) for r in static["rows"]} == {
        (s, w) for s in ("english", "es", "de") for w in ("literal", "other_words")}
    assert [r["facts"] for r in keyword["rows"] if r["set"] != "english"] == [21, 21, 21, 21]
    literal = [r["recall_at_k"] for r in keyword["rows"] if r["wording"] == "literal"]
    assert min(literal) >= 0.9  # (a literal question shares words with its fact)


def test_applier_benchmark_smallest_sizes(tmp_path):
    """Every approach is measured at every size, retiring lists only the recent commits, and every commit's
    unit was found."""
    import applier

    out = tmp_path / "applier.json"
    assert applier.main(["--sizes", "30", "60", "--recent", "10", "--polls", "2", "--commits", "3", "--samples", "3",
                         "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [r["checkpoints"] for r in results] == [30, 60]
    for r in results:
        # (the recent ten, and the commits measured before retiring: 3 applied one per poll, 3 found)
        assert r["listed_per_poll"] == {"todays_listing": r["checkpoints"], "retiring": 10 + 3 + 3}
        assert all(v > 0 for v in r["poll_cpu_ms"].values()) and all(v > 0 for v in r["commits_per_s"].values())
        for found in r["commit_to_found_s"].values():
            assert 0 < found["p50"] <= found["p99"]
