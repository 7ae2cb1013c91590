"""The call pool: queue order by priority, and wake-up estimates that follow that order."""

import threading
import time

from flink_memory.llm.pool import CallPool
from flink_memory.requests import ChatRequest, ChatResult


def request(text: str, kind: str) -> ChatRequest:
    return ChatRequest.build(model="m", prompt_version="v", messages=[{"role": "user", "content": text}],
                             max_tokens=8, kind=kind)


class Gate:
    """A provider whose calls end when the test opens the gate; it records the order calls started in."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.started: list[str] = []

    def complete(self, req: ChatRequest) -> ChatResult:
        self.started.append(req.messages[0][1])
        self.open.wait(5)
        return ChatResult(text="ok", prompt_tokens=1, completion_tokens=1, model="m", latency_s=0.0)


def test_a_queued_call_is_expected_when_the_calls_before_it_in_queue_order_are_done():
    gate = Gate()
    pool = CallPool(gate.complete, 1)
    try:
        running = request("running", "batch")
        pool.submit(running)
        deadline = time.monotonic() + 5
        while not gate.started and time.monotonic() < deadline:
            time.sleep(0.005)
        late_global = request("global", "global")
        batches = [request(f"batch {i}", "batch") for i in range(3)]
        pool.submit(late_global)  # submitted first, but a global waits for every batch queued after it
        for batch in batches:
            pool.submit(batch)
        now_ms = 1_000_000
        batch_eta = pool.wake_at_ms([batches[0].digest], now_ms)
        global_eta = pool.wake_at_ms([late_global.digest], now_ms)
        assert batch_eta < global_eta
        # one worker: the global starts after the running call and the three batches
        assert pool.wake_at_ms([batches[2].digest], now_ms) < global_eta
        gate.open.set()
        pool.wait([late_global.digest], timeout_s=5)
        assert gate.started == ["running", "batch 0", "batch 1", "batch 2", "global"]
        assert pool.wake_at_ms([late_global.digest], now_ms) == now_ms  # done: look now
    finally:
        gate.open.set()
        pool.close()


def test_a_request_submitted_twice_runs_once():
    gate = Gate()
    gate.open.set()
    pool = CallPool(gate.complete, 2)
    try:
        same = request("same", "batch")
        pool.submit(same)
        pool.submit(same)
        pool.wait([same.digest], timeout_s=5)
        assert gate.started == ["same"]
        assert pool.finished()[same.digest].text == "ok"
    finally:
        pool.close()
