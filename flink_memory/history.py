"""Which history a job writes, and what its output tells an applier (docs/recovery.md).

A job started without a restore mints a history; every submission (a fresh start or a restore from any
savepoint or retained checkpoint) mints a branch. Both are time-ordered ids, so a later submission's branch
sorts after an earlier one's: the store follows the newest branch of its history (flink_memory.memory_log.Lineage).
The job records in its output a small descriptor, `flink-memory.json`: the history, its branches, the store's
URL without secrets, the embedding model and the log's format, so `flink-memory apply --output DIR` needs
nothing else, and a job that would write into an output or a store another history owns is refused at start.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from flink_memory.memory_log import BRANCH_ID, Lineage

if TYPE_CHECKING:
    from flink_memory.config import Config

log = logging.getLogger(__name__)

DESCRIPTOR = "flink-memory.json"  # in the job's output directory
LOG_FORMAT = 2  # 2: entries carry their history and branch, and a branch opens with its base and snapshot
UNNAMED = "unnamed: written before histories were recorded"  # the owner of a log or store of an older release


def new_id() -> str:
    """A time-ordered id: nanoseconds since the epoch (16 hex digits until 2554), then 4 random hex digits."""
    return f"{time.time_ns():016x}{secrets.token_hex(2)}"


class Branch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    branch: str = Field(pattern=BRANCH_ID)
    started: str  # when it was submitted (UTC, RFC 3339)
    restored_from: str | None = None  # the savepoint or checkpoint it was restored from (None: a fresh start)


class Descriptor(BaseModel):
    """`<output>/flink-memory.json`: what an applier needs to follow the job's memory log."""

    model_config = ConfigDict(extra="forbid")

    log_format: int = LOG_FORMAT
    history: str = Field(pattern=BRANCH_ID)
    branches: list[Branch] = Field(default_factory=list)
    store: str | None = None  # the store's URL without its password (None: the store is off)
    embeddings: str = "none"  # provider:model of the vectors ("none": no vectors)

    @property
    def lineage(self) -> Lineage:
        return Lineage(history=self.history, branch=self.branches[-1].branch if self.branches else "")


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_descriptor(text: str, where: str) -> Descriptor:
    try:
        return Descriptor.model_validate(json.loads(text))
    except ValueError as exc:
        raise HistoryError(f"{where} is not a flink-memory output descriptor: {str(exc).splitlines()[0]}") from None


class HistoryError(RuntimeError):
    """A job or an applier would mix histories, or follow another store than the job's: the message says what
    to do."""


def _fs(output: str) -> tuple[Any, str]:
    """The filesystem of `output` and the path in it: the applier's (store.log_location), so that the descriptor
    is read wherever the log is."""
    from flink_memory.store.log_location import resolve

    return resolve(output)


def _join(root: str, name: str) -> str:
    return f"{root}/{name}" if root else name


def read_descriptor(output: str) -> Descriptor | None:
    """The descriptor of the job writing to `output` (a path or URL); None: none there."""
    from pyarrow import fs as pafs

    filesystem, root = _fs(output)
    path = _join(root, DESCRIPTOR)
    if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with filesystem.open_input_stream(path) as stream:
        text = stream.read().decode("utf-8")
    return parse_descriptor(text, f"{output.rstrip('/')}/{DESCRIPTOR}")


def write_descriptor(output: str, descriptor: Descriptor) -> None:
    """Write it whole or not at all (a reader never sees half of it)."""
    filesystem, root = _fs(output)
    if root:
        filesystem.create_dir(root, recursive=True)
    path, part = _join(root, DESCRIPTOR), _join(root, f".{DESCRIPTOR}.part")
    with filesystem.open_output_stream(part) as stream:
        stream.write(descriptor.model_dump_json(indent=2).encode("utf-8"))
    filesystem.move(part, path)


def _has_log(output: str) -> bool:
    """Whether `output` holds a memory log already (committed files of memory/)."""
    from pyarrow import fs as pafs

    filesystem, root = _fs(output)
    infos = filesystem.get_file_info(pafs.FileSelector(_join(root, "memory"), allow_not_found=True))
    return any(i.type == pafs.FileType.File and not i.base_name.startswith(".") for i in infos)


