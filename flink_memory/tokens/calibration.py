"""How the provider's token counts relate to ours, learned per request kind from its usage reports."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from flink_memory.tokens.tokenizer import Tokenizer

# A part request carries slices of item text, as a batch request does; a global is built like a merge (a
# frame, then dated summaries): once each kind of a pair has reported, it packs by the larger of the two.
_KIND_GROUPS = {"part": "batch", "global": "merge"}


@dataclass
class Calibration:
    """Learns how the provider's count relates to ours from `usage.prompt_tokens`, per request kind.

    Our estimate errs by a different factor on each kind of text: a real BPE vocabulary reads long prose
    words as one token each (a quarter of our count) but digits, dates and punctuation one for one (three
    quarters and more), so no kind's ratio bounds another's. Each kind therefore keeps the largest ratio seen
    (provider count / our count) for its own requests, and a kind with no report of its own is packed at
    `initial`, the estimate's upper bound (1), whatever other kinds have taught; a kind that has reported
    packs by the largest ratio of its pair (part and batch, global and merge). The scale is that ratio plus
    `margin`, rounded up to 1/64 so it changes in few steps, never below `floor`. A provider that rejects a
    request for its length raises its kind's ratio to the count it reported, for this process only
    (`rejected`: such a count may include the output, so it is never kept for later jobs).
    """

    initial: float = 1.0
    margin: float = 0.05
    floor: float = 0.1
    ratios: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, float] = field(default_factory=dict)
    reports: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def _own(self, kind: str) -> float | None:
        """The ratio a kind that has reported packs by (None: no report of its own yet)."""
        if kind not in self.ratios and kind not in self.rejected:
            return None
        group = _KIND_GROUPS.get(kind, kind)
        return max(ratio for learned in (self.ratios, self.rejected) for k, ratio in list(learned.items())
                   if _KIND_GROUPS.get(k, k) == group)

    def scale_for(self, kind: str | None = None) -> float:
        """The factor from raw counts to the provider's tokens for requests of `kind` (None: of any kind)."""
        if kind is None:
            return max([self.initial, *(self.scale_for(k) for k in {*self.ratios, *self.rejected})])
        ratio = self._own(kind)
        if ratio is None:  # no report of its own: the upper bound (another kind's text may count tighter)
            return self.initial
        return self.scale_of(ratio)

    def scale_of(self, ratio: float) -> float:
        """The scale a ratio (provider count / our count) packs at: with the margin, in steps of 1/64."""
        return max(self.floor, math.ceil(ratio * (1 + self.margin) * 64) / 64)

    @property
    def scale(self) -> float:
        """The most conservative scale: the upper bound, or a kind's learned scale where that is larger."""
        return self.scale_for(None)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.ratios)

    def observe(self, ours: int, reported: int, kind: str = "", *, rejection: bool = False) -> bool:
        """Learn from one report; True when a kept ratio grew (worth keeping for the next start)."""
        if ours <= 0 or reported <= 0:
            return False
        learned = self.rejected if rejection else self.ratios
        with self._lock:
            self.reports += 1
            grew = reported / ours > learned.get(kind, 0.0)
            if grew:
                learned[kind] = reported / ours
            return grew and not rejection


def make_calibration(tokenizer: Tokenizer) -> Calibration:
    """Estimates start at their upper bound; exact tokenizers at 1 with a small margin for template drift."""
    if tokenizer.exact:
        return Calibration(initial=1.0, margin=0.0, floor=1.0)
    return Calibration(initial=1.0, margin=0.05, floor=0.1)
