import os
import shutil
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from kafka_broker import KafkaBroker  # noqa: E402
from pgserver import PostgresUnavailable, start_postgres, stop_postgres  # noqa: E402
from scripted_server import ScriptedServer  # noqa: E402

# tests/agents need flink-agents, which does not install beside the service extra (pydantic, mcp): `make test`
# runs them in their own environment (.venv-agents); elsewhere they are not collected
collect_ignore = [] if find_spec("flink_agents") else ["agents"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding slow tests first, each file's tests in their own order: on xdist's workers (`make test`,
    a file per worker) the long MiniCluster and cluster files start early instead of ending the run alone."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture
def scripted():
    with ScriptedServer() as server:
        yield server


@pytest.fixture(scope="session")
def embedded_llm():
    """One real SmolLM2 server for the whole test session."""
    from flink_memory.llm.llamacpp import EmbeddedServer

    server = EmbeddedServer(context_window=4096, parallel=2, threads=2)
    yield server
    server.close()


@pytest.fixture(scope="session")
def postgres_url():
    """One PostgreSQL server for the session (tests/pgserver.py); without one: fail under CI=true, else skip."""
    base = tempfile.mkdtemp(prefix="flink-memory-pg-")  # under /tmp: reachable by the postgres user
    try:
        url = start_postgres(base)
    except PostgresUnavailable as exc:
        shutil.rmtree(base, ignore_errors=True)
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL tests cannot run: {exc}")
        pytest.skip(f"no PostgreSQL server can be started here: {exc}")
    yield url
    stop_postgres(base)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_broker():
    """One single-node KRaft broker for the session (tests/kafka_broker.py), on free loopback ports."""
    base = Path(tempfile.mkdtemp(prefix="flink-memory-kafka-"))
    broker = KafkaBroker(base).start()
    yield broker
    broker.stop()
    shutil.rmtree(base, ignore_errors=True)
