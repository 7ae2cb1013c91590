"""What a runner does with one activation's effects, written once for every runner: the Flink shell
(flink_memory.flink.operators) and the in-memory runner (flink_memory.local).

A runner starts the calls a core asks for, lets the pool forget the results it consumed, wakes the key when its
calls should be done or its deadline is due, sends the stage's messages to the next stage (the last stage's out
of the job) and emits the rest on its channel: dead letters, and the side channels of flink_memory.topology.
(The words: a stage *sends* a message to the next stage and *emits* a line on a side channel; docs/architecture.md.)
"""

from __future__ import annotations

from typing import Protocol

from flink_memory.requests import ChatRequest
from flink_memory.stages.calls import Effects
from flink_memory.stages.messages import StageMessage

DEAD_LETTERS = "dead-letters"


class Runner(Protocol):
    def start(self, requests: list[ChatRequest]) -> None:
        """Submit calls (idempotent by request digest)."""

    def forget(self, digests: list[str]) -> None:
        """Results the core consumed: the pool may drop them."""

    def wake(self, key: str, effects: Effects) -> None:
        """Set the key's wake-ups: when its calls should be done, its next deadline, its housekeeping."""

    def send(self, key: str, message: StageMessage) -> None:
        """Send one message of the key to the next stage (the last stage's summary nodes: out of the job)."""

    def emit(self, key: str, channel: str, payload: str) -> None:
        """Send one output of the key on `channel` (DEAD_LETTERS or a side channel), as JSON text."""


def carry_out(runner: Runner, key: str, effects: Effects) -> None:
    """Carry out one activation's effects. Side channels and dead letters go before the records: a runner that
    hands messages straight to the next stage (the in-memory one) then keeps each channel in the order written."""
    runner.start(effects.start)
    runner.forget(effects.consumed)
    runner.wake(key, effects)
    for channel, payloads in effects.side.items():
        for payload in payloads:
            runner.emit(key, channel, payload)
    for dead in effects.dead_letters:
        runner.emit(key, DEAD_LETTERS, dead.model_dump_json())
    for message in effects.out:
        runner.send(key, message)
