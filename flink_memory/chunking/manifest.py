"""Versioned, text-free chunk manifests and the checks that make a stored plan safe to reuse."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from flink_memory.digests import canonical_json, digest, digest_messages, digest_parts
from flink_memory.records import ChunkManifest, ManifestChunk

SCHEMA_VERSION = 1


class ManifestMismatch(ValueError):
    """A stored plan or manifest whose digests do not verify: never reused, never silently re-planned."""


class PolicyChanged(ValueError):
    """A sound stored plan made under other settings: not reusable, so the input is planned afresh."""


def input_digest_messages(messages: Sequence[dict[str, Any]]) -> str:
    return digest_messages(messages)


def input_digest_text(text: str) -> str:
    return digest_parts(["text", text])


def plan_digest(method: str, boundaries: Sequence[int], policy_fingerprint: str, input_digest: str) -> str:
    return digest({"method": method, "boundaries": list(boundaries), "policy": policy_fingerprint,
                   "input": input_digest})


def chunk_digest(chunk: dict[str, Any]) -> str:
    if "messages" in chunk:
        return digest_messages(chunk["messages"])
    return digest_parts(["text", chunk["text"]])


UPDATE_FIELDS = {"replaces_input_digest", "replace_reason"}


def _fields(manifest: ChunkManifest, *, exclude: frozenset[str] = frozenset()) -> dict:
    """The manifest as JSON data; the update fields only when set, so plans stored before them still verify."""
    unset = {name for name in UPDATE_FIELDS if getattr(manifest, name) is None}
    return manifest.model_dump(mode="json", exclude=exclude | unset)


def seal(manifest: ChunkManifest) -> ChunkManifest:
    """Set the digest over every field but the digest."""
    body = _fields(manifest, exclude=frozenset({"manifest_digest"}))
    return manifest.model_copy(update={"manifest_digest": digest(body)})


def as_update(manifest: ChunkManifest, replaces_input_digest: str, why: str) -> ChunkManifest:
    """The manifest of a record sent again with other content: which input it replaces, and why."""
    return seal(manifest.model_copy(update={"replaces_input_digest": replaces_input_digest, "replace_reason": why}))


def build_manifest(
    *,
    agent_id: str,
    source_id: str,
    input_digest: str,
    policy_fingerprint: str,
    method: str,
    chunks: Sequence[dict[str, Any]],
    reason: str | None = None,
    planner_calls: int = 0,
) -> ChunkManifest:
    boundaries = [c["end"] for c in chunks]
    return seal(
        ChunkManifest(
            schema_version=SCHEMA_VERSION,
            agent_id=agent_id,
            source_id=source_id,
            input_digest=input_digest,
            policy_fingerprint=policy_fingerprint,
            plan_digest=plan_digest(method, boundaries, policy_fingerprint, input_digest),
            method=method,  # type: ignore[arg-type]
            boundaries=boundaries,
            chunks=[
                ManifestChunk(index=c["index"], start=c["start"], end=c["end"], digest=chunk_digest(c),
                              tokens=c["tokens"], oversized=c["oversized"])
                for c in chunks
            ],
            reason=reason,
            planner_calls=planner_calls,
        )
    )


def check_schema_version(stored: str) -> None:
    """Refuse a manifest of another schema before reading its fields (a newer layout may not parse as ours)."""
    try:
        version = json.loads(stored).get("schema_version")
    except (ValueError, AttributeError) as exc:
        raise ManifestMismatch(f"stored manifest is not a JSON object: {exc}") from None
    if version != SCHEMA_VERSION:
        raise ManifestMismatch(f"stored manifest has schema_version {version!r}; this release reads only "
                               f"schema_version {SCHEMA_VERSION}: plan it afresh or use the release that wrote it")


def load_verified(stored: str, *, input_digest: str, policy_fingerprint: str) -> ChunkManifest:
    """Parse a stored manifest and check its own digests; raise ManifestMismatch on any doubt."""
    check_schema_version(stored)
    try:
        manifest = ChunkManifest.model_validate_json(stored)
    except ValueError as exc:
        raise ManifestMismatch(f"stored manifest does not parse: {exc}") from None
    if seal(manifest).manifest_digest != manifest.manifest_digest:
        raise ManifestMismatch(f"manifest digest of {manifest.source_id!r} does not verify (tampered or corrupt)")
    if manifest.input_digest != input_digest:
        raise ManifestMismatch(f"manifest of {manifest.source_id!r} was stored under another input digest")
    expected = plan_digest(manifest.method, manifest.boundaries, manifest.policy_fingerprint, manifest.input_digest)
    if manifest.plan_digest != expected or manifest.boundaries != [c.end for c in manifest.chunks]:
        raise ManifestMismatch(f"plan digest of {manifest.source_id!r} does not verify")
    if manifest.policy_fingerprint != policy_fingerprint:
        raise PolicyChanged(f"plan of {manifest.source_id!r} was made under another chunking policy")
    return manifest


def verify_chunks(manifest: ChunkManifest, chunks: Sequence[dict[str, Any]]) -> None:
    """The chunks rebuilt from the source must match the manifest's per-chunk digests."""
    got = [chunk_digest(c) for c in chunks]
    want = [c.digest for c in manifest.chunks]
    if got != want:
        raise ManifestMismatch(f"chunk digests of {manifest.source_id!r} do not verify against the input")


def manifest_json(manifest: ChunkManifest) -> str:
    return canonical_json(_fields(manifest))
