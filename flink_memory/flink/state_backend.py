"""Keyed state of one stage as a StateBackend over PyFlink's value and map states (see flink_memory.state)."""

from __future__ import annotations

from typing import Any

EMBEDDED_STATE = "pyflink.fn_execution.datastream.embedded."  # thread mode's state classes
VALUE_CACHE_SIZE = 20_000  # cached value states per stage function (a few per agent), then started afresh


class FlinkState:
    """A StateBackend over the PyFlink states of one stage (the current key is Flink's, set in `key`).

    Value states are cached per key, write-through: every call into the JVM costs tens of microseconds and
    a stage reads its few small values on every record. The cache is as safe as the state: only this
    function writes these states, and a restored job opens a new function with an empty cache. A write of
    the value already there is skipped."""

    def __init__(self, values: dict[str, Any], maps: dict[str, Any], read_once: frozenset[str] = frozenset()) -> None:
        self.values, self.maps = values, maps
        self.read_once = read_once  # (StateSchema.read_once)
        self.absent: set[tuple[str, str]] = set()  # (state, key) of those found absent: not read again
        # MapState.put_all is one JVM call in thread mode; process mode's iterates a dict as pairs (broken).
        # The mode is the job's, which for operators embedded in another job need not be our config's.
        self.bulk_puts = all(type(m).__module__.startswith(EMBEDDED_STATE) for m in maps.values())
        self.key = ""
        self.cached: dict[tuple[str, str], str | None] = {}

    def _remember(self, slot: tuple[str, str], raw: str | None) -> None:
        if len(self.cached) >= VALUE_CACHE_SIZE:
            self.cached.clear()
        self.cached[slot] = raw

    def read(self, name: str) -> str | None:
        slot = (name, self.key)
        if name in self.read_once:  # (outside the cache, so the current layout's values keep its room)
            if slot in self.absent:
                return None
            raw = self.values[name].value()
            if raw is None:
                self.absent.add(slot)
            return raw
        if slot not in self.cached:
            self._remember(slot, self.values[name].value())
        return self.cached[slot]

    def write(self, name: str, raw: str | None) -> None:
        slot = (name, self.key)
        if name in self.read_once:
            if raw is None:
                self.values[name].clear()
                self.absent.add(slot)
            else:
                self.values[name].update(raw)
                self.absent.discard(slot)
            return
        if slot in self.cached and self.cached[slot] == raw:
            return
        if raw is None:
            self.values[name].clear()
        else:
            self.values[name].update(raw)
        self._remember(slot, raw)

    def read_entry(self, name: str, key: str) -> str | None:
        return self.maps[name].get(key)

    def write_entry(self, name: str, key: str, raw: str | None) -> None:
        if raw is None:
            self.maps[name].remove(key)
        else:
            self.maps[name].put(key, raw)

    def write_entries(self, name: str, entries: dict[str, str]) -> None:
        if self.bulk_puts and len(entries) > 1:
            self.maps[name].put_all(entries)
            return
        for key, raw in entries.items():
            self.write_entry(name, key, raw)

    def keys(self, name: str) -> list[str]:
        return list(self.maps[name].keys())
