"""Stable digests: xxh3-128 over canonical encodings, so equal content gives equal keys across processes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import xxhash


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def digest(value: Any) -> str:
    """xxh3-128 of the canonical JSON of `value`."""
    return xxhash.xxh3_128_hexdigest(canonical_json(value).encode("utf-8"))


def digest_parts(parts: Iterable[str]) -> str:
    """xxh3-128 over length-prefixed parts: ("ab","c") and ("a","bc") never collide by concatenation."""
    hasher = xxhash.xxh3_128()
    for part in parts:
        data = part.encode("utf-8", errors="surrogatepass")
        hasher.update(len(data).to_bytes(8, "big"))
        hasher.update(data)
    return hasher.hexdigest()


def digest_messages(messages: Iterable[dict[str, Any]]) -> str:
    """Digest of exchanges: each exchange is its canonical JSON, length-prefixed."""
    return digest_parts(canonical_json(m) for m in messages)
