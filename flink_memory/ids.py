"""Ids of what the memory holds, spelled, formatted and parsed in one place: a summary node's and a memory unit's.

Node ids: a batch node is `batch-000007` (its batch number), a merge node `merge-L2-000003` (its level, then its
number on that level), a global node `global-v000012` (its version). A batch or merge made again after a change is a
revision of the same base id, `batch-000007-r1`, `merge-L2-000003-r2`; a global is never revised (each new
global is a new version). Numbers are zero-padded to six digits and grow past them. Ids live in checkpoints,
changelogs and stores, so these formats never change: every id ever written parses back to the same text.

Unit ids: a memory unit is named after its input record (`id`), or `<id>#<n>` for part n of a record the
job cut into parts (a conversation's chunks, a long item's pieces). A record id therefore never ends in `#` and
digits (records.py refuses it), so every unit id names exactly one record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

NodeKind = Literal["batch", "merge", "global"]

_ID = re.compile(r"batch-(?P<batch>\d{6,})"
                 r"|merge-L(?P<level>\d+)-(?P<merge>\d{6,})"
                 r"|global-v(?P<version>\d{6,})")
_REVISION = re.compile(r"(?P<base>.+?)-r(?P<revision>\d+)")


@dataclass(frozen=True, slots=True)
class NodeId:
    """A parsed node id; `str()` formats it. `number` is the batch number, the merge's number on its level, or
    the global's version; `level` is a merge's level (1 for a batch, None for a global, whose level is not in
    its id); `revision` 0 is the original node."""

    kind: NodeKind
    number: int
    level: int | None = 1
    revision: int = 0

    @classmethod
    def batch(cls, number: int, revision: int = 0) -> NodeId:
        return cls("batch", number, 1, revision)

    @classmethod
    def merge(cls, level: int, number: int, revision: int = 0) -> NodeId:
        return cls("merge", number, level, revision)

    @classmethod
    def global_summary(cls, version: int) -> NodeId:
        return cls("global", version, None)

    @classmethod
    def parse(cls, text: str) -> NodeId:
        """The id `text` spells; ValueError for text that is no node id (or not as this module formats it)."""
        base, revision = text, 0
        if (revised := _REVISION.fullmatch(text)) is not None and not text.startswith("global-"):
            base, revision = revised["base"], int(revised["revision"])
        match = _ID.fullmatch(base)
        if match is None:
            raise ValueError(f"not a node id: {text!r}")
        if match["batch"] is not None:
            node = cls.batch(int(match["batch"]), revision)
        elif match["merge"] is not None:
            node = cls.merge(int(match["level"]), int(match["merge"]), revision)
        else:
            node = cls.global_summary(int(match["version"]))
        if str(node) != text:  # (a zero-padded revision or level, say: it would not format back the same)
            raise ValueError(f"not a node id: {text!r}")
        return node

    def __str__(self) -> str:
        if self.kind == "global":
            return f"global-v{self.number:06d}"
        if self.kind == "batch":
            base = f"batch-{self.number:06d}"
        else:
            base = f"merge-L{self.level}-{self.number:06d}"
        return f"{base}-r{self.revision}" if self.revision else base

    @property
    def base(self) -> NodeId:
        """The original node this one is a revision of (itself when it is the original)."""
        return replace(self, revision=0)

    def revised(self, revision: int) -> NodeId:
        """Revision `revision` of the same node (0: the original)."""
        if self.kind == "global" and revision:
            raise ValueError(f"a global is not revised: {self}")
        return replace(self, revision=revision)

    def next_revision(self) -> NodeId:
        """The revision that replaces this one when its node is made again."""
        return self.revised(self.revision + 1)


_PART = re.compile(r"(?P<record>.*)#(?P<part>[0-9]+)")
# A record id as JSON Schema's pattern (the service's OpenAPI document; records.py decides): not blank, no control
# characters, not ending in '#' and digits
RECORD_ID_PATTERN = (r"^(?:[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f0-9]|[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f#0-9][0-9]+"
                     r"|[0-9]+)$")


@dataclass(frozen=True, slots=True)
class UnitId:
    """A parsed unit id; `str()` formats it. `part` is None for the unit that is a whole record."""

    record: str
    part: int | None = None

    @classmethod
    def parse(cls, text: str) -> UnitId:
        match = _PART.fullmatch(text)
        return cls(match["record"], int(match["part"])) if match is not None else cls(text)

    @staticmethod
    def names_a_part(record_id: str) -> bool:
        """True for an id that would name part of another record (it ends in '#' and digits)."""
        return _PART.fullmatch(record_id) is not None

    def __str__(self) -> str:
        return self.record if self.part is None else f"{self.record}#{self.part}"