def embeddings_name(provider: str, model: str | None) -> str:
    return provider if provider == "none" else f"{provider}:{model or 'default'}"


def claim(output: str, store: str | None, embeddings: str, restore: str | None,
          store_history: str | None = None) -> Descriptor:
    """The history a job submitted now writes, recorded in its output: a fresh start mints one, a restore keeps
    the output's (or the store's: `store_history`, None when there is no store or it holds no history yet) and
    adds a branch. Refused (HistoryError, saying what to do) when a fresh start would write into an output or
    a store that another history owns, or a restore into an output and a store of two histories."""
    from flink_memory.databases import redact_url
    from flink_memory.store.log_location import LocationError

    try:
        found = read_descriptor(output)
        reachable = True
    except (ImportError, OSError, ValueError, LocationError) as exc:  # (a filesystem this client cannot reach)
        log.warning("cannot read %s here (%s): its descriptor is neither checked nor written; the store's "
                    "history still is", output, exc)
        found, reachable = None, False
    shown = redact_url(store) if store else None
    if restore is None:
        owner = found.history if found is not None else store_history
        in_output = found is not None or (reachable and store_history is None and _has_log(output))
        owner = found.history if found is not None else store_history or (UNNAMED if in_output else None)
        if owner:
            where = f"the output {output}" if in_output else f"the store {shown}"
            raise HistoryError(
                f"{where} holds the memory of another job (history {owner}). A new job there would mix two "
                "memories of the same agent ids. Restore that job instead (--restore its savepoint or retained "
                "checkpoint), or give this one a new output directory and a new store (store.url); to start over, "
                "delete the old output and store first.")
        history = new_id()
    else:
        recorded = store_history if store_history != UNNAMED else None
        if found is not None and recorded and found.history != recorded:
            raise HistoryError(
                f"the output {output} holds history {found.history} and the store {shown} history "
                f"{store_history}: restore into this output with its own store, or into a new output and store.")
        history = found.history if found is not None else recorded or new_id()
    branches = found.branches if found is not None and found.history == history else []
    descriptor = Descriptor(history=history, store=shown, embeddings=embeddings,
                            branches=[*branches, Branch(branch=new_id(), started=now_utc(), restored_from=restore)])
    if reachable:
        write_descriptor(output, descriptor)
    return descriptor


def start(config: Config, output: str, restore: str | None) -> Config:
    """`config` with the history and branch a job submitted now writes (job.history, job.branch), claimed in
    its output and its store (see `claim`). A store out of reach is left to the applier, which refuses the
    agents of another history it meets (a warning says so)."""
    from flink_memory.store import StoreError, open_store

    if config.job.branch:  # (given: a test, or a wrapper that claimed it already)
        return config
    url = config.store.location(output)
    store_history = None
    if url is not None:
        try:
            with open_store(url, create=True) as store:
                store_history = store.history()
                if store_history is None and store.agents():  # (a store written before histories)
                    store_history = UNNAMED
        except StoreError as exc:
            log.warning("could not read the history of the store %s (%s): the applier will refuse the agents of "
                        "another history", url, exc)
            url = None
    descriptor = claim(output, config.store.location(output), embeddings_name(config.embeddings.provider,
                       config.embeddings.model), restore, store_history)
    if url is not None and store_history in (None, UNNAMED):
        with open_store(url) as store:
            store.claim_history(descriptor.history)
    lineage = descriptor.lineage
    return config.model_copy(update={"job": config.job.model_copy(update={"history": lineage.history,
                                                                          "branch": lineage.branch})})


def held_agents(config: Config, output: str) -> list[str]:
    """The agents the job's store holds ([] when it is off or out of reach): a restored job opens its branch
    for each at once (stages.messages.Rebase), so none stays as an abandoned branch left it until its next
    input."""
    from flink_memory.store import StoreError, open_store

    url = config.store.location(output)
    if url is None:
        return []
    try:
        with open_store(url) as store:
            return store.agents()
    except StoreError as exc:
        log.warning("could not list the agents of the store %s (%s): each follows the restored job at its next "
                    "input", url, exc)
        return []
