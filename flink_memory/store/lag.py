"""How far the store is behind the job's committed memory log, seen from outside: the applier's lag (commits
written, commits applied, the age of the oldest unapplied one), which the applier records in the store for
`flink-memory serve`'s health answer, and the job's own watch on whether anyone takes its commits."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pydantic import BaseModel


class Lag(BaseModel):
    """The applier's lag after its last poll (a commit is one committed part file of the log)."""

    log: str  # the log it follows (<output>/memory)
    written: int = 0  # commits the job wrote to the log, applied or not
    applied: int = 0  # of them, applied to the store
    oldest_unapplied_at: float | None = None  # when the oldest unapplied commit was written (epoch s)
    polled_at: float | None = None  # when the applier last looked (epoch s)

    @property
    def unapplied(self) -> int:
        return self.written - self.applied

    def oldest_unapplied_age_s(self, now: float) -> float:
        return max(0.0, now - self.oldest_unapplied_at) if self.oldest_unapplied_at is not None else 0.0


def lag_note(lag: Lag, now: float, warn_after_s: float) -> str | None:
    """What a progress line says when the store is behind: None while no commit has waited `warn_after_s`."""
    age = lag.oldest_unapplied_age_s(now)
    if lag.unapplied <= 0 or age < warn_after_s:
        return None
    return (f"store: {lag.unapplied} of {lag.written} commits not applied, the oldest for {age:.0f} s (no "
            "applier takes them)")


def overdue_message(age_s: float) -> str:
    return (f"no store applier has taken this job's committed memory log for {age_s:.0f} s: the store lags it "
            "(run `flink-memory apply --output OUTPUT --follow` beside the job; store.applier_warn_after_s)")


class CommitWatch:
    """The job's side: the log entries it wrote (by agent and writer, with when), against the positions the
    store has applied. An entry still unapplied `warn_after_s` after it was written means no applier takes
    the job's commits (or one is far behind). Memory stays bounded: per log, one mark per `resolution_s`."""

    def __init__(self, warn_after_s: float, resolution_s: float = 1.0) -> None:
        self.warn_after_s = warn_after_s
        self.resolution_s = resolution_s
        self.marks: dict[tuple[str, str], deque[tuple[int, float]]] = {}

    def wrote(self, agent_id: str, by: str, seq: int, now: float) -> None:
        marks = self.marks.setdefault((agent_id, by), deque())
        if marks and now - marks[-1][1] < self.resolution_s:
            marks[-1] = (max(seq, marks[-1][0]), marks[-1][1])  # (the newest mark keeps its time, takes the seq)
        else:
            marks.append((seq, now))

    def overdue(self, read_position: Callable[[str, str], int], now: float, checks: int = 20) -> float | None:
        """The age (s) of the oldest entry written more than `warn_after_s` ago that the store has not applied,
        or None. `read_position(agent_id, by) -> int` reads the store's position of a log; the oldest marks are
        checked first, at most `checks` reads per call."""
        for _ in range(checks):
            oldest = min(((marks[0][1], key) for key, marks in self.marks.items() if marks), default=None)
            if oldest is None or now - oldest[0] < self.warn_after_s:
                return None
            key = oldest[1]
            at = read_position(*key)
            marks = self.marks[key]
            while marks and marks[0][0] <= at:
                marks.popleft()
            if not marks:
                del self.marks[key]
                continue
            if now - marks[0][1] >= self.warn_after_s:
                return now - marks[0][1]
        return None
