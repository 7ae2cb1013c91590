"""How `flink-memory run` waits for its job: until the job ends, or, on SIGINT or SIGTERM, until the job it
cancelled has ended (an unbounded input never ends; tests/test_service_e2e.py stops a real one this way)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from flink_memory.cli.run import wait_or_cancel


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
    assert wait_or_cancel(client, poll_s=0.05) is True
    assert client.cancelled == 1 and client.job.done()
    assert signal.getsignal(signum) is before  # the handlers are restored


def test_a_job_that_ends_is_waited_for_and_its_failure_raised():
    client = Client()
    threading.Timer(0.2, client.job.ended.set).start()
    assert wait_or_cancel(client, poll_s=0.05) is False
    assert client.cancelled == 0
    client.job.error = RuntimeError("the job failed")
    with pytest.raises(RuntimeError, match="the job failed"):
        wait_or_cancel(client, poll_s=0.05)


def test_a_port_taken_before_flink_binds_it_is_tried_again_with_another():
    from flink_memory.cli.run import start_on_free_port

    tried = []

    def start(port):
        tried.append(port)
        if len(tried) == 1:  # what Flink raised when another process took the port in between
            raise RuntimeError("java.net.BindException: Could not start rest endpoint on any port in port range "
                               f"{port}")
        return "client"

    assert start_on_free_port(start) == ("client", tried[1])
    assert len(tried) == 2
    with pytest.raises(ValueError, match="not a port problem"):
        start_on_free_port(lambda port: (_ for _ in ()).throw(ValueError("not a port problem")))
    with pytest.raises(RuntimeError, match="BindException"):
        start_on_free_port(lambda port: (_ for _ in ()).throw(RuntimeError("BindException")), tries=2)
