"""Token counts and request budgets: the model's own tokenizer where one is reachable, else a calibrated estimate.

Every request builder (batch, part, merge, global, planner windows) sizes its request with one `Budget`, so
a configuration accepted at start never produces a request that does not fit.

- `ServerTokenizer`: llama.cpp's `/tokenize`, with the chat template's overhead measured once through
  `/apply-template` (exact for the embedded model and any llama.cpp-compatible endpoint).
- `HFTokenizer` (a Hugging Face `tokenizers` JSON file) and `TiktokenTokenizer` (an encoding tiktoken can load
  offline, from `TIKTOKEN_CACHE_DIR`): exact content counts; template overhead from OpenAI's published
  per-message figures for tiktoken, and learned from `usage.prompt_tokens` for HF files.
- `EstimateTokenizer`: a conservative upper bound for byte-level BPE (digits and punctuation one token each,
  non-ASCII one token per UTF-8 byte, dictionary-like words a token per three letters, other letter runs four
  tokens per five letters). It overcounts English about 3x, so it is scaled by a `Calibration` that learns the
  provider's ratio from `usage.prompt_tokens`; until a response arrives the scale is 1 (the upper bound).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import threading
import time
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import xxhash

log = logging.getLogger(__name__)

# The estimate by character class, each class counted by one regex pass (C speed; letter runs cached):
# letter runs by _letter_run, digits / ASCII punctuation / control characters one token each, a run of spaces
# and tabs 1 + len // 4, each newline one, a non-ASCII character one per UTF-8 byte.
_LETTERS = re.compile(r"[A-Za-z]+")
_SINGLES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f0-9\x21-\x40\x5b-\x60\x7b-\x7e]")
_SPACES = re.compile(r"[ \t]+")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")

# Template overhead assumed by the estimate (role markers and separators per message, reply priming).
MESSAGE_OVERHEAD = 8
REQUEST_OVERHEAD = 16


def estimate_tokens(text: str) -> int:
    """An upper bound on the tokens of `text` for common BPE tokenizers (never above its UTF-8 bytes)."""
    total = sum(map(_letter_run, _LETTERS.findall(text))) + len(_SINGLES.findall(text)) + text.count("\n")
    total += sum(1 + len(run) // 4 for run in _SPACES.findall(text))
    if not text.isascii():
        total += sum(len(run.encode("utf-8", errors="surrogatepass")) for run in _NON_ASCII.findall(text))
    return total


_WORDLIKE = re.compile(r"^[A-Z]?[a-z]+$|^[A-Z]{1,4}$")
_CONSONANTS = re.compile(r"[^aeiouyAEIOUY]{5,}")


def _letter_run(piece: str) -> int:
    """Dictionary-like words pack about 3+ letters a token; random strings (keys, hashes) barely 1.3."""
    n = len(piece)
    if n > 15:  # (never word-like: not cached, so a long text's runs are not kept alive)
        return -(-n * 4 // 5)
    return _short_letter_run(piece)


@functools.lru_cache(maxsize=1 << 16)
def _short_letter_run(piece: str) -> int:
    n = len(piece)
    if n <= 2:
        return n
    if _WORDLIKE.match(piece) and not _CONSONANTS.search(piece):
        return max(2, -(-n // 3))
    return -(-n * 4 // 5)


def estimate_messages(messages: Iterable[Mapping[str, Any]]) -> int:
    """The estimate for a chat request's prompt (role markers included)."""
    total = REQUEST_OVERHEAD
    for message in messages:
        total += MESSAGE_OVERHEAD + estimate_tokens(str(message.get("role", ""))) + estimate_tokens(
            str(message.get("content") or "")
        )
    return total


# --- tokenizers -------------------------------------------------------------------------------------------


class Tokenizer(Protocol):
    name: str
    exact: bool
    # template tokens per message (besides role and content) and per request (reply priming, BOS)
    per_message: int
    per_request: int

    def count(self, text: str) -> int: ...


class TokenizerUnavailable(RuntimeError):
    """`llm.tokenizer` names a tokenizer that cannot be loaded here; the message says what is missing."""


class TokenizerUnreachable(RuntimeError):
    """A remote tokenizer did not answer (the server restarts, the network drops): texts are counted with the
    estimate, an upper bound, until it is asked again (TokenCounter.unreachable_pause_s)."""


@dataclass
class EstimateTokenizer:
    name: str = "estimate"
    exact: bool = False
    per_message: int = MESSAGE_OVERHEAD
    per_request: int = REQUEST_OVERHEAD

    def count(self, text: str) -> int:
        return estimate_tokens(text)


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


# --- calibration ------------------------------------------------------------------------------------------


# A part request carries slices of item text, as a batch request does; a global is built like a merge (a
# frame, then dated summaries): each pair calibrates together.
_KIND_GROUPS = {"part": "batch", "global": "merge"}


