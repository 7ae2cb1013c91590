"""The model's own tokenizers, for `llm.tokenizer`: exact counts where one is reachable.

- `ServerTokenizer`: llama.cpp's `/tokenize`, with the chat template's overhead measured once through
  `/apply-template` (exact for the embedded model and any llama.cpp-compatible endpoint).
- `HFTokenizer` (a Hugging Face `tokenizers` JSON file) and `TiktokenTokenizer` (an encoding tiktoken can load
  offline, from `TIKTOKEN_CACHE_DIR`): exact content counts; template overhead from OpenAI's published
  per-message figures for tiktoken, and learned from `usage.prompt_tokens` for HF files.

They do I/O (HTTP, model files, optional packages), so they live beside the client; the pure counting they
plug into (`TokenCounter`, the estimate, budgets) is `flink_memory.tokens`.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from flink_memory.tokens.estimate import MESSAGE_OVERHEAD, REQUEST_OVERHEAD
from flink_memory.tokens.tokenizer import EstimateTokenizer, Tokenizer, TokenizerUnreachable


class TokenizerUnavailable(RuntimeError):
    """`llm.tokenizer` names a tokenizer that cannot be loaded here; the message says what is missing."""


def _post_json(url: str, body: dict[str, Any], timeout_s: float) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (configured endpoint)
        return json.loads(response.read())


def server_root(base_url: str) -> str:
    """llama.cpp serves /tokenize beside /v1, not under it."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class ServerTokenizer:
    """llama.cpp's own tokenizer over HTTP; the template overhead is measured with /apply-template."""

    exact = True

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.root = server_root(base_url)
        self.timeout_s = timeout_s
        self.name = f"server:{self.root}"
        try:
            self.per_message, self.per_request = self._measure_template()
        except (OSError, ValueError, KeyError, TypeError, TokenizerUnreachable) as exc:
            raise TokenizerUnavailable(f"{self.root} does not serve llama.cpp's /tokenize and /apply-template "
                                       f"({type(exc).__name__}: {exc})") from None

    def _tokens(self, text: str, special: bool) -> int:
        answer = _post_json(self.root + "/tokenize",
                            {"content": text, "add_special": special, "parse_special": special}, self.timeout_s)
        return len(answer["tokens"])

    def count(self, text: str) -> int:
        try:
            return self._tokens(text, False) if text else 0
        except (OSError, ValueError, KeyError, TypeError) as exc:  # URLError and HTTPError are OSErrors
            raise TokenizerUnreachable(f"{self.root}/tokenize: {type(exc).__name__}: {exc}") from None

    def _rendered(self, messages: list[dict[str, str]]) -> int:
        prompt = _post_json(self.root + "/apply-template", {"messages": messages}, self.timeout_s)["prompt"]
        return self._tokens(prompt, True)

    def _measure_template(self) -> tuple[int, int]:
        """Per-message and per-request template tokens, from a one- and a two-message rendering.

        Both start with a system message, as every request of ours does: some templates (SmolLM2's) insert a
        default system prompt when there is none.
        """
        hello, user, system = self.count("hello"), self.count("user"), self.count("system")
        one = self._rendered([{"role": "system", "content": "hello"}])
        two = self._rendered([{"role": "system", "content": "hello"}, {"role": "user", "content": "hello"}])
        per_message = two - one - user - hello
        per_request = one - per_message - system - hello
        if per_message < 0 or per_request < 0:
            raise ValueError(f"unexpected template counts ({one}, {two})")
        return per_message, per_request


class HFTokenizer:
    """A Hugging Face `tokenizers` JSON file (no download: the file is given by path)."""

    exact = True
    per_message = MESSAGE_OVERHEAD
    per_request = REQUEST_OVERHEAD

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer as HF
        except ImportError:
            raise TokenizerUnavailable("llm.tokenizer hf:... needs the 'tokenizers' package "
                                       "(pip install 'flink-memory[tokenizers]')") from None
        try:
            self._tokenizer = HF.from_file(path)
        except Exception as exc:  # tokenizers raises its own Exception type for unreadable files
            raise TokenizerUnavailable(f"cannot load the tokenizer file {path}: {exc}") from None
        self.name = f"hf:{path}"

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids) if text else 0


class TiktokenTokenizer:
    """A tiktoken encoding loaded offline; overhead per OpenAI's chat format (3 a message, 3 for the reply)."""

    exact = True
    per_message = 3
    per_request = 3

    def __init__(self, encoding: str | Any) -> None:
        if isinstance(encoding, str):
            try:
                import tiktoken
            except ImportError:
                raise TokenizerUnavailable("llm.tokenizer tiktoken:... needs the 'tiktoken' package") from None
            try:
                encoding = tiktoken.get_encoding(encoding)
            except Exception as exc:  # offline without the encoding file in TIKTOKEN_CACHE_DIR
                raise TokenizerUnavailable(f"tiktoken encoding {encoding!r} is not available offline ({exc}); "
                                           "put its file in TIKTOKEN_CACHE_DIR") from None
        self._encoding = encoding
        self.name = f"tiktoken:{encoding.name}"

    def count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=())) if text else 0


def open_tokenizer(spec: str, base_url: str | None, provider: str, model: str) -> Tokenizer:
    """`llm.tokenizer`: auto | server | estimate | tiktoken:NAME | hf:PATH."""
    if spec == "estimate":
        return EstimateTokenizer()
    if spec.startswith("hf:"):
        return HFTokenizer(spec[3:])
    if spec.startswith("tiktoken:"):
        return TiktokenTokenizer(spec[len("tiktoken:"):])
    if spec == "server":
        if not base_url:
            raise TokenizerUnavailable("llm.tokenizer: server needs an endpoint (llm.base_url or the embedded model)")
        return ServerTokenizer(base_url)
    # auto: the endpoint's own tokenizer, then tiktoken for OpenAI model names, then the calibrated estimate
    if base_url:
        try:
            return ServerTokenizer(base_url, timeout_s=5.0 if provider == "openai" else 30.0)
        except TokenizerUnavailable:
            if provider == "embedded":
                raise
    try:
        import tiktoken

        return TiktokenTokenizer(tiktoken.encoding_for_model(model))
    except Exception:  # not installed, not an OpenAI model name, or the encoding file is not cached
        return EstimateTokenizer()
