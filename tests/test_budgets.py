"""The start-up budget check against every request builder: what it accepts never overflows the window."""


import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_server import chars_per_token, prompt_count
from stagekit import Pipeline

from flink_memory import budgets
from flink_memory.config import ConfigError, load_config
from flink_memory.records import Conversation, MemoryItem
from flink_memory.requests import ChatResult, ContextOverflow, RequestFactory
from flink_memory.tokens.calibration import make_calibration
from flink_memory.tokens.counter import TokenCounter
from flink_memory.tokens.tokenizer import EstimateTokenizer


def cfg(*overrides):
    return load_config(None, list(overrides), environ={})


PROVIDER = chars_per_token(4)  # close to real BPE on English


def call(request, factory, window):
    """A provider that counts chars/4, refuses what exceeds its window and always writes max_tokens tokens.

    Like the client, the counter learns from every usage report of a kind (and from every refusal's count).
    """
    messages = request.message_dicts()
    reported = prompt_count(messages, PROVIDER)
    factory.counter.observe(messages, reported, request.kind)
    if reported + request.max_tokens > window:
        raise ContextOverflow(f"request ({reported} tokens) exceeds the available context size ({window} tokens)")
    if request.kind == "plan":  # one chunk per window: the most planning calls a conversation can cost
        shown = [int(line[1:line.index("]")]) for line in request.messages[1][1].splitlines()[1:]]
        return ChatResult(text=json.dumps({"ends": [shown[-1]]}), prompt_tokens=reported, completion_tokens=8,
                          model="m")
    return ChatResult(text="word " * int(request.max_tokens * 0.8), prompt_tokens=reported,
                      completion_tokens=request.max_tokens, model="m")


def drive(config, records):
    """Every request the stage cores build for `records`, answered by the worst-case model."""
    window = config.llm.context_window
    tokenizer = EstimateTokenizer()
    factory = RequestFactory.from_config(config.llm, TokenCounter(tokenizer, make_calibration(tokenizer)))
    pipeline = Pipeline(config, lambda request: call(request, factory, window), factory=factory)
    pipeline.feed(*[record.model_dump(mode="json", exclude={"kind"}) for record in records]).end()
    assert not pipeline.dead_letters, pipeline.dead_letters
    assert pipeline.calls("batch") >= 1 and pipeline.current("a") is not None
    return pipeline.sent


def conversation(i, turns, words):
    messages = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"question {t} " + "about the launch plan " * words})
        messages.append({"role": "assistant", "content": f"answer {t} " + "with numbers 12 34 " * words})
    return Conversation(agent_id="a", id=f"c{i}", messages=messages)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    window=st.integers(512, 12_000),
    output=st.integers(16, 1500),
    chunk=st.integers(32, 3000),
    fan_in=st.integers(2, 12),
    item_words=st.lists(st.integers(1, 400), min_size=1, max_size=8),
    conversations=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 30)), max_size=2),
)
def test_whatever_the_check_accepts_never_overflows(window, output, chunk, fan_in, item_words, conversations):
    config = cfg(f"llm.context_window={window}", f"llm.max_output_tokens={output}",
                 f"chunking.max_chunk_tokens={chunk}", f"summarization.fan_in={fan_in}")
    try:
        budgets.check(config)
    except ConfigError as exc:
        smallest = budgets.minimum_window(config)
        assert smallest is not None and str(smallest) in str(exc)
        assert smallest > window
        budgets.check(cfg(f"llm.context_window={smallest}", f"llm.max_output_tokens={output}",
                          f"chunking.max_chunk_tokens={chunk}", f"summarization.fan_in={fan_in}"))
        return
    records = [MemoryItem(agent_id="a", id=f"m{i}", text="Alice paid 40 EUR on 2026-03-01. " * words)
               for i, words in enumerate(item_words)]
    records += [conversation(i, turns, words) for i, (turns, words) in enumerate(conversations)]
    assert drive(config, records)


def test_a_2k_window_with_256_output_tokens_is_accepted():
    budgets.check(cfg("llm.context_window=2048", "llm.max_output_tokens=256"))


def test_an_impossible_window_names_the_smallest_that_works():
    config = cfg("llm.context_window=1024", "llm.max_output_tokens=512")
    with pytest.raises(ConfigError) as err:
        budgets.check(config)
    smallest = budgets.minimum_window(config)
    assert f"smallest llm.context_window that works with these settings is {smallest}" in str(err.value)
    budgets.check(cfg(f"llm.context_window={smallest}", "llm.max_output_tokens=512"))
    with pytest.raises(ConfigError):
        budgets.check(cfg(f"llm.context_window={smallest - 1}", "llm.max_output_tokens=512"))


def test_planner_requests_leave_room_for_their_own_answer():
    """The planner answers with up to 256 tokens whatever llm.max_output_tokens says (the hidden-corpus crash)."""
    config = cfg("llm.context_window=2048", "llm.max_output_tokens=128", "chunking.max_chunk_tokens=300")
    budgets.check(config)
    sent = drive(config, [conversation(0, 80, 12)])
    planned = [r for r in sent if r.json_schema]
    assert len(planned) > 1 and all(r.max_tokens == 256 for r in planned)
