"""The long-term memory API's agent (chat_agent.ChatAgent, unchanged but for `use_flink_memory`) in a
MiniCluster job (slow, the flink-agents jars): the memory job follows the inbox the sets write to, in the same
Flink job; each key's set is its own flink-memory agent (0.3.1's Flink runtime gives the memory the hash of
the key), summarized by the job, and a later question reads back only its own key's items and the set's summary."""

import json

import pytest
from agentkit import python_path
from chat_agent import ChatAgent
from flink_agents.api.execution_environment import AgentsExecutionEnvironment
from jobkit import config_for, wait_for, write_lines
from pyflink.common import Duration, Types, WatermarkStrategy
from pyflink.datastream.connectors.file_system import FileSource, StreamFormat
from scripted_server import Reply, ScriptedServer, fact_keeping_summary

from flink_memory.agents.long_term_memory import use_flink_memory
from flink_memory.agents.pipeline import turn_agent, turn_value
from flink_memory.cli.run import Applier
from flink_memory.flink.pipeline import build_job, file_sink
from flink_memory.outputs import read_outputs

pytestmark = pytest.mark.slow

FACTS = {"alice": "My dog is a beagle named Rex.", "bob": "My dog is a poodle named Max."}


def publish(directory, name, records):
    write_lines(directory / f".{name}", records).rename(directory / name)


def committed(output):
    return [json.loads(line) for path in sorted((output / "outcomes").rglob("*.jsonl")) if not path.name.startswith(".")
            for line in path.read_text().splitlines() if line.strip()]


def test_the_memory_set_api_in_a_flink_job(tmp_path):
    turns_dir, inbox, output = tmp_path / "turns", tmp_path / "inbox", tmp_path / "out"
    for d in (turns_dir, inbox, output):
        d.mkdir()
    url = str(output / "memory.sqlite")
    with ScriptedServer(lambda body: Reply(text=fact_keeping_summary(body))) as server:
        config = config_for(server.base_url, "job.parallelism=1", "checkpointing.interval_s=1",
                            "batching.max_items=1", "batching.flush_after_s=1", "summarization.global_refresh_s=1",
                            f"job.python_path={python_path()}")
        env = build_job(config, str(inbox), str(output), follow=True)  # the memory job, following the inbox
        source = FileSource.for_record_stream_format(StreamFormat.text_line_format(), str(turns_dir)) \
            .monitor_continuously(Duration.of_millis(500)).build()
        turns = env.from_source(source, WatermarkStrategy.no_watermarks(), "turns").uid("ltm-turns") \
            .map(turn_value).uid("ltm-turn-values")
        agent = use_flink_memory(ChatAgent(), store=url, input=str(inbox))  # the one line
        outputs = AgentsExecutionEnvironment.get_execution_environment(env=env) \
            .from_datastream(turns, key_selector=turn_agent).apply(agent).to_datastream()
        outputs.map(lambda o: json.dumps(o, default=str), output_type=Types.STRING()).uid("ltm-outcomes") \
            .sink_to(file_sink(str(output / "outcomes"), "outcomes")).uid("ltm-outcomes-sink")
        client = env.execute_async("ltm")
        applier = Applier(url, str(output), config)
        try:
            publish(turns_dir, "part-0.jsonl", [{"agent_id": a, "text": t} for a, t in FACTS.items()])

            def globals_of_sets():
                found = {n["agent_id"] for n in read_outputs(str(output))["summaries"] if n["kind"] == "global"}
                return found if len(found) == 2 else None

            sets = wait_for(globals_of_sets, timeout_s=180)
            publish(turns_dir, "part-1.jsonl", [{"agent_id": a, "text": "What is my dog called?"} for a in FACTS])
            answers = wait_for(lambda: {o["agent_id"]: o for o in committed(output) if "hits" in o}
                               if sum("hits" in o for o in committed(output)) == 2 else None, timeout_s=120)
        finally:
            client.cancel().result()
            assert applier.stop() is None
    assert all(agent.endswith(":notes") for agent in sets)  # one flink-memory agent per key's set
    for key, fact in FACTS.items():
        other = FACTS["bob" if key == "alice" else "alice"]
        answer = answers[key]
        assert answer["items"] == [fact]
        assert [text for _, text in answer["hits"]][0] == fact and other not in json.dumps(answer["hits"])
        name, other_name = (f.split()[-1].rstrip(".") for f in (fact, other))  # the scripted summarizer keeps names
        assert answer["summary"] and name in answer["summary"] and other_name not in answer["summary"]
