"""The pipeline as data: its keyed stages in order, each with its core, operator, state migration and channels.

The Flink wiring (flink_memory.flink.pipeline), its sinks, the in-memory runner (flink_memory.local), the check
of a drill's stage (`job.inject_failure`) and the driver (given each stage's migration) all read `STAGES`:
adding a stage is one entry here and its core. A stage takes the messages of the one before (the first: parsed
input records, keyed by agent; flink_memory.stages.messages) and sends its messages to the next (the last:
summary nodes out of the job); besides these, it emits typed messages on the side channels its spec names
(flink_memory.stages.channels: dead letters, manifests, the memory log), which the job unions across the stages
that name them (`CHANNELS`) and writes to one output each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flink_memory import budgets, migrations
from flink_memory.config import Config, ConfigError
from flink_memory.stages.batcher import BatcherCore
from flink_memory.stages.channels import DEAD_LETTERS, MANIFESTS, MEMORY_LOG, Channel
from flink_memory.stages.drills import CALL_DRILL
from flink_memory.stages.merger import MergerCore
from flink_memory.stages.planner import PlannerCore
from flink_memory.stages.protocol import CoreFactory
from flink_memory.state import Migration

# The operator that reads the input, before the keyed stages: its Flink-counted numRecordsIn is the records read
PARSE_OPERATOR = "parse-validate"


@dataclass(frozen=True)
class StageSpec:
    """One keyed stage. `name` is its name in logs, metrics, dead-letter reasons and `job.inject_failure`;
    `operator` its Flink operator's name; `uid` its operator uid, part of the savepoint contract (never changed
    without a migration note; thread mode adds a suffix, see `uid_for`)."""

    name: str
    operator: str
    uid: str
    core: CoreFactory
    migration: Migration | None = None  # how state of an older layout (release 0.1.0) becomes the current one
    channels: tuple[Channel[Any], ...] = (DEAD_LETTERS,)  # the side channels it emits on (stages.channels)
    rebased: bool = False  # a restore's Rebase messages (the agents the store holds) enter the job here

    def uid_for(self, execution_mode: str) -> str:
        """PyFlink keeps keyed state in another layout in thread mode than in process mode, so a checkpoint
        restores only in the mode that wrote it; distinct uids make a restore in the other mode fail loudly
        (Flink refuses unclaimed state) instead of starting with empty state."""
        return self.uid if execution_mode == "process" else f"{self.uid}-thread"


STAGES: tuple[StageSpec, ...] = (
    StageSpec("planner", "chunk-planner", "flink-memory-chunk-planner", PlannerCore, migrations.PLANNER,
              channels=(MANIFESTS, DEAD_LETTERS)),
    StageSpec("batcher", "batch-summaries", "flink-memory-batcher", BatcherCore, migrations.BATCHER,
              channels=(DEAD_LETTERS, MEMORY_LOG), rebased=True),  # (the batcher tells the merger)
    StageSpec("merger", "hierarchical-merger", "flink-memory-merger", MergerCore, migrations.MERGER,
              channels=(DEAD_LETTERS, MEMORY_LOG)),
)
# Every channel of the job, once, in the order the stages name them: the order its outputs are wired in. Each
# file sink has a uid of its own (Channel.sink_uid), so the order does not move a savepoint's state. The parser
# emits dead letters too.
CHANNELS: tuple[Channel[Any], ...] = tuple(dict.fromkeys([*(c for s in STAGES for c in s.channels), DEAD_LETTERS]))


def stage_named(name: str) -> StageSpec:
    for spec in STAGES:
        if spec.name == name:
            return spec
    raise KeyError(f"no stage {name!r} (stages: {', '.join(s.name for s in STAGES)})")


def check(config: Config) -> None:
    """What a job of this topology refuses before it is built (ConfigError): a drill that names no stage, and a
    window too small for the other settings (flink_memory.budgets)."""
    check_drill(config)
    budgets.check(config)


def check_drill(config: Config) -> None:
    """`job.inject_failure` names a stage of STAGES (or the calls); ConfigError otherwise."""
    drill = config.job.inject_failure
    if drill is None:
        return
    if drill.target == "record":
        if drill.record is None:
            raise ConfigError(f"job.inject_failure: {drill.model_dump()!r}: a record drill is record:agent/record-id")
        return
    known = [s.name for s in STAGES]
    if drill.target not in known and not (drill.target == CALL_DRILL and drill.after is None):
        raise ConfigError(f"job.inject_failure: {drill.target!r} is no stage of the job ({', '.join(known)}, or "
                          f"{CALL_DRILL}:n:marker for the n-th fresh LLM result)")
