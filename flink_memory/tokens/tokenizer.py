"""What a `TokenCounter` counts with: the `Tokenizer` protocol and the estimate that implements it offline.

Exact tokenizers (a server's, a model file's) implement the same protocol in `flink_memory.llm.tokenizers`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from flink_memory.tokens.estimate import MESSAGE_OVERHEAD, REQUEST_OVERHEAD, estimate_tokens


class Tokenizer(Protocol):
    """Counts the tokens of a text as one model does, and the chat template's tokens around messages."""

    name: str
    exact: bool
    # template tokens per message (besides role and content) and per request (reply priming, BOS)
    per_message: int
    per_request: int

    def count(self, text: str) -> int: ...


class TokenizerUnreachable(RuntimeError):
    """A remote tokenizer did not answer (the server restarts, the network drops): texts are counted with the
    estimate, an upper bound, until it is asked again (TokenCounter.unreachable_pause_s)."""


@dataclass
class EstimateTokenizer:
    """The offline upper bound (`estimate_tokens`), scaled by calibration to the provider's count."""

    name: str = "estimate"
    exact: bool = False
    per_message: int = MESSAGE_OVERHEAD
    per_request: int = REQUEST_OVERHEAD

    def count(self, text: str) -> int:
        return estimate_tokens(text)