@dataclass
class Calibration:
    """Learns how the provider's count relates to ours from `usage.prompt_tokens`, per request kind.

    Our estimate errs by a different factor on item text, on summaries and on plan lines, so each kind keeps
    the largest ratio seen (provider count / our count) for its own requests; a kind with no report yet uses
    the largest ratio of any kind (the start-up calibration request included) with `unseen_margin`, since
    its text may be counted tighter than what was seen (prose, tables, code differ by a third), so it starts
    conservative. The scale is that ratio plus `margin`, rounded up to 1/64 so it changes in few steps,
    never below `floor`; before any report it is `initial` (1 for the estimate, its upper bound). A provider
    that rejects a request for its length raises its kind's ratio to the count it reported, for this
    process only (`rejected`: such a count may include the output, so it is never kept for later jobs).
    """

    initial: float = 1.0
    margin: float = 0.05
    floor: float = 0.1
    unseen_margin: float = 0.1
    ratios: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, float] = field(default_factory=dict)
    reports: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def _own(self, kind: str) -> float | None:
        group = _KIND_GROUPS.get(kind, kind)
        found = [r for r in (self.ratios.get(group), self.rejected.get(group)) if r is not None]
        return max(found) if found else None

    def scale_for(self, kind: str | None = None) -> float:
        """The factor from raw counts to the provider's tokens for requests of `kind` (None: any kind)."""
        ratio = self._own(kind) if kind else None
        margin = self.margin
        if ratio is None:  # no report of its own: the largest of any kind, with the wider margin
            ratio = max([*self.ratios.values(), *self.rejected.values()], default=None)
            margin = self.unseen_margin
        if ratio is None:
            return self.initial
        return max(self.floor, math.ceil(ratio * (1 + margin) * 64) / 64)

    @property
    def scale(self) -> float:
        """The most conservative scale: the largest ratio of any kind."""
        return self.scale_for(None)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.ratios)

    def observe(self, ours: int, reported: int, kind: str = "", *, rejection: bool = False) -> bool:
        """Learn from one report; True when a kept ratio grew (worth keeping for the next start)."""
        if ours <= 0 or reported <= 0:
            return False
        group = _KIND_GROUPS.get(kind, kind)
        learned = self.rejected if rejection else self.ratios
        with self._lock:
            self.reports += 1
            grew = reported / ours > learned.get(group, 0.0)
            if grew:
                learned[group] = reported / ours
            return grew and not rejection

    def seed(self, ratios: Mapping[str, float]) -> None:
        """Start from ratios learned before (kept in the journal): a restored job packs as the failed one did."""
        with self._lock:
            for kind, ratio in ratios.items():
                group = _KIND_GROUPS.get(kind, kind)  # (a journal of an older release may name a kind apart)
                if ratio > 0:
                    self.ratios[group] = max(self.ratios.get(group, 0.0), ratio)


# --- counting and budgets ---------------------------------------------------------------------------------


class TokenCounter:
    """Counts text with one tokenizer, cached by digest (each unit and summary is tokenized once)."""

    def __init__(self, tokenizer: Tokenizer | None = None, calibration: Calibration | None = None,
                 cache_size: int = 100_000) -> None:
        self.tokenizer: Tokenizer = tokenizer or EstimateTokenizer()
        self.calibration = calibration or Calibration(initial=1.0)
        self._cache: OrderedDict[bytes, int] = OrderedDict()  # by digest; the least recently used leaves first
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.unreachable = 0  # times a remote tokenizer could not count a text
        # after a failure the estimate counts for a while (one waiting request per text would stall the job);
        # a text counted so keeps that count while cached, so one job's packing of it never changes
        self.unreachable_pause_s = 30.0
        self._unreachable_until = 0.0

    @property
    def exact(self) -> bool:
        return self.tokenizer.exact

    @property
    def scale(self) -> float:
        """Factor from raw counts to the provider's tokens, the largest of any kind (1 with no reports)."""
        return self.calibration.scale

    def scale_for(self, kind: str) -> float:
        """Factor from raw counts to the provider's tokens for requests of `kind` (plan, batch, merge...)."""
        return self.calibration.scale_for(kind)

    def raw(self, text: str) -> int:
        key = xxhash.xxh3_64_digest(text.encode("utf-8", errors="surrogatepass"))
        cached = self._cache.get(key)  # (packing asks for the same texts again and again: no lock on a hit)
        if cached is not None:
            try:  # least recently used leaves first: a text in use keeps its count (see unreachable_pause_s)
                self._cache.move_to_end(key)
            except KeyError:  # (another thread just let it go)
                pass
            return cached
        if time.monotonic() < self._unreachable_until:
            value = estimate_tokens(text)
        else:
            try:
                value = self.tokenizer.count(text)
            except TokenizerUnreachable as exc:
                self.unreachable += 1
                self._unreachable_until = time.monotonic() + self.unreachable_pause_s
                log.warning("tokenizer unreachable (%d times so far), counting with the estimate for %.0f s: %s",
                            self.unreachable, self.unreachable_pause_s, exc)
                value = estimate_tokens(text)  # an upper bound of the exact count, kept like one
        with self._lock:
            self._cache[key] = value
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return value

    def scaled(self, raw: int, scale: float | None = None) -> int:
        """A raw count as the provider counts it, rounded up (`scale` None: the most conservative one)."""
        return math.ceil(raw * (self.scale if scale is None else scale))

    def tokens(self, text: str, scale: float | None = None) -> int:
        return self.scaled(self.raw(text), scale)

    def line(self, text: str, scale: float | None = None) -> int:
        """Tokens of `text` and the line break after it, scaled together: a calibrated line break is a
        fraction of a token (rounding each line and its break up apart cost a few % of every request)."""
        return self.scaled(self.raw(text) + self.raw("\n"), scale)

    def raw_request(self, messages: Iterable[Mapping[str, Any]]) -> int:
        total = self.tokenizer.per_request
        for message in messages:
            total += self.tokenizer.per_message + self.raw(str(message.get("role", ""))) + self.raw(
                str(message.get("content") or ""))
        return total

    def request(self, messages: Iterable[Mapping[str, Any]], scale: float | None = None) -> int:
        return self.scaled(self.raw_request(messages), scale)

    def observe(self, messages: Iterable[Mapping[str, Any]], reported_prompt_tokens: int, kind: str = "", *,
                rejection: bool = False) -> bool:
        """Learn from the provider's usage report (and, `rejection`, from its count in a length rejection)."""
        return self.calibration.observe(self.raw_request(messages), reported_prompt_tokens, kind,
                                        rejection=rejection)


