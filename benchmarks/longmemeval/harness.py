"""LongMemEval through flink-memory: each instance is one agent, each haystack session one conversation.

    python benchmarks/longmemeval/harness.py run --data longmemeval_s.json --run-dir out/lme [--set k=v ...]
    python benchmarks/longmemeval/harness.py run --data ... --run-dir out/lme --resume
    python benchmarks/longmemeval/harness.py run --data ... --run-dir out/lme --qa    # QA + judge via the endpoint

The run directory records the complete chunking and summarization policy (policy.json), the per-instance
progress (progress.json) and one artifact per finished instance (instances/<question_id>.json, digest in
progress.json). `--resume` continues only under the recorded policy, and only with artifacts that parse
and verify; anything else stops the run with an error that names what differs.

Offline scores: evidence retention (the normalized gold answer in the global summary, in any summary node,
and in the batch summaries of the chunks that hold `has_answer` turns) and compression (summary tokens /
haystack tokens). With `--qa`, the same endpoint answers each question from the global summary and judges
the answer in LongMemEval's style; accuracy is reported per question type.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from flink_memory.chunking.exchanges import group_exchanges  # noqa: E402
from flink_memory.chunking.plans import chunking_fingerprint, chunking_policy  # noqa: E402
from flink_memory.config import Config, load_config  # noqa: E402
from flink_memory.digests import canonical_json, digest  # noqa: E402
from flink_memory.llm.llamacpp import start_local_model  # noqa: E402
from flink_memory.outputs import latest_globals, read_outputs  # noqa: E402
from flink_memory.summarize.prompts import summarization_fingerprint, summarization_policy  # noqa: E402
from flink_memory.tokens.estimate import estimate_tokens  # noqa: E402

PROJECT_VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


class RunError(RuntimeError):
    """The run directory cannot be continued as asked; the message says why."""


# --- the official format -----------------------------------------------------------------------------------


class Turn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str
    has_answer: bool = False


class Instance(BaseModel):
    model_config = ConfigDict(extra="allow")
    question_id: str
    question_type: str
    question: str
    answer: str | int | float | list[Any]
    question_date: str
    haystack_session_ids: list[str]
    haystack_dates: list[str]
    haystack_sessions: list[list[Turn]]
    answer_session_ids: list[str] = Field(default_factory=list)

    @property
    def abstention(self) -> bool:
        return self.question_id.endswith("_abs")

    @property
    def agent_id(self) -> str:
        return f"lme-{self.question_id}"


def load_instances(path: Path) -> list[Instance]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    instances = [Instance.model_validate(item) for item in data]
    for inst in instances:
        if not len(inst.haystack_session_ids) == len(inst.haystack_dates) == len(inst.haystack_sessions):
            raise ValueError(f"{inst.question_id}: haystack ids, dates and sessions differ in length")
    return instances


def lme_time(text: str) -> str:
    """'2023/05/20 (Sat) 02:21' -> '2023-05-20T02:21:00Z' (LongMemEval dates carry no zone: read as UTC)."""
    cleaned = re.sub(r"\s*\([^)]*\)\s*", " ", text).strip()
    moment = datetime.strptime(cleaned, "%Y/%m/%d %H:%M").replace(tzinfo=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def records_of(inst: Instance) -> list[dict[str, Any]]:
    """One conversation record per haystack session; `has_answer` stays on the messages."""
    return [
        {"agent_id": inst.agent_id, "id": session_id, "ts": lme_time(date),
         "messages": [turn.model_dump() for turn in session]}
        for session_id, date, session in zip(inst.haystack_session_ids, inst.haystack_dates,
                                             inst.haystack_sessions)
    ]


# --- policy and progress -------------------------------------------------------------------------------------


def policy_of(config: Config) -> dict[str, Any]:
    return {
        "chunking": chunking_policy(config),
        "summarization": {**summarization_policy(config), "retention": config.summarization.retention},
        "chunking_fingerprint": chunking_fingerprint(config),
        "summarization_fingerprint": summarization_fingerprint(config),
        "model": config.llm.model,
        "project_version": PROJECT_VERSION,
    }


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def policy_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    old, new = _flatten(recorded), _flatten(current)
    return [f"{k}: recorded {old.get(k)!r}, now {new.get(k)!r}" for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k) and not k.endswith("fingerprint")]


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.policy_path = self.path / "policy.json"
        self.progress_path = self.path / "progress.json"

    def open(self, policy: dict[str, Any], resume: bool) -> dict[str, Any]:
        """Start a run or continue one; returns progress (question_id -> entry)."""
        if self.policy_path.exists() and not resume:
            raise RunError(f"{self.path} already holds a run; pass --resume to continue it or use a new directory")
        if not resume or not self.policy_path.exists():
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "instances").mkdir(exist_ok=True)
            self._write(self.policy_path, {"policy": policy, "policy_digest": digest(policy)})
            self._write(self.progress_path, {})
            return {}
        recorded = self._read_json(self.policy_path)
        if not isinstance(recorded, dict) or digest(recorded.get("policy")) != recorded.get("policy_digest"):
            raise RunError(f"{self.policy_path} does not verify (digest mismatch): not resuming")
        differences = policy_differences(recorded["policy"], policy)
        if differences:
            raise RunError("the recorded policy differs from the current one; not resuming:\n  "
                           + "\n  ".join(differences))
        progress = self._read_json(self.progress_path)
        for question_id, entry in progress.items():
            self.load_artifact(question_id, entry)  # every finished artifact must verify before we go on
        return progress

    def artifact_path(self, question_id: str) -> Path:
        return self.path / "instances" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', question_id)}.json"

    def save_artifact(self, progress: dict[str, Any], question_id: str, artifact: dict[str, Any]) -> None:
        text = canonical_json(artifact)
        path = self.artifact_path(question_id)
        path.write_text(text, encoding="utf-8")
        progress[question_id] = {"status": "done", "artifact": path.name, "digest": digest(artifact)}
        self._write(self.progress_path, progress)

    def load_artifact(self, question_id: str, entry: dict[str, Any]) -> dict[str, Any]:
        path = self.path / "instances" / str(entry.get("artifact"))
        try:
            artifact = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RunError(f"artifact of {question_id} ({path.name}) cannot be read: {exc}; not resuming") from None
        if digest(artifact) != entry.get("digest"):
            raise RunError(f"artifact of {question_id} ({path.name}) does not verify (digest mismatch); not resuming")
        return artifact

    def _read_json(self, path: Path) -> Any:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RunError(f"{path} cannot be read: {exc}; not resuming") from None

    @staticmethod
    def _write(path: Path, value: Any) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(value, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path)


# --- scores ----------------------------------------------------------------------------------------------------


def normalize(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", str(text).lower()).split())


def contains_answer(summary: str, answer: Any) -> bool:
    gold = normalize(answer if not isinstance(answer, list) else " ".join(map(str, answer)))
    return bool(gold) and gold in normalize(summary)


def evidence_units(inst: Instance, manifests: list[dict[str, Any]]) -> set[str]:
    """Memory units (chunks) that hold a `has_answer` turn of an answer session."""
    by_source = {m["source_id"]: m for m in manifests}
    units = set()
    for session_id, session in zip(inst.haystack_session_ids, inst.haystack_sessions):
        hits = [i for i, turn in enumerate(session) if turn.has_answer]
        if not hits or session_id not in by_source:
            continue
        exchanges = group_exchanges([t.model_dump() for t in session])
        for chunk in by_source[session_id]["chunks"]:
            first, last = exchanges[chunk["start"]][0], exchanges[chunk["end"]][1]
            if any(first <= i <= last for i in hits):
                units.add(f"{session_id}#{chunk['index']}")
    return units


def score(inst: Instance, nodes: list[dict[str, Any]], manifests: list[dict[str, Any]]) -> dict[str, Any]:
    final = latest_globals(nodes).get(inst.agent_id, {}).get("text", "")
    haystack = sum(estimate_tokens(t.content) for s in inst.haystack_sessions for t in s)
    units = evidence_units(inst, manifests)
    holders = [n for n in nodes if n["kind"] == "batch" and units & set(n["children"])]
    result = {
        "question_type": inst.question_type, "abstention": inst.abstention,
        "compression": estimate_tokens(final) / haystack if haystack else None,
        "evidence_units": sorted(units),
        "evidence_chunks_kept": None,
        "answer_in_global": None, "answer_in_any_node": None,
    }
    if not inst.abstention:  # an abstention's "answer" explains why there is none: nothing to retain
        result["answer_in_global"] = contains_answer(final, inst.answer)
        result["answer_in_any_node"] = any(contains_answer(n["text"], inst.answer) for n in nodes)
        if holders:
            kept = sum(contains_answer(n["text"], inst.answer) for n in holders)
            result["evidence_chunks_kept"] = kept / len(holders)
    return result


JUDGE = ("I will give you a question, a correct answer, and a response from a model. Please answer yes if the "
         "response contains the correct answer. Otherwise, answer no. If the response is equivalent to the correct "
         "answer or contains all the intermediate steps to get the correct answer, you should also answer yes. If "
         "the response only contains a subset of the information required by the answer, answer no.\n\n"
         "Question: {question}\n\nCorrect Answer: {answer}\n\nModel Response: {response}\n\n"
         "Is the model response correct? Answer yes or no only.")
JUDGE_ABSTENTION = ("I will give you an unanswerable question, an explanation, and a response from a model. Please "
                    "answer yes if the model correctly identifies the question as unanswerable. The model could say "
                    "that the information is incomplete, or some other information is given but the asked "
                    "information is not.\n\nQuestion: {question}\n\nExplanation: {answer}\n\nModel Response: "
                    "{response}\n\nDoes the model correctly identify the question as unanswerable? "
                    "Answer yes or no only.")


def qa(inst: Instance, memory: str, client: Any, factory: Any) -> dict[str, Any]:
    """Answer from the global summary, then judge with the same endpoint."""
    ask = [{"role": "system", "content": "Answer the question using only the memory below. If the memory does "
            "not contain the answer, say you do not know."},
           {"role": "user", "content": f"Memory:\n{memory}\n\nCurrent date: {inst.question_date}\n"
            f"Question: {inst.question}"}]
    response = client.complete(factory.build(ask, prompt_version="lme-answer-v1")).text
    template = JUDGE_ABSTENTION if inst.abstention else JUDGE
    verdict = client.complete(factory.build(
        [{"role": "user", "content": template.format(question=inst.question, answer=inst.answer,
                                                     response=response)}],
        prompt_version="lme-judge-v1", max_tokens=8)).text
    return {"response": response, "correct": verdict.strip().lower().startswith("yes")}


def report(run_dir: RunDir, progress: dict[str, Any]) -> dict[str, Any]:
    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for question_id, entry in progress.items():
        artifact = run_dir.load_artifact(question_id, entry)
        by_type[artifact["scores"]["question_type"]].append(artifact)

    def share(values: list[Any]) -> float | None:
        values = [v for v in values if v is not None]
        return round(sum(values) / len(values), 4) if values else None

    rows = {}
    for qtype, artifacts in sorted(by_type.items()):
        scores = [a["scores"] for a in artifacts]
        rows[qtype] = {
            "instances": len(artifacts),
            "answer_in_global": share([s["answer_in_global"] for s in scores]),
            "answer_in_any_node": share([s["answer_in_any_node"] for s in scores]),
            "evidence_chunks_kept": share([s["evidence_chunks_kept"] for s in scores]),
            "compression": share([s["compression"] for s in scores]),
            "qa_accuracy": share([a["qa"]["correct"] for a in artifacts if a.get("qa")]),
        }
    return rows


# --- the run ------------------------------------------------------------------------------------------------


def run_instances(instances: list[Instance], config: Config, workdir: Path) -> dict[str, dict[str, list]]:
    """One local job over these instances; outputs split by agent."""
    from jobkit import execute, write_lines

    from flink_memory.flink.pipeline import build_job

    records = [r for inst in instances for r in records_of(inst)]
    input_path = write_lines(workdir / "input" / "part-0.jsonl", records)
    output = workdir / "output"
    execute(build_job(config, str(input_path), str(output)), "longmemeval", timeout_s=24 * 3600)
    outputs = read_outputs(str(output))
    split: dict[str, dict[str, list]] = {i.agent_id: {"summaries": [], "manifests": [], "dead-letters": []}
                                         for i in instances}
    for kind, rows in outputs.items():
        for row in rows:
            agent = row.get("agent_id")
            if agent in split:
                split[agent][kind].append(row)
    return split


def run(args: argparse.Namespace) -> int:
    instances = load_instances(args.data)
    overrides = ["journal.path=null", "checkpointing.interval_s=0", *args.overrides]
    if args.base_url:
        overrides = ["llm.provider=openai", f"llm.base_url={args.base_url}", *overrides]
    config = load_config(args.config, overrides)
    run_dir = RunDir(args.run_dir)
    progress = run_dir.open(policy_of(config), args.resume)
    pending = [i for i in instances if i.question_id not in progress]
    print(f"[longmemeval] {len(instances)} instances, {len(progress)} done, {len(pending)} to run", flush=True)
    server = start_local_model(config)
    client = factory = None
    if args.qa:
        from flink_memory.llm.chat_client import LLMClient
        from flink_memory.requests import RequestFactory

        client, factory = LLMClient(config.llm, config.llm.base_url), RequestFactory.from_config(config.llm)
    try:
        for start in range(0, len(pending), args.chunk):
            group = pending[start:start + args.chunk]
            with tempfile.TemporaryDirectory() as tmp:
                outputs = run_instances(group, config, Path(tmp))
            for inst in group:
                out = outputs[inst.agent_id]
                artifact = {"question_id": inst.question_id, "nodes": out["summaries"], "manifests": out["manifests"],
                            "dead_letters": out["dead-letters"],
                            "scores": score(inst, out["summaries"], out["manifests"])}
                if client is not None:
                    memory = latest_globals(out["summaries"]).get(inst.agent_id, {}).get("text", "")
                    artifact["qa"] = qa(inst, memory, client, factory)
                run_dir.save_artifact(progress, inst.question_id, artifact)
                print(f"[longmemeval] {inst.question_id}: {json.dumps(artifact['scores'])}", flush=True)
    finally:
        if server is not None:
            server.close()
    rows = report(run_dir, progress)
    (run_dir.path / "report.json").write_text(json.dumps(rows, indent=2))
    print(json.dumps(rows, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="run instances through the job and score them")
    go.add_argument("--data", type=Path, required=True, help="a LongMemEval JSON file (official format)")
    go.add_argument("--run-dir", type=Path, required=True)
    go.add_argument("--resume", action="store_true", help="continue the run in --run-dir under the same policy")
    go.add_argument("--config", help="YAML config file")
    go.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    go.add_argument("--base-url", help="OpenAI-compatible endpoint (default: the embedded model)")
    go.add_argument("--chunk", type=int, default=50, help="instances per job run (progress is saved after each)")
    go.add_argument("--qa", action="store_true", help="answer and judge every question with the endpoint")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except RunError as exc:
        print(f"longmemeval: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
