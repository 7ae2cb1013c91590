"""Record contracts: what goes in, what comes out, and the one door between raw lines and records.

Every model here is a public contract (DESIGN.md). `parse_line` never raises: a line is either a valid
record or a `DeadLetter` that keeps the raw line whole together with a readable reason.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from flink_memory.ids import UnitId

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Identifier = Annotated[str, StringConstraints(min_length=1, max_length=512)]


def parse_rfc3339(value: str) -> datetime:
    """Strict RFC 3339 (offset required): a naive or ambiguous time would corrupt chronology."""
    if not _RFC3339.match(value):
        raise ValueError(f"not an RFC 3339 timestamp with offset: {value[:64]!r}")
    text = value.replace("z", "Z").replace("Z", "+00:00").replace("t", "T").replace(" ", "T")
    return datetime.fromisoformat(text).astimezone(timezone.utc)


def format_ts(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Message(BaseModel):
    """One exchange of a conversation. Unknown fields are kept: chunks must stay byte-for-byte the source's."""

    model_config = ConfigDict(extra="allow", frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str

    def source_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class _Timestamped(_Strict):
    ts: datetime | None = None

    @field_validator("ts", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        if value is None or isinstance(value, datetime):
            return value
        if not isinstance(value, str):
            raise ValueError("must be an RFC 3339 string such as 2026-01-31T12:00:00Z")
        return parse_rfc3339(value)

    @field_serializer("ts")
    def _ts_out(self, value: datetime | None) -> str | None:
        return format_ts(value)


class _Keyed(_Timestamped):
    """Every input record names its agent (and all but a forget, a record id): printable, not blank."""

    agent_id: Identifier

    @field_validator("agent_id", "id", check_fields=False)
    @classmethod
    def _no_control_chars(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        if _CONTROL.search(value):
            raise ValueError("must not contain control characters")
        return value

    @field_validator("id", check_fields=False)
    @classmethod
    def _not_a_unit_id(cls, value: str) -> str:
        if UnitId.names_a_part(value):
            raise ValueError(f"must not end in '#' and digits: {value!r} would name a part of another record "
                             "(the units a record is cut into are named <id>#<n>)")
        return value


class _InputBase(_Keyed):
    id: Identifier
    metadata: dict[str, Any] = Field(default_factory=dict)


class MemoryItem(_InputBase):
    """A fact, a note or a document."""

    kind: Literal["item"] = "item"
    text: Annotated[str, StringConstraints(min_length=1)]

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


class Conversation(_InputBase):
    """A role/content conversation; long ones are cut into topic chunks."""

    kind: Literal["conversation"] = "conversation"
    messages: Annotated[list[Message], Field(min_length=1)]


class TrustedConversation(_InputBase):
    """A conversation the sender already chunked: planning is bypassed."""

    kind: Literal["trusted"] = "trusted"
    trusted: Literal[True]
    chunks: Annotated[list[Annotated[list[Message], Field(min_length=1)]], Field(min_length=1)]


class Deletion(_Keyed):
    """`{"agent_id": A, "id": R, "deleted": true}`: retract record R of agent A."""

    kind: Literal["deletion"] = "deletion"
    id: Identifier
    deleted: Literal[True]


class Forget(_Keyed):
    """`{"agent_id": A, "forget": true}`: drop everything of agent A."""

    kind: Literal["forget"] = "forget"
    forget: Literal[True]


Content = MemoryItem | Conversation | TrustedConversation
InputRecord = Content | Deletion | Forget
RECORD_KINDS: dict[str, type[BaseModel]] = {"item": MemoryItem, "conversation": Conversation,
                                            "trusted": TrustedConversation, "deletion": Deletion, "forget": Forget}


def record_from_json(data: dict[str, Any]) -> InputRecord:
    """Rebuild a record that already passed `parse_line` (it carries its `kind`)."""
    return RECORD_KINDS[data["kind"]].model_validate(data)  # type: ignore[return-value]


class DeadLetter(_Strict):
    """A rejected input, kept whole so nothing disappears."""

    raw: str
    raw_base64: str | None = None
    reason: str
    # change: an update or deletion that cannot be applied (unknown id, or sealed: older than
    # memory.editable_for); internal: an error of ours that repeated for this record after a restart
    stage: Literal["parse", "plan", "duplicate", "change", "internal"] = "parse"
    position: str | None = None
    agent_id: str | None = None
    record_id: str | None = None


class MemoryUnit(_Strict):
    """What the planner hands the batcher: an item, or chunk k of an input (`{id}#{k}`)."""

    agent_id: str
    unit_id: str
    source_id: str
    text: str
    ts: str | None = None
    oversized: bool = False


class ManifestChunk(_Strict):
    index: int
    start: int
    end: int
    digest: str
    tokens: int
    oversized: bool = False


class ChunkManifest(_Strict):
    """Text-free record of how one input was chunked; verifiable by its digests."""

    schema_version: int
    agent_id: str
    source_id: str
    input_digest: str
    policy_fingerprint: str
    plan_digest: str
    method: Literal["semantic", "fixed", "fallback", "passthrough", "trusted"]
    boundaries: list[int]
    chunks: list[ManifestChunk]
    reason: str | None = None
    planner_calls: int = 0
    # an update: the input digest of the version this plan replaces, and why it was planned again in full
    replaces_input_digest: str | None = None
    replace_reason: str | None = None
    manifest_digest: str = ""


class SummaryNode(_Strict):
    """One node of an agent's summary tree."""

    agent_id: str
    node_id: str
    kind: Literal["batch", "merge", "global"]
    level: int
    children: list[str]
    text: str
    item_count: int
    first_ts: str | None = None
    last_ts: str | None = None
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    version: int | None = None
    # node ids this node supersedes (a recomputed or retracted node); a node is live while no node replaces it
    replaces: list[str] = Field(default_factory=list)
    # a call behind this text stopped at llm.max_output_tokens (finish_reason "length"): accepted, flagged
    truncated: bool = False

    @model_validator(mode="after")
    def _version_only_on_global(self) -> SummaryNode:
        if (self.kind == "global") != (self.version is not None):
            raise ValueError("version is set on global nodes and only on them")
        return self


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "record"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts[:5]) + (f" (+{len(parts) - 5} more)" if len(parts) > 5 else "")


def _dead(raw: str, reason: str, position: str | None, obj: Any = None, raw_b64: str | None = None) -> DeadLetter:
    agent_id = record_id = None
    if isinstance(obj, dict):
        if isinstance(obj.get("agent_id"), str):
            agent_id = obj["agent_id"][:512]
        if isinstance(obj.get("id"), str):
            record_id = obj["id"][:512]
    return DeadLetter(
        raw=raw, raw_base64=raw_b64, reason=reason, position=position, agent_id=agent_id, record_id=record_id
    )


def parse_line(line: str | bytes, position: str | None = None) -> InputRecord | DeadLetter:
    """Turn one JSON line into a record, or a dead letter saying why. Never raises."""
    raw_b64 = None
    try:
        if isinstance(line, bytes):
            try:
                raw = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raw = line.decode("utf-8", errors="replace").rstrip("\r\n")
                raw_b64 = base64.b64encode(line).decode("ascii")
                return _dead(raw, f"not UTF-8: {exc.reason} at byte {exc.start}", position, raw_b64=raw_b64)
        else:
            raw = line
        raw = raw.rstrip("\r\n")
        if not raw.strip():
            return _dead(raw, "empty line", position)
        try:
            obj = json.loads(raw)
        except RecursionError:
            return _dead(raw, "invalid JSON: nested too deeply", position)
        except ValueError as exc:
            return _dead(raw, f"invalid JSON: {exc}", position)
        if not isinstance(obj, dict):
            return _dead(raw, f"a record must be a JSON object, got {type(obj).__name__}", position)
        shapes = [key for key in ("text", "messages", "chunks") if key in obj]
        changes = [key for key in ("deleted", "forget") if key in obj]
        if changes:
            if shapes or len(changes) > 1:
                return _dead(raw, f"{changes[0]}: a deletion or forget record carries no content and nothing "
                                  f"else (found: {', '.join(changes[1:] + shapes)})", position, obj)
            if "kind" in obj:
                return _dead(raw, "kind: is derived from the record's shape and must not be sent", position, obj)
            change: type[BaseModel] = Deletion if changes[0] == "deleted" else Forget
            try:
                return change.model_validate(obj)  # type: ignore[return-value]
            except ValidationError as exc:
                return _dead(raw, _describe(exc), position, obj)
        if len(shapes) != 1:
            found = ", ".join(shapes) if shapes else "none"
            return _dead(raw, f"exactly one of text, messages, chunks is required (found: {found})", position, obj)
        model: type[BaseModel] = {
            "text": MemoryItem,
            "messages": Conversation,
            "chunks": TrustedConversation,
        }[shapes[0]]
        if model is TrustedConversation and obj.get("trusted") is not True:
            return _dead(raw, 'chunks are accepted only with "trusted": true', position, obj)
        if "kind" in obj:
            return _dead(raw, "kind: is derived from the record's shape and must not be sent", position, obj)
        try:
            return model.model_validate(obj)  # type: ignore[return-value]
        except ValidationError as exc:
            return _dead(raw, _describe(exc), position, obj)
        except RecursionError:
            return _dead(raw, "record nested too deeply", position, obj)
    except Exception as exc:  # the contract: never raise, never lose the line
        text = line if isinstance(line, str) else line.decode("utf-8", errors="replace")
        return _dead(text, f"unexpected parser error: {type(exc).__name__}: {exc}", position, raw_b64=raw_b64)


def parse_kafka_value(value: bytes | None, position: str, max_bytes: int) -> InputRecord | DeadLetter:
    """One Kafka record's value, as `parse_line` reads a line; a null value (a tombstone) and a value over
    `max_bytes` are dead letters too. The record's key is not read: the value's `agent_id` names the agent."""
    if value is None:
        return _dead("", "null value (a tombstone): a record is a JSON object in the value", position)
    if len(value) > max_bytes:
        head = bytes(value[:256]).decode("utf-8", errors="replace")
        return _dead(head, f"oversized: {len(value)} bytes, over source.kafka.max_value_bytes ({max_bytes}); "
                           "raw holds the first 256 bytes", position)
    return parse_line(bytes(value), position)
