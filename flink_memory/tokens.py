"""Conservative token estimates and request budgets (no tokenizer download: tiktoken cannot fetch here).

The estimate is meant to be an upper bound for byte-level BPE tokenizers: digits and punctuation count one
token each, non-ASCII characters one token per UTF-8 byte, dictionary-like words one token per three
letters and other letter runs (keys, hashes, base64) four tokens per five letters. It
overcounts English by about 2x, which costs context but never overflows it (tests hold it against the real
tokenizer of the embedded model on English, code, CJK and emoji).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_PIECES = re.compile(r"[A-Za-z]+|[0-9]|[ \t]+|\n+|[\x21-\x7e]|[^\x00-\x7f]|[\x00-\x1f\x7f]")

# Tokens a chat template adds around each message (role markers, separators) and around a request.
MESSAGE_OVERHEAD = 8
REQUEST_OVERHEAD = 16
# Head room kept free in every request on top of the estimate.
FRAME_RESERVE = 32


def estimate_tokens(text: str) -> int:
    """An upper bound on the tokens of `text` for common BPE tokenizers."""
    total = 0
    for piece in _PIECES.findall(text):
        first = piece[0]
        if first.isascii() and first.isalpha():
            total += _letter_run(piece)
        elif first in " \t":
            total += 1 + len(piece) // 4
        elif first == "\n":
            total += len(piece)
        elif first.isascii():
            total += 1
        else:
            total += len(piece.encode("utf-8", errors="surrogatepass"))
    return total


_WORDLIKE = re.compile(r"^[A-Z]?[a-z]+$|^[A-Z]{1,4}$")
_CONSONANTS = re.compile(r"[^aeiouyAEIOUY]{5,}")


def _letter_run(piece: str) -> int:
    """Dictionary-like words pack about 3+ letters a token; random strings (keys, hashes) barely 1.3."""
    n = len(piece)
    if n <= 2:
        return n
    if n <= 15 and _WORDLIKE.match(piece) and not _CONSONANTS.search(piece):
        return max(2, -(-n // 3))
    return -(-n * 4 // 5)


def estimate_messages(messages: Iterable[Mapping[str, Any]]) -> int:
    """Estimate for a chat request's prompt (role markers included)."""
    total = REQUEST_OVERHEAD
    for message in messages:
        total += MESSAGE_OVERHEAD + estimate_tokens(str(message.get("role", ""))) + estimate_tokens(
            str(message.get("content") or "")
        )
    return total


@dataclass(frozen=True)
class Budget:
    """prompt + max_output_tokens never above context_window."""

    context_window: int
    max_output_tokens: int

    @property
    def input_tokens(self) -> int:
        """Prompt tokens one request may carry."""
        return self.context_window - self.max_output_tokens - FRAME_RESERVE

    def fits(self, prompt_tokens: int) -> bool:
        return prompt_tokens <= self.input_tokens

    def check(self, messages: list[dict[str, Any]], max_tokens: int | None = None) -> int:
        """Raise if a request could exceed the window; returns the prompt estimate."""
        estimate = estimate_messages(messages)
        out = self.max_output_tokens if max_tokens is None else max_tokens
        if estimate + out + FRAME_RESERVE > self.context_window:
            raise RequestTooLarge(
                f"request of ~{estimate} prompt tokens + {out} output tokens exceeds the context window "
                f"of {self.context_window}"
            )
        return estimate


class RequestTooLarge(ValueError):
    """A request that could exceed the context window: a bug upstream, never sent."""


def split_text(text: str, max_tokens: int) -> list[str]:
    """Split `text` into consecutive parts of at most `max_tokens` (estimated); parts join back to `text`.

    Cuts prefer paragraph, then line, then sentence, then word boundaries; a word longer than the budget is
    cut between characters. Deterministic: the same text and budget give the same parts.
    """
    if max_tokens < 8:
        raise ValueError("max_tokens must be at least 8")
    if estimate_tokens(text) <= max_tokens:
        return [text]
    parts: list[str] = []
    rest = text
    while rest:
        if estimate_tokens(rest) <= max_tokens:
            parts.append(rest)
            break
        cut = _best_cut(rest, max_tokens)
        parts.append(rest[:cut])
        rest = rest[cut:]
    return parts


def _longest_prefix(text: str, max_tokens: int) -> int:
    """Largest n with estimate(text[:n]) <= max_tokens (the estimate grows with n)."""
    # no piece packs more than 4 characters a token, so the answer lies within 4 * max_tokens + 4
    low, high = 1, min(len(text), 4 * max_tokens + 4)
    while low < high:
        mid = (low + high + 1) // 2
        if estimate_tokens(text[:mid]) <= max_tokens:
            low = mid
        else:
            high = mid - 1
    return low


def _best_cut(text: str, max_tokens: int) -> int:
    limit = _longest_prefix(text, max_tokens)
    window = text[:limit]
    for separator in ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " "):
        position = window.rfind(separator)
        if position > limit // 3:
            return position + len(separator)
    return limit
