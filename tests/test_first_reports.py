"""Each kind's first request leads: what would be packed at the estimate's upper bound waits for its report.

Before any batch has reported, a batch the token budget closes is packed at scale 1 (about half full on a
real vocabulary). The process's first such batch goes at once; the batches that the budget would close
while it is in flight are held in their buffers, and packed at the scale it teaches once it ends.
"""

import json

from stagekit import Pipeline, Stage, cfg

from flink_memory.requests import ChatResult, LLMCallError, RequestFactory
from flink_memory.stages.batcher import BatcherCore
from flink_memory.tokens.calibration import make_calibration
from flink_memory.tokens.counter import TokenCounter
from flink_memory.tokens.tokenizer import EstimateTokenizer

SETTINGS = ("llm.context_window=2048", "llm.max_output_tokens=256", "batching.max_items=1000")


def batcher():
    config = cfg(*SETTINGS)
    tokenizer = EstimateTokenizer()
    factory = RequestFactory.from_config(config.llm, TokenCounter(tokenizer, make_calibration(tokenizer)))
    return Stage("batcher", BatcherCore(config, factory)), factory


def unit(agent, i):
    text = f"{agent} paid the invoice on 2026-03-{1 + i % 28:02d} for {100 + i} EUR, reference {100000 + i}."
    return json.dumps({"agent_id": agent, "unit_id": f"u{i}", "source_id": f"u{i}", "text": text,
                       "ts": f"2026-03-{1 + i % 28:02d}T10:00:00Z"})


def entries(request):
    return sum(1 for line in request.messages[-1][1].splitlines() if not line.startswith("@"))


def held(effects):
    """The calls an activation waits for besides its own."""
    return [r for r in effects.waiting if r not in effects.start]


def started(effects):
    return list({r.digest: r for r in effects.start}.values())  # (a pending batch may be driven twice)


def feed(stage, agent, units, finished, now=0):
    started, waiting = [], []
    for i in range(units):
        effects = stage.activate(agent, unit(agent, i), finished, now)
        started += effects.start
        waiting = held(effects)
    return started, waiting


def test_batches_closed_while_the_first_is_in_flight_wait_for_its_report_and_are_packed_by_it():
    stage, factory = batcher()
    finished = {}
    lead, waiting = feed(stage, "a", 60, finished)
    assert len(lead) == 1 and waiting == lead  # the buffer behind it holds more than one batch's worth
    first = entries(lead[0])
    others, waiting = feed(stage, "b", 200, finished)
    assert others == [] and waiting == lead  # another agent's batches wait too
    # the provider counts half of our estimate
    messages = lead[0].message_dicts()
    factory.counter.observe(messages, factory.counter.request(messages) // 2, "batch")
    finished[lead[0].digest] = ChatResult(text="s", prompt_tokens=1, completion_tokens=1, model="m")
    effects = stage.activate("b", None, finished, 10)
    batches = started(effects)
    assert batches and not held(effects)
    assert all(entries(r) > 1.5 * first for r in batches)  # packed by the report, fuller
    sizes = [factory.counter.request(r.message_dicts(), factory.counter.scale_for("batch")) for r in batches]
    assert max(sizes) + 256 <= 2048
    assert sum(entries(r) for r in batches) < 200  # the rest stays buffered for the next units


def test_the_batch_opened_before_the_lead_reported_is_packed_by_the_report():
    """The lead reports before the buffer behind it (opened at the upper bound) is full: that buffer is packed
    by the report too, not closed half full at the scale it was opened with."""
    stage, factory = batcher()
    finished = {}
    lead, _ = feed(stage, "a", 30, finished)
    messages = lead[0].message_dicts()
    factory.counter.observe(messages, factory.counter.request(messages) // 2, "batch")
    finished[lead[0].digest] = ChatResult(text="s", prompt_tokens=1, completion_tokens=1, model="m")
    batches = []
    for i in range(30, 200):
        batches += started(stage.activate("a", unit("a", i), finished, 10 + i))
    assert batches and entries(batches[0]) > 1.5 * entries(lead[0])


def test_a_lead_that_fails_releases_the_held_batches_at_the_upper_bound():
    stage, _ = batcher()
    finished = {}
    lead, _ = feed(stage, "a", 30, finished)
    others, waiting = feed(stage, "b", 120, finished)
    assert others == [] and waiting == lead
    finished[lead[0].digest] = LLMCallError("down")
    effects = stage.activate("b", None, finished, 10)
    assert started(effects) and not held(effects)  # no second wait: packed as without a report
    assert all(abs(entries(r) - entries(lead[0])) <= 2 for r in started(effects))


def test_batches_closed_by_count_and_exact_tokenizers_never_wait():
    config = cfg("llm.context_window=2048", "llm.max_output_tokens=256", "batching.max_items=5")
    stage = Stage("batcher", BatcherCore(config, RequestFactory.from_config(config.llm, TokenCounter())))
    started, waiting = feed(stage, "a", 20, {})
    assert len(started) == 4 and not waiting

    exact = EstimateTokenizer(exact=True)
    config = cfg(*SETTINGS)
    factory = RequestFactory.from_config(config.llm, TokenCounter(exact, make_calibration(exact)))
    stage = Stage("batcher", BatcherCore(config, factory))
    started, waiting = feed(stage, "a", 200, {})
    assert len(started) >= 3 and not waiting


def test_the_end_of_input_waits_for_the_lead_then_closes_every_unit():
    stage, factory = batcher()
    finished = {}
    lead, _ = feed(stage, "a", 30, finished)
    feed(stage, "b", 120, finished)
    core = stage.core
    effects = stage.run("b", lambda tx: core.on_end(tx, finished, 5))
    assert effects.start == [] and effects.waiting == lead
    finished[lead[0].digest] = ChatResult(text="s", prompt_tokens=1, completion_tokens=1, model="m")
    effects = stage.run("b", lambda tx: core.on_end(tx, finished, 6))
    assert sum(entries(r) for r in started(effects)) == 120 and not held(effects)


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
    return [{k: v for k, v in json.loads(unit(agent, i)).items() if k in ("agent_id", "text", "ts")} | {"id": f"m{i}"}
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
