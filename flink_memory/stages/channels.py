"""The side channels a stage emits on, besides the messages it sends to the next stage: each a name and the
type of message it carries, written to text at one boundary and read back with the same model.

A core emits typed messages (`Effects.emit(MANIFESTS, manifest)`); the in-memory runner keeps them as they are;
the Flink shell turns each into one line (`Channel.dump`) for its side output, and whatever reads that output
back (the store's provisional writer) parses it with `Channel.load`. Which stage emits on which channel is
flink_memory.topology (`StageSpec.channels`); the Flink wiring, its file sinks and the in-memory runner derive
from there, so a new channel is one `Channel` here, named in its stage's spec, plus the code that emits on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pydantic import BaseModel

from flink_memory.chunking.manifest import manifest_json
from flink_memory.memory_log import LogEntry
from flink_memory.records import ChunkManifest, DeadLetter

M = TypeVar("M", bound=BaseModel)


def _model_json(message: BaseModel) -> str:
    return message.model_dump_json()


@dataclass(frozen=True)
class Channel(Generic[M]):
    """One side channel: `name` (its Flink side output's tag), the `model` of its messages, the `output` it is
    written to (`<output>/<output>/`, `MemoryStreams.channel`, the file sink's uid) and what it carries."""

    name: str
    model: type[M]
    output: str
    about: str
    # the message as one line (its model's JSON, unless the channel's contract says otherwise)
    dumps: Callable[[M], str] = field(default=_model_json, compare=False)

    def dump(self, message: M) -> str:
        """The one line a message becomes where a channel leaves Python (a Flink side output, a file)."""
        return self.dumps(message)

    def load(self, line: str) -> M:
        """A line of this channel back to its message (the model that wrote it reads it)."""
        return self.model.model_validate_json(line)

    @property
    def sink_uid(self) -> str:
        """The uid of the channel's file sink (part of the savepoint contract: it follows `output`)."""
        return f"flink-memory-sink-{self.output}"


# Every stage (and the parser before them) may emit dead letters; the others are named by the stages' specs.
DEAD_LETTERS: Channel[DeadLetter] = Channel("dead-letters", DeadLetter, "dead-letters",
                                            "rejected input and errors of ours, each with its reason")
MANIFESTS: Channel[ChunkManifest] = Channel("manifests", ChunkManifest, "manifests",
                                            "chunk manifests (text-free plans of the conversations cut into units)",
                                            dumps=manifest_json)  # (canonical JSON, as the manifests' contract)
MEMORY_LOG: Channel[LogEntry] = Channel("memory-log", LogEntry, "memory",
                                        "the store's log: every node and unit-row message, numbered per agent and "
                                        "writer", dumps=LogEntry.line)
