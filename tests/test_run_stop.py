"""How `flink-memory run` waits for its job: until the job ends, or, on SIGINT or SIGTERM, until the job it
cancelled has ended (an unbounded input never ends; tests/test_service_e2e.py stops a real one this way)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from flink_memory.cli.run import _wait_or_cancel


class Result:
    def __init__(self) -> None:
        self.ended = threading.Event()
        self.error: Exception | None = None

    def done(self) -> bool:
        return self.ended.is_set()

    def result(self) -> None:
        if self.error is not None:
            raise self.error


class Client:
    """A job client whose job runs until cancelled (or until a test ends it)."""

    def __init__(self) -> None:
        self.job = Result()
        self.cancelled = 0

    def get_job_execution_result(self) -> Result:
        return self.job

    def cancel(self) -> Result:
        self.cancelled += 1
        threading.Timer(0.3, self.job.ended.set).start()  # its tasks take a moment to end
        done = Result()
        done.ended.set()
        return done


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_cancels_the_job_and_waits_for_it_to_end(signum):
    client = Client()
    before = signal.getsignal(signum)
    threading.Timer(0.3, os.kill, (os.getpid(), signum)).start()
    assert _wait_or_cancel(client, poll_s=0.05) is True
    assert client.cancelled == 1 and client.job.done()
    assert signal.getsignal(signum) is before  # the handlers are restored


def test_a_job_that_ends_is_waited_for_and_its_failure_raised():
    client = Client()
    threading.Timer(0.2, client.job.ended.set).start()
    assert _wait_or_cancel(client, poll_s=0.05) is False
    assert client.cancelled == 0
    client.job.error = RuntimeError("the job failed")
    with pytest.raises(RuntimeError, match="the job failed"):
        _wait_or_cancel(client, poll_s=0.05)
