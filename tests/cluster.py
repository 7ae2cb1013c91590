"""A real standalone Flink cluster from the apache-flink wheel's bin/ scripts, on localhost, for tests.

A JobManager and N TaskManagers (one slot each) with their own conf, log, pid and tmp folders under a temp
directory; `flink run -py` submits to it. The conf is Flink's own plus what docs/deployment.md tells clusters
to add (conf/log4j-cluster.properties appended to every log4j*.properties). `stop()` kills everything it started,
also after a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyflink
import yaml
from jobkit import PRISTINE_ENV

FLINK_HOME = Path(pyflink.__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[1]
LOG_CONFIG = ROOT / "conf" / "log4j-cluster.properties"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


class StandaloneCluster:
    """`plugins`: folders to put in the cluster's plugins/ directory (e.g. Flink's S3 filesystem); `settings`:
    more config.yaml keys (e.g. s3.endpoint); `env`: more environment for its processes and `flink run`."""

    def __init__(self, workdir: Path, taskmanagers: int = 2, *, plugins: tuple[Path, ...] = (),
                 settings: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.taskmanagers = taskmanagers
        self.plugins = plugins
        self.settings = settings or {}
        self.plugin_dir = workdir / "plugins"
        self.conf_dir = workdir / "conf"
        self.log_dir = workdir / "log"
        self.pid_dir = workdir / "pid"
        self.tmp_dir = workdir / "tmp"  # blobs and Python working folders, inside the workdir
        self.client_output: list[str] = []  # what each `flink run` printed
        self.rest_port = free_port()
        self.taskmanager_pids: dict[str, int] = {}  # resource id -> pid, in start order
        self.env = dict(PRISTINE_ENV, FLINK_HOME=str(FLINK_HOME), FLINK_CONF_DIR=str(self.conf_dir),
                        FLINK_LOG_DIR=str(self.log_dir), FLINK_PID_DIR=str(self.pid_dir))
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env.update(env or {})
        if plugins:
            self.env["FLINK_PLUGINS_DIR"] = str(self.plugin_dir)

    # --- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> StandaloneCluster:
        for folder in (self.conf_dir, self.log_dir, self.pid_dir, self.tmp_dir):
            folder.mkdir(parents=True, exist_ok=True)
        for plugin in self.plugins:
            self.plugin_dir.mkdir(exist_ok=True)
            (self.plugin_dir / plugin.name).symlink_to(plugin.resolve(), target_is_directory=True)
        for item in (FLINK_HOME / "conf").iterdir():
            if item.is_file():
                shutil.copy(item, self.conf_dir / item.name)
        for log_config in self.conf_dir.glob("log4j*.properties"):
            with log_config.open("a") as handle:
                handle.write("\n" + LOG_CONFIG.read_text())
        conf = yaml.safe_load((FLINK_HOME / "conf" / "config.yaml").read_text())
        settings = {
            "jobmanager.rpc.port": free_port(),
            "jobmanager.memory.process.size": "1024m",
            "taskmanager.memory.process.size": "1600m",
            "taskmanager.numberOfTaskSlots": 1,
            "rest.port": self.rest_port,
            "rest.address": "localhost",
            "rest.bind-address": "localhost",
            "blob.server.port": free_port(),
            "taskmanager.rpc.port": "0",
            "taskmanager.data.port": "0",
            "io.tmp.dirs": str(self.tmp_dir),
            # a killed TaskManager is noticed within seconds, not the default 50
            "heartbeat.interval": "1000",
            "heartbeat.timeout": "5000",
            "python.executable": sys.executable,
            "python.client.executable": sys.executable,
            # a JVM crash report (command line, some environment variables) goes with the logs, not the cwd;
            # per process type, as env.java.opts.all holds Flink's own --add-opens
            **{f"env.java.opts.{process}": f"-XX:ErrorFile={self.log_dir}/hs_err_pid%p.log"
               for process in ("jobmanager", "taskmanager", "client")},
            "parallelism.default": self.taskmanagers,
            **self.settings,
        }
        for key, value in settings.items():
            _set(conf, key, value)
        (self.conf_dir / "config.yaml").write_text(yaml.safe_dump(conf))
        self._script("jobmanager.sh", "start")
        for _ in range(self.taskmanagers):
            self.start_taskmanager()
        self.wait_for_taskmanagers(self.taskmanagers)
        return self

    def stop(self) -> None:
        for name in ("taskmanager.sh", "jobmanager.sh"):
            try:
                self._script(name, "stop-all", timeout=60)
            except (subprocess.SubprocessError, OSError):
                pass
        for pid in self._pids("taskexecutor") + self._pids("standalonesession"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self) -> StandaloneCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start_taskmanager(self) -> str:
        """Starts a TaskManager with a resource id of our own, so REST answers name the process; returns it."""
        resource_id = f"tm-{len(self.taskmanager_pids) + 1}"
        self._script("taskmanager.sh", "start", "-D", f"taskmanager.resource-id={resource_id}")
        self.taskmanager_pids[resource_id] = self._pids("taskexecutor")[-1]  # flink-daemon.sh appends
        return resource_id

    def kill_taskmanager(self, resource_id: str) -> None:
        os.kill(self.taskmanager_pids[resource_id], signal.SIGKILL)

    def busy_taskmanagers(self, job_id: str, vertex_names: tuple[str, ...]) -> list[str]:
        """TaskManagers running a subtask of the named vertices (by name prefix) that has not finished."""
        busy = set()
        for vertex in self.rest(f"/jobs/{job_id}")["vertices"]:
            if vertex["name"].startswith(vertex_names):
                hosts = self.rest(f"/jobs/{job_id}/vertices/{vertex['id']}/taskmanagers")["taskmanagers"]
                busy.update(h["taskmanager-id"] for h in hosts if h["status"] == "RUNNING")
        return sorted(busy)

    # --- jobs ------------------------------------------------------------------------------------------

    def submit(self, script: Path, *args: str, options: tuple[str, ...] = (), home: Path | None = None) -> str:
        """`flink run -d [options] -py script args` with the venv as the workers' Python; returns the job id.
        `home`: the client's HOME (a folder without a Maven cache proves a jar is shipped by `options`)."""
        command = [str(FLINK_HOME / "bin" / "flink"), "run", "--jobmanager", f"localhost:{self.rest_port}", "-d",
                   *options, "--python", str(script), "--pyExecutable", sys.executable,
                   "--pyClientExecutable", sys.executable, *args]
        # its own client log (flink-<ident>-client-<host>.log), which the next `flink run` would overwrite
        env = dict(self.env, FLINK_IDENT_STRING=f"submit{len(self.client_output) + 1}")
        if home is not None:
            env["HOME"] = str(home)
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        output = done.stdout + done.stderr
        self.client_output.append(output)
        for line in output.splitlines():
            if "JobID" in line:
                return line.rsplit(" ", 1)[-1].strip()
        raise AssertionError(f"flink run failed ({done.returncode}):\n{output[-4000:]}")

    def rest(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://localhost:{self.rest_port}{path}", timeout=5) as response:
            return json.loads(response.read())

    def cancel(self, job_id: str) -> None:
        """Cancels the job (its checkpoints are retained: RETAIN_ON_CANCELLATION)."""
        request = urllib.request.Request(f"http://localhost:{self.rest_port}/jobs/{job_id}?mode=cancel", method="PATCH")
        urllib.request.urlopen(request, timeout=5).close()

    def job_state(self, job_id: str) -> str:
        return str(self.rest(f"/jobs/{job_id}")["state"])

    def wait_for_job(self, job_id: str, timeout_s: float = 600) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in ("FINISHED", "FAILED", "CANCELED"):
                return state
            time.sleep(1)
        raise AssertionError(f"job {job_id} still {self.job_state(job_id)} after {timeout_s} s\n{self.logs()}")

    def restarts(self, job_id: str) -> int:
        """Restarts the JobManager records for the job (from its exceptions history)."""
        history = self.rest(f"/jobs/{job_id}/exceptions").get("exceptionHistory", {}).get("entries", [])
        return len(history)

    def wait_for_taskmanagers(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if len(self.rest("/taskmanagers")["taskmanagers"]) >= count:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{count} TaskManagers did not register in {timeout_s} s\n{self.logs()}")

    def logs(self, tail: int = 60) -> str:
        out = []
        for path in sorted(self.log_dir.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            out.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # --- internals -------------------------------------------------------------------------------------

    def _script(self, name: str, *args: str, timeout: float = 120) -> None:
        subprocess.run([str(FLINK_HOME / "bin" / name), *args], env=self.env, check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _pids(self, daemon: str) -> list[int]:
        pids: list[int] = []
        for path in self.pid_dir.glob(f"*{daemon}*.pid"):
            pids.extend(int(line) for line in path.read_text().split() if line.strip().isdigit())
        return pids
