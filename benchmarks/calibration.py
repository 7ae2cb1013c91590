"""The first requests against a real tokenizer's window: the bundled SmolLM2, counted by itself.

The bundled model is served by llama.cpp with a window (`n_ctx` per slot) equal to `llm.context_window`
(2 048), behind a logging proxy that offers no /tokenize, as many hosted endpoints do: the job counts with
its estimate (`llm.tokenizer: estimate`) and calibrates from the server's `usage.prompt_tokens`. The proxy
records every request as the server counted it (prompt tokens + max_tokens) and every refusal for length.
Input: mixed notes of several agents (names, dates, amounts, a few non-ASCII lines) at the default
`batching.max_items`. `--baseline-src DIR` runs the same job from another checkout (e.g. the previous
release) in the same script and prints both, with ratios; its workers must import that checkout, so give an
interpreter without an editable install of this one, in process mode (a thread-mode worker's path is the
job's `python.pythonpath`, which an editable install shadows).

    python benchmarks/calibration.py                                  # 5 agents x 60 notes
    python benchmarks/calibration.py --baseline-src ../old --python ../plain-venv/bin/python \
        --set job.execution_mode=process --json out/calibration.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jobkit import write_lines  # noqa: E402

from flink_memory.llm.llamacpp import EmbeddedServer  # noqa: E402
from flink_memory.outputs import read_outputs  # noqa: E402

NAMES = ["Greta", "Selquisel Marbonne", "Okonkwo", "Dana", "Chen Wei", "Farah Haddad", "Emil Novák", "José"]
PLACES = ["Lisbon", "Kraków", "Osaka", "Nairobi", "São Paulo", "Zürich"]


def sentence(rng: random.Random, i: int) -> str:
    who, other, place = rng.choice(NAMES), rng.choice(NAMES), rng.choice(PLACES)
    return rng.choice([
        f"{who}'s daughter turns {rng.randint(2, 17)} on 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}.",
        f"{who} paid {rng.randint(10, 9999)}.{rng.randint(0, 99):02d} EUR for the flat in {place} "
        f"(ref {rng.randint(10**5, 10**6)}).",
        f"Met {other} in {place} at {rng.randint(7, 21)}:{rng.choice(['00', '15', '30', '45'])}; "
        "they prefer tea to coffee.",
        f"{who} is allergic to penicillin and takes {rng.randint(5, 50)} mg of cetirizine daily.",
        f"The user wants to visit {place} again and keep the budget under {rng.randint(500, 5000)} EUR.",
        f"{who} moved the launch review to week {rng.randint(1, 52)} after talking to {other}.",
    ]) + (f" ({i})" if rng.random() < 0.3 else "")


def note(rng: random.Random, i: int) -> str:
    """A note of one to five sentences (most notes carry a few facts)."""
    return " ".join(sentence(rng, i) for _ in range(rng.choice([1, 2, 3, 4, 5])))


def dataset(agents: int, per_agent: int, seed: int = 23) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"agent_id": f"agent-{a}", "id": f"n{i}", "ts": f"2026-03-{1 + i * 27 // per_agent:02d}T10:00:00Z",
             "text": note(rng, i)} for a in range(agents) for i in range(per_agent)]


class CountingProxy:
    """Forwards chat completions to the model server and logs what the server counted; no /tokenize."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.endswith("/chat/completions"):
                    self._reply(404, b'{"error": "not found"}')
                    return
                request = json.loads(body)
                forward = urllib.request.Request(proxy.upstream + "/v1/chat/completions", data=body,
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(forward, timeout=600) as response:
                        status, data = response.status, response.read()
                except urllib.error.HTTPError as exc:
                    status, data = exc.code, exc.read()
                entry = {"status": status, "max_tokens": request.get("max_tokens") or 0,
                         "messages": len(request.get("messages", []))}
                if status == 200:
                    entry["prompt_tokens"] = json.loads(data)["usage"]["prompt_tokens"]
                else:
                    entry["error"] = data.decode("utf-8", "replace")[:300]
                with proxy.lock:
                    proxy.log.append(entry)
                self._reply(status, data)

            def _reply(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()


def run(label: str, source: Path, input_path: Path, workdir: Path, proxy: CountingProxy, args: argparse.Namespace
        ) -> dict[str, Any]:
    out = workdir / label
    settings = ["llm.provider=openai", f"llm.base_url={proxy.base_url}", "llm.model=smollm2",
                "llm.tokenizer=estimate", f"llm.context_window={args.window}",
                f"llm.max_output_tokens={args.output}", f"llm.max_concurrency={args.parallel}", "journal.path=null"]
    command = [args.python, "-m", "flink_memory.cli", "run", "--input", str(input_path), "--output", str(out)]
    for setting in settings + args.overrides:
        command += ["--set", setting]
    env = dict(os.environ, PYTHONPATH=str(source))  # the checkout whose code runs
    before = len(proxy.log)
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{label}: the job failed:\n{done.stderr[-3000:]}")
    requests = proxy.log[before:]
    answered = [r for r in requests if r["status"] == 200]
    refused = [r for r in requests if r["status"] != 200]
    sizes = [r["prompt_tokens"] + r["max_tokens"] for r in answered]
    outputs = read_outputs(str(out))
    units = sum(len(n["children"]) for n in outputs["summaries"] if n["kind"] == "batch")
    return {"requests": len(requests), "answered": len(answered), "refused_for_length": len(refused),
            "first_request_tokens": sizes[0] if sizes else None, "largest_request_tokens": max(sizes, default=0),
            "over_window": sum(1 for s in sizes if s > args.window), "prompt_tokens": sum(r["prompt_tokens"]
                                                                                       for r in answered),
            "units_in_batches": units, "wall_s": round(wall, 1), "refusals": [r["error"] for r in refused][:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=5)
    parser.add_argument("--notes-per-agent", type=int, default=60)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--output", type=int, default=256)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--baseline-src", type=Path, help="a checkout to run the same job from, first")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of both runs: for --baseline-src, one that imports flink_memory from "
                             "PYTHONPATH only (not an editable install of this checkout)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="a setting of both runs")
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    records = dataset(args.agents, args.notes_per_agent)
    model = EmbeddedServer(context_window=args.window, parallel=args.parallel, threads=2)
    proxy = CountingProxy(model.base_url)
    results: dict[str, Any] = {"notes": len(records), "agents": args.agents, "window": args.window,
                               "max_output_tokens": args.output}
    with tempfile.TemporaryDirectory(prefix="flink-memory-calibration-") as tmp:
        workdir = Path(tmp)
        input_path = write_lines(workdir / "notes.jsonl", records)
        runs = [("baseline", args.baseline_src)] if args.baseline_src else []
        for label, source in [*runs, ("this", ROOT)]:
            results[label] = run(label, source.resolve(), input_path, workdir, proxy, args)
            print(f"{label}: {json.dumps(results[label])}", flush=True)
    proxy.close()
    model.close()
    this = results["this"]
    if this["units_in_batches"] != len(records):
        raise SystemExit(f"coverage broken: {this['units_in_batches']} units in batch nodes, {len(records)} notes")
    print(f"{len(records)} notes of {args.agents} agents, window {args.window}, max_output_tokens {args.output}: "
          f"{this['requests']} requests, {this['refused_for_length']} refused for length, {this['over_window']} "
          f"over the window; first request {this['first_request_tokens']} tokens, largest "
          f"{this['largest_request_tokens']} ({this['largest_request_tokens'] / args.window:.2f} of the window)")
    if "baseline" in results:
        base = results["baseline"]
        print(f"against the baseline: requests {this['requests']} / {base['requests']} = "
              f"{this['requests'] / base['requests']:.2f}x, prompt tokens {this['prompt_tokens']} / "
              f"{base['prompt_tokens']} = {this['prompt_tokens'] / max(1, base['prompt_tokens']):.2f}x, refused "
              f"{this['refused_for_length']} vs {base['refused_for_length']}, over the window "
              f"{this['over_window']} vs {base['over_window']}, largest request {this['largest_request_tokens']} vs "
              f"{base['largest_request_tokens']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
