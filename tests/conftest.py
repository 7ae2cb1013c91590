import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from scripted_server import ScriptedServer  # noqa: E402


@pytest.fixture
def scripted():
    with ScriptedServer() as server:
        yield server


@pytest.fixture(scope="session")
def embedded_llm():
    """One real SmolLM2 server for the whole test session."""
    from flink_memory.llm.embedded import EmbeddedServer

    server = EmbeddedServer(context_window=4096, parallel=2, threads=2)
    yield server
    server.close()
