import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flink_memory.tokens import Budget, RequestTooLarge, estimate_messages, estimate_tokens, split_text

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
