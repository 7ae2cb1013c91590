import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flink_memory.llm.tokenizers import ServerTokenizer
from flink_memory.tokens.budget import Budget, RequestTooLarge
from flink_memory.tokens.calibration import make_calibration
from flink_memory.tokens.counter import TokenCounter
from flink_memory.tokens.estimate import estimate_messages, estimate_tokens
from flink_memory.tokens.split import split_text

VARIED = {
    "english": "The quick brown fox jumps over the lazy dog. Alice met Bob on 2024-03-05 in Paris.",
    "code": "def f(x):\n    return {k: v**2 for k, v in x.items() if v > 0}\n\nclass A(B):\n\tpass\n",
    "cjk": "我们明天在北京见面，讨论项目预算。東京タワーは高い。한국어 문장입니다.",
    "emoji": "🎉🚀👩‍💻🔥 great job 😀😀 ✅❌",
    "hex": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "base64": "U29tZSBiYXNlNjQgZW5jb2RlZCB0ZXh0IHdpdGggK2FuZC9zbGFzaGVzPT0=",
    "mixed": "Ünïcödé façade naïve résumé Ωμέγα Привет мир العربية हिन्दी",
}


def test_budget_arithmetic():
    budget = Budget(4096, 512)
    assert budget.prompt_room() == 4096 - 512 - budget.reserve
    messages = [{"role": "user", "content": "x " * 10000}]
    with pytest.raises(RequestTooLarge):
        budget.check(messages)
    assert budget.check([{"role": "user", "content": "hello"}]) == estimate_messages(
        [{"role": "user", "content": "hello"}])


def test_estimates_are_monotonic_in_length():
    text = VARIED["english"] * 3
    values = [estimate_tokens(text[:n]) for n in range(len(text) + 1)]
    assert values == sorted(values)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300))
def test_the_estimate_never_exceeds_the_utf8_bytes(text):
    """The planner lets a short item skip the estimate on this bound (4 bytes a character at most)."""
    assert estimate_tokens(text) <= len(text.encode("utf-8", errors="surrogatepass")) <= 4 * len(text)


def test_counting_a_long_letter_run_keeps_no_copy_of_it():
    """Only word-sized runs are cached: splitting a long run counts ever shorter tails of it, and caching
    those kept the whole text alive many times over."""
    from flink_memory.tokens.estimate import _short_letter_run

    before = _short_letter_run.cache_info().currsize
    text = "acgt" * 5000
    assert split_text(text, 500) and estimate_tokens(text) == -(-len(text) * 4 // 5)
    assert _short_letter_run.cache_info().currsize == before


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=2000), st.integers(min_value=8, max_value=300))
def test_split_text_rejoins_and_respects_budget(text, budget):
    parts = split_text(text, budget)
    assert "".join(parts) == text
    assert all(estimate_tokens(p) <= budget for p in parts)
    assert all(parts)


def test_split_prefers_paragraphs():
    text = ("word " * 30 + "\n\n") * 4
    parts = split_text(text, 40)
    assert all(p.endswith("\n\n") or p.endswith(" ") for p in parts[:-1])


@pytest.mark.slow
@pytest.mark.embedded
def test_estimate_never_undercounts_the_real_model(embedded_llm):
    """usage.prompt_tokens of the real SmolLM2 server against our estimate, on varied text."""
    import openai

    client = openai.OpenAI(base_url=embedded_llm.base_url + "/v1", api_key="none")
    for name, text in VARIED.items():
        for content in (text, text * 6):
            messages = [{"role": "system", "content": "Summarize."}, {"role": "user", "content": content}]
            usage = client.chat.completions.create(
                model="m", messages=messages, max_tokens=1, extra_body={"cache_prompt": False}
            ).usage
            assert estimate_messages(messages) >= usage.prompt_tokens, name


JSON_ESCAPED = '{"note": "line\\nbreak \\"quoted\\" \\\\ back\\u00e9", "n": [1, 2.5e-3]}'


@pytest.mark.slow
@pytest.mark.embedded
def test_server_tokenizer_counts_exactly_what_the_model_counts(embedded_llm):
    """Our count of a whole request (template included) equals llama.cpp's usage.prompt_tokens."""
    import openai

    counter = TokenCounter(ServerTokenizer(embedded_llm.base_url))
    client = openai.OpenAI(base_url=embedded_llm.base_url + "/v1", api_key="none")
    for name, text in {**VARIED, "json": JSON_ESCAPED}.items():
        for content in (text, "\n".join([text] * 4)):
            messages = [{"role": "system", "content": "Summarize the DATA lines."},
                        {"role": "user", "content": content}]
            usage = client.chat.completions.create(
                model="m", messages=messages, max_tokens=1, extra_body={"cache_prompt": False}
            ).usage
            assert counter.request(messages) == usage.prompt_tokens, name


@pytest.mark.slow
@pytest.mark.embedded
def test_packed_requests_fill_the_window_and_the_server_rejects_none():
    """n_ctx = llm.context_window: batches packed to the budget by the model's tokenizer are all accepted."""
    from flink_memory.config import load_config
    from flink_memory.llm.chat_client import LLMClient
    from flink_memory.llm.llamacpp import EmbeddedServer
    from flink_memory.summarize.reduce import ReduceJob

    server = EmbeddedServer(context_window=640, parallel=1, threads=2)
    try:
        config = load_config(None, ["llm.context_window=640", "llm.max_output_tokens=16"], environ={})
        tokenizer = ServerTokenizer(server.base_url)
        client = LLMClient(config.llm, server.base_url, counter=TokenCounter(tokenizer, make_calibration(tokenizer)))
        budget = client.requests.budget
        entries = [{"text": f"{name} {k}: {text}", "from": None, "to": None}
                   for k in range(3) for name, text in {**VARIED, "json": JSON_ESCAPED}.items()]
        job = ReduceJob(purpose="batch", entries=entries)
        requests = job.requests(client.requests)
        assert len(requests) >= 2
        fills = []
        for request in requests:
            result = client.complete(request)  # raises on a rejection
            assert result.prompt_tokens == client.counter.request(request.message_dicts())
            assert result.prompt_tokens + request.max_tokens <= 640
            fills.append(result.prompt_tokens / budget.prompt_room())
        assert max(fills) >= 0.85, fills
        assert client.stats.snapshot()["context_rejections"] == 0
    finally:
        server.close()
