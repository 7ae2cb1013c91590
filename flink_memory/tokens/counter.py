"""`TokenCounter`: counts text with one tokenizer, scaled by a calibration to the provider's count."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import xxhash

from flink_memory.tokens.calibration import Calibration
from flink_memory.tokens.estimate import estimate_tokens
from flink_memory.tokens.tokenizer import EstimateTokenizer, Tokenizer, TokenizerUnreachable

log = logging.getLogger(__name__)


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
