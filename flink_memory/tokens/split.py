"""Deterministic splitting of a text too long for one request into parts of a token budget."""

from __future__ import annotations

from collections.abc import Callable

from flink_memory.tokens.estimate import estimate_tokens


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
