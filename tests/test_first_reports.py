"""The first requests of a kind go out full: batches opened before the first batch report are packed by it,
merges and globals count each summary by the provider's own count of it (issue 33)."""

from stagekit import Pipeline, cfg

from flink_memory.local import LocalStage
from flink_memory.records import MemoryUnit
from flink_memory.requests import ChatResult, RequestFactory
from flink_memory.stages.batcher import BatcherCore
from flink_memory.tokens.calibration import make_calibration
from flink_memory.tokens.counter import TokenCounter
from flink_memory.tokens.tokenizer import EstimateTokenizer

SETTINGS = ("llm.context_window=2048", "llm.max_output_tokens=256", "batching.max_items=1000")


def batcher():
    config = cfg(*SETTINGS)
    tokenizer = EstimateTokenizer()
    factory = RequestFactory.from_config(config.llm, TokenCounter(tokenizer, make_calibration(tokenizer)))
    return LocalStage("batcher", BatcherCore(config, factory)), factory


def unit(agent, i):
    text = f"{agent} paid the invoice on 2026-03-{1 + i % 28:02d} for {100 + i} EUR, reference {100000 + i}."
    return MemoryUnit(agent_id=agent, unit_id=f"u{i}", source_id=f"u{i}", text=text,
                      ts=f"2026-03-{1 + i % 28:02d}T10:00:00Z")


def entries(request):
    return sum(1 for line in request.messages[-1][1].splitlines() if not line.startswith("@"))


def started(effects):
    return list({r.digest: r for r in effects.start}.values())  # (a pending batch may be driven twice)


def feed(stage, agent, units, finished, now=0):
    started, waiting = [], []
    for i in range(units):
        effects = stage.activate(agent, unit(agent, i), finished, now)
        started += effects.start
        waiting = [r for r in effects.waiting if r not in effects.start]
    return started, waiting


def test_the_units_after_the_first_batch_wait_for_its_report_and_are_packed_by_it():
    """The first batch is packed at the upper bound; the units behind it are held, not closed at a scale that
    depends on when the report comes, and are packed by the report (issue 45: the same batches every run)."""
    stage, factory = batcher()
    finished = {}
    lead, _ = feed(stage, "a", 200, finished)
    assert len(started(stage.activate("a", None, finished, 5))) == 1  # only the first batch, the rest is held
    messages = lead[0].message_dicts()
    finished[lead[0].digest] = ChatResult(text="s", prompt_tokens=factory.counter.raw_request(messages) // 2,
                                          completion_tokens=1, model="m")
    batches = started(stage.activate("a", None, finished, 10))
    assert batches and entries(batches[0]) > 1.5 * entries(lead[0])
    assert all(r.digest != lead[0].digest for r in batches)


# --- merges and globals: the provider counted each summary when it wrote it ---------------------------------

def tree_pipeline(*settings):
    """A pipeline whose provider counts half of our estimate, reports it (completion tokens too), and answers
    with a long summary in the words of its input (as summaries are: names, numbers and dates)."""
    config = cfg("llm.context_window=2048", "llm.max_output_tokens=256", *settings)
    tokenizer = EstimateTokenizer()
    factory = RequestFactory.from_config(config.llm, TokenCounter(tokenizer, make_calibration(tokenizer)))

    def answer(request):
        messages = request.message_dicts()
        reported = factory.counter.raw_request(messages) // 2
        factory.counter.observe(messages, reported, request.kind)
        lines = [line for line in request.messages[-1][1].splitlines() if not line.startswith("@")]
        text = " ".join(lines)[: request.max_tokens * 3]
        return ChatResult(text=text, prompt_tokens=reported, completion_tokens=factory.counter.raw(text) // 2,
                          model="m")

    return Pipeline(config, answer, factory=factory), factory


def records(agent, n):
    return [{k: v for k, v in unit(agent, i).model_dump().items() if k in ("agent_id", "text", "ts")} | {"id": f"m{i}"}
            for i in range(n)]


def test_an_agents_first_merge_and_global_are_packed_by_the_providers_count_of_their_summaries():
    """Before merges or globals have reported, the upper bound would merge a few summaries at a time and
    condense the global in rounds; each summary's completion count bounds its line instead."""
    pipeline, factory = tree_pipeline("batching.max_items=4", "summarization.fan_in=8")
    pipeline.feed(*records("a", 4 * 24)).end()
    merges = [r for r in pipeline.sent if r.kind == "merge"]
    globals_ = [r for r in pipeline.sent if r.kind == "global"]
    assert [entries(r) for r in merges] == [8, 8, 8]  # fan_in each, the first too
    assert len(globals_) == 1 and len(pipeline.nodes("global")) == 1  # one call, no condensing round
    for request in merges[:1] + globals_:
        messages = request.message_dicts()
        assert factory.counter.request(messages, 1.0) + 256 > 2048  # at the upper bound it would not fit
        # the client checks it by its bound, and the provider's count fits the window
        assert request.bound is not None and factory.counter.request(messages, request.bound) + 256 <= 2048
        assert factory.counter.raw_request(messages) // 2 + 256 <= 2048
    assert sorted(u for n in pipeline.nodes("batch") for u in n["children"]) == sorted(f"m{i}" for i in range(96))