def make_calibration(tokenizer: Tokenizer) -> Calibration:
    """Estimates start at their upper bound; exact tokenizers at 1 with a small margin for template drift."""
    if tokenizer.exact:
        return Calibration(initial=1.0, margin=0.0, floor=1.0, unseen_margin=0.0)
    return Calibration(initial=1.0, margin=0.05, floor=0.1)


def reserve_tokens(context_window: int) -> int:
    """Head room left free in every packed request: joins of separately counted pieces can merge or split."""
    return max(8, context_window // 100)


@dataclass
class Budget:
    """prompt + max_tokens never above context_window, measured with one counter."""

    context_window: int
    max_output_tokens: int
    counter: TokenCounter = field(default_factory=TokenCounter)

    @property
    def reserve(self) -> int:
        return reserve_tokens(self.context_window)

    def prompt_room(self, max_tokens: int | None = None) -> int:
        """Prompt tokens a packed request may carry (by the counter's current scale)."""
        out = self.max_output_tokens if max_tokens is None else max_tokens
        return self.context_window - out - self.reserve

    def check(self, messages: list[dict[str, Any]], max_tokens: int | None = None,
              scale: float | None = None) -> int:
        """Raise if a request could exceed the window; returns its prompt count."""
        count = self.counter.request(messages, scale)
        out = self.max_output_tokens if max_tokens is None else max_tokens
        if count + out > self.context_window:
            raise RequestTooLarge(
                f"request of ~{count} prompt tokens + {out} output tokens exceeds the context window "
                f"of {self.context_window}"
            )
        return count


class RequestTooLarge(ValueError):
    """A request that could exceed the context window: a bug upstream, never sent."""


def split_text(text: str, max_tokens: int, count: Callable[[str], int] = estimate_tokens) -> list[str]:
    """Split `text` into consecutive parts of at most `max_tokens` (by `count`); parts join back to `text`.

    Cuts prefer paragraph, then line, then sentence, then word boundaries; a word longer than the budget is
    cut between characters. Deterministic: the same text, budget and count give the same parts.
    """
    if max_tokens < 8:
        raise ValueError("max_tokens must be at least 8")
    if count(text) <= max_tokens:
        return [text]
    # the estimate never packs more than 4 characters a token; a real tokenizer may pack long runs
    span = 4 * max_tokens + 4 if count is estimate_tokens else None
    parts: list[str] = []
    rest = text
    while rest:
        if count(rest) <= max_tokens:
            parts.append(rest)
            break
        cut = _best_cut(rest, max_tokens, count, span)
        parts.append(rest[:cut])
        rest = rest[cut:]
    return parts


def _longest_prefix(text: str, max_tokens: int, count: Callable[[str], int], span: int | None) -> int:
    """Largest n with count(text[:n]) <= max_tokens (counts grow with n)."""
    low, high = 1, min(len(text), span) if span else len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if count(text[:mid]) <= max_tokens:
            low = mid
        else:
            high = mid - 1
    return low


def _best_cut(text: str, max_tokens: int, count: Callable[[str], int], span: int | None) -> int:
    limit = _longest_prefix(text, max_tokens, count, span)
    window = text[:limit]
    for separator in ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " "):
        position = window.rfind(separator)
        if position > limit // 3:
            return position + len(separator)
    return limit
