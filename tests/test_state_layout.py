"""The stored layout of state version 2 stays byte for byte: values of every keyed state, written by main's code
before state was apart from the domain (commit 37978ba, from the stage tests' runs), load as the domain objects
the cores work with and are written back exactly as they were. The MiniCluster restore of
`tests/data/state-2/` (tests/test_recovery.py) holds the same for a whole checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from flink_memory.state_layout import StateModel, StoredModel
from flink_memory.topology import STAGES

VALUES = Path(__file__).resolve().parent / "data" / "state-2-values.jsonl"
CODECS = {name: codec for spec in STAGES
          for name, codec in (*spec.core.schema.values.items(), *spec.core.schema.maps.items())}
SAMPLES = [tuple(json.loads(line)) for line in VALUES.read_text(encoding="utf-8").splitlines()]


def test_the_samples_cover_every_state() -> None:
    assert {name for name, _ in SAMPLES} == set(CODECS)


@pytest.mark.parametrize(("name", "raw"), SAMPLES, ids=[f"{name}-{i}" for i, (name, _) in enumerate(SAMPLES)])
def test_a_stored_value_loads_as_the_domain_and_is_written_back_the_same(name: str, raw: str) -> None:
    codec = CODECS[name]
    value = codec.load(raw)
    assert isinstance(value, BaseModel) and not isinstance(value, StoredModel)  # the core never sees the layout
    assert codec.dump(value) == raw


def test_a_domain_type_is_no_stored_model() -> None:
    for codec in CODECS.values():
        assert isinstance(codec, type) and issubclass(codec, StateModel)
        assert codec.stores is not None and not issubclass(codec.stores, StoredModel)
