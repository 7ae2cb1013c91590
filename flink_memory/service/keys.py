"""Service keys: which agents a caller may read and write. The keys file holds a digest of each key, never
the key: a key is printed once when it is made (`flink-memory keys add`) and cannot be read back.

A key is `fmk_<id>_<secret>` (the id names it in `keys list` and `keys revoke`; the secret is 32 random
bytes). The file stores `sha256(key)`; a presented key is hashed and compared against every entry with
`hmac.compare_digest`, so neither the comparison nor the lookup order tells how close a guess came. A key
grants agent ids and id prefixes (`team-*`: every agent whose id starts with `team-`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

KEY_PREFIX = "fmk_"


class KeysError(ValueError):
    """A keys file that cannot be used, or a key operation that cannot be done; the message says why."""


class KeyEntry(BaseModel):
    """One key as the file keeps it: its public id, the digest of the key, the agents it grants."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    digest: str
    agents: list[str] = Field(min_length=1)
    created: str

    def allows(self, agent_id: str) -> bool:
        """True when this key may read and write `agent_id` (an exact id, or a `prefix*` it starts with)."""
        return any(agent_id.startswith(grant[:-1]) if grant.endswith("*") else agent_id == grant
                   for grant in self.agents)

    def default_agent(self) -> str | None:
        """The one agent this key names, when it names exactly one exact id (the MCP tools' default)."""
        exact = [grant for grant in self.agents if not grant.endswith("*")]
        return exact[0] if len(self.agents) == 1 and exact else None


class KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[KeyEntry] = Field(default_factory=list)


def digest(key: str) -> str:
    """What the file keeps of a key: a key is 32 random bytes, so one SHA-256 is as strong as a slow hash."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def load_keys(path: str | os.PathLike[str]) -> KeysFile:
    """The keys file; a missing file is an empty one."""
    file = Path(path)
    if not file.exists():
        return KeysFile()
    try:
        return KeysFile.model_validate_json(file.read_bytes())
    except ValidationError as exc:
        raise KeysError(f"{file} is not a flink-memory keys file: {exc.errors(include_url=False)[0]['msg']}") from None


def save_keys(path: str | os.PathLike[str], keys: KeysFile) -> None:
    """Write the file atomically, readable by its owner only."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(keys.model_dump(), indent=2) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_key(path: str | os.PathLike[str], agents: list[str]) -> tuple[str, KeyEntry]:
    """Make a key for `agents` (ids, or prefixes ending in `*`), store its digest; returns the key (shown once)."""
    grants = [a for a in agents if a.strip()]
    if not grants or any(a == "*" for a in grants):
        raise KeysError("name at least one agent id or prefix (a bare '*' would grant every agent)")
    keys = load_keys(path)
    key_id = secrets.token_hex(4)
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    entry = KeyEntry(id=key_id, digest=digest(key), agents=grants,
                     created=datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"))
    save_keys(path, KeysFile(keys=[*keys.keys, entry]))
    return key, entry


def revoke_key(path: str | os.PathLike[str], key_id: str) -> KeyEntry:
    """Remove the key with this id; KeysError when there is none."""
    keys = load_keys(path)
    gone = [k for k in keys.keys if k.id == key_id]
    if not gone:
        raise KeysError(f"no key with id {key_id!r} in {path}")
    save_keys(path, KeysFile(keys=[k for k in keys.keys if k.id != key_id]))
    return gone[0]


class KeyRing:
    """The keys a server accepts, read again whenever the file changes (a revoked key stops working at once)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise KeysError(f"no keys file at {self.path} (make one with `flink-memory keys add AGENT --keys FILE`)")
        self._stamp: tuple[int, ...] | None = None
        self._keys: list[KeyEntry] = []
        self._reload()

    def _reload(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._keys = None, []
            return
        # (the inode too: a file rewritten by rename within one tick of the clock, at the same size, is new)
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size)
        if stamp != self._stamp:
            self._keys = load_keys(self.path).keys
            self._stamp = stamp

    def verify(self, key: str | None) -> KeyEntry | None:
        """The entry of a presented key, or None. Every entry is compared, in constant time each."""
        if not key:
            return None
        self._reload()
        presented = digest(key)
        found = None
        for entry in self._keys:
            if hmac.compare_digest(entry.digest, presented):
                found = entry
        return found
