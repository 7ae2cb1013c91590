"""A conservative token estimate that needs no tokenizer: an upper bound for common byte-level BPE.

Digits and punctuation count one token each, non-ASCII one token per UTF-8 byte, dictionary-like words a
token per three letters, other letter runs four tokens per five letters. It overcounts English about 3x, so
`TokenCounter` scales it by a `Calibration` learned from the provider's `usage.prompt_tokens`; until a
response arrives the scale is 1 (the upper bound).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

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
