"""The operators inside a different PyFlink job (jobs/reuse_example.py): its own collection source, its own
map steps before and after, execute_and_collect as its sink."""

import importlib.util

import pytest
from jobkit import config_for
from scripted_server import ScriptedServer

pytestmark = pytest.mark.slow


def load_example():
    from cluster import ROOT

    spec = importlib.util.spec_from_file_location("reuse_example", ROOT / "jobs" / "reuse_example.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_operators_in_a_different_job(tmp_path):
    example = load_example()
    events = [
        {"customer": c, "ticket": 10 * n + k, "at": f"2026-04-{n + 1:02d}T0{k}:00:00Z",
         "body": f"Ticket {10 * n + k} of {c.title()}: invoice Number{n}x{k} is {100 * n + k} EUR."}
        for n, c in enumerate(["initech", "hooli", "umbrella"]) for k in range(5)
    ]
    events.append({"customer": "hooli", "ticket": 99, "at": "2026-04-09T00:00:00Z", "body": ""})  # invalid
    with ScriptedServer() as server:
        config = config_for(server.base_url, "batching.max_items=2", "summarization.fan_in=2",
                            "checkpointing.interval_s=0")
        env = example.environment(config)
        stream = example.customer_memory(env.from_collection(events), config)
        with stream.execute_and_collect("reuse-test") as results:
            rows = list(results)
        assert server.count() > 0
    assert rows and all(isinstance(r[1], int) for r in rows)
    latest = {}
    for agent, version, text in rows:
        if version > latest.get(agent, (0, ""))[0]:
            latest[agent] = (version, text)
    assert set(latest) == {"support-initech", "support-hooli", "support-umbrella"}
    # the scripted summarizer keeps names and numbers, so each final global carries its customer's facts
    for n, customer in enumerate(["initech", "hooli", "umbrella"]):
        text = latest[f"support-{customer}"][1]
        assert all(f"{100 * n + k}" in text for k in range(5)), (customer, text)


def test_an_environment_of_the_other_execution_mode_is_refused():
    """The stage uids and the state layout follow the mode: operators added to a job of the other mode would
    write state that a restore in the configured mode could not read."""
    from pyflink.common import Configuration
    from pyflink.datastream import StreamExecutionEnvironment

    from flink_memory.config import ConfigError
    from flink_memory.flink.pipeline import add_memory_operators

    conf = Configuration()
    conf.set_string("python.execution-mode", "process")
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    with pytest.raises(ConfigError, match="python.execution-mode is process but job.execution_mode is thread"):
        add_memory_operators(env.from_collection(["{}"]), config_for("http://127.0.0.1:9/v1"))
