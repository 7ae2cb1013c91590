"""What a user watches during a bounded run: calls counted as the provider answers them, in every phase.

On a bounded input the whole LLM phase runs inside the end-of-input rounds; the progress line and Flink's
REST API must still show the calls as they end (checked against the scripted server's own log of answers).
"""

import bisect
import re
import subprocess
import threading
import time

import pytest
from jobkit import PRISTINE_ENV, cli_command, items, write_lines
from scripted_server import ScriptedServer

from flink_memory.cli.progress import ProgressLine

pytestmark = pytest.mark.slow

LAG_S = 4.0  # metrics flushed every second, fetched by the REST API every second, a line every second


def answered_by(ends: list[float], at: float) -> int:
    return bisect.bisect_right(ends, at)


def test_a_bounded_run_shows_its_calls_as_they_end(tmp_path):
    records = items(agents=3, per_agent=30)
    lines: list[tuple[float, str]] = []
    rest: list[tuple[float, float]] = []
    with ScriptedServer(latency_s=1.0) as server:
        command = cli_command(write_lines(tmp_path / "in.jsonl", records), tmp_path / "out", server, None,
                              "batching.max_items=5", "summarization.fan_in=3", "llm.max_concurrency=2",
                              args=("--progress-every", "1"))
        process = subprocess.Popen(command, env=PRISTINE_ENV, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, start_new_session=True)
        watcher: dict[str, ProgressLine] = {}

        def read_stderr() -> None:
            for text in process.stderr:
                lines.append((time.monotonic(), text.rstrip("\n")))
                if (found := re.search(r"job (\w+) running \(web UI http://127.0.0.1:(\d+)\)", text)) is not None:
                    watcher["line"] = ProgressLine(int(found.group(2)), found.group(1))

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        while process.poll() is None:  # the REST API, read by the test itself, as an operator would
            time.sleep(0.5)
            if "line" in watcher:
                try:
                    calls = watcher["line"].snapshot().get("llm_calls")
                except (OSError, ValueError, KeyError):
                    continue
                if calls is not None:
                    rest.append((time.monotonic(), calls))
        reader.join(timeout=10)
        stdout = process.stdout.read()
        assert process.returncode == 0, "\n".join(text for _, text in lines[-30:])
        ends = sorted(end for _, end, _ in server.spans)
    assert "flink-memory run finished" in stdout
    first_end = ends[0]
    progress = [(at, int(m.group(1))) for at, text in lines
                if at > first_end + LAG_S and (m := re.search(r"\| calls (\d+)", text))]
    assert len(progress) >= 5, lines  # the LLM phase takes tens of seconds: a line a second
    for at, calls in progress:
        assert answered_by(ends, at - LAG_S) <= calls <= answered_by(ends, at), (at - first_end, calls)
    during = [(at, calls) for at, calls in rest if first_end + LAG_S < at < ends[-1]]
    assert len(during) >= 5, rest
    for at, calls in during:
        assert answered_by(ends, at - LAG_S) <= calls <= answered_by(ends, at), (at - first_end, calls)
    assert any(" s left for the calls in flight" in text for _, text in lines)
