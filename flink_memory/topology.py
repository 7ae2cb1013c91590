"""The pipeline as data: its keyed stages in order, each with its core, operator, state migration and channels.

The Flink wiring (flink_memory.flink.pipeline), the in-memory runner (flink_memory.local), the check of a
drill's stage (`job.inject_failure`) and the driver (given each stage's migration) all read `STAGES`: adding a
stage is one entry here and its core. A stage takes the messages of the one before (the first: parsed input
records, keyed by agent; flink_memory.stages.messages) and sends its messages to the next (the last: summary
nodes out of the job); besides these and dead letters, a stage may emit on side channels (`CHANNELS`), which
the job unions across the stages that declare them.
"""

from __future__ import annotations

from dataclasses import dataclass

from flink_memory import migrations
from flink_memory.config import Config, ConfigError
from flink_memory.stages.batcher import BatcherCore
from flink_memory.stages.calls import MANIFESTS, MEMORY_LOG
from flink_memory.stages.drills import CALL_DRILL
from flink_memory.stages.merger import MergerCore
from flink_memory.stages.planner import PlannerCore
from flink_memory.stages.protocol import CoreFactory
from flink_memory.state import Migration

# What the side channels carry, by name: each is an output of the job
CHANNELS = {
    MANIFESTS: "chunk manifests (text-free plans of the conversations cut into units)",
    MEMORY_LOG: "the store's log: every node and unit-row message, numbered per agent and writer",
}
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
    channels: tuple[str, ...] = ()  # the side channels it emits on (CHANNELS)

    def uid_for(self, execution_mode: str) -> str:
        """PyFlink keeps keyed state in another layout in thread mode than in process mode, so a checkpoint
        restores only in the mode that wrote it; distinct uids make a restore in the other mode fail loudly
        (Flink refuses unclaimed state) instead of starting with empty state."""
        return self.uid if execution_mode == "process" else f"{self.uid}-thread"


STAGES: tuple[StageSpec, ...] = (
    StageSpec("planner", "chunk-planner", "flink-memory-chunk-planner", PlannerCore, migrations.PLANNER,
              channels=(MANIFESTS,)),
    StageSpec("batcher", "batch-summaries", "flink-memory-batcher", BatcherCore, migrations.BATCHER,
              channels=(MEMORY_LOG,)),
    StageSpec("merger", "hierarchical-merger", "flink-memory-merger", MergerCore, migrations.MERGER,
              channels=(MEMORY_LOG,)),
)


def stage_named(name: str) -> StageSpec:
    for spec in STAGES:
        if spec.name == name:
            return spec
    raise KeyError(f"no stage {name!r} (stages: {', '.join(s.name for s in STAGES)})")


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
