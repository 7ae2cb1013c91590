"""A throwaway PostgreSQL server for tests, started from the machine's binaries (`pg_config --bindir`).

initdb refuses to run as root, so as root the server runs as the `postgres` user (`runuser`) in a temporary
directory it owns; otherwise as the current user. It listens on a free loopback port with trust
authentication and no fsync (test data only). `postgres_url` (tests/conftest.py) is the session fixture.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says why."""


def _bindir() -> Path:
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        raise PostgresUnavailable("pg_config is not on PATH (install Debian's postgresql package)")
    bindir = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True).stdout.strip())
    if not (bindir / "initdb").exists():
        raise PostgresUnavailable(f"{bindir} has no initdb (install the postgresql server package)")
    return bindir


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    if shutil.which("runuser") is None:
        raise PostgresUnavailable("running as root without runuser: cannot start PostgreSQL as another user")
    return ["runuser", "-u", "postgres", "--", *command]


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(_as_server_user(command), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise PostgresUnavailable(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}")


def start_postgres(tmpdir: str | os.PathLike[str]) -> str:
    """Start a server with its data under `tmpdir` (created if needed, handed to the server's user; it must
    not hold a server yet) and return its URL (database and user `postgres`). Stop it with
    `stop_postgres(tmpdir)`. As root, `tmpdir` must be reachable by the postgres user (e.g. under /tmp)."""
    bindir = _bindir()
    base = Path(tmpdir)
    base.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        try:
            shutil.chown(base, "postgres", "postgres")
        except (LookupError, PermissionError) as exc:
            raise PostgresUnavailable(f"running as root, but cannot hand {base} to a 'postgres' user: {exc}") from None
        base.chmod(0o700)
    data, port = base / "data", _free_port()
    _run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
         "initdb")
    options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {base} -c fsync=off -c synchronous_commit=off "
               "-c full_page_writes=off -c max_connections=200")
    log = base / "server.log"
    try:
        _run([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o", options, "start"],
             "pg_ctl start")
    except PostgresUnavailable as exc:
        tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
        raise PostgresUnavailable(f"{exc}\nserver log: {tail}") from None
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def stop_postgres(tmpdir: str | os.PathLike[str]) -> None:
    data = Path(tmpdir) / "data"
    if data.exists():
        _run([str(_bindir() / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], "pg_ctl stop")


def new_database(url: str) -> str:
    """A fresh, empty database on the server of `url`; its URL (tests stay independent of each other)."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
