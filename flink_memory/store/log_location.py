"""Where the memory log lives: the `memory/` folder of a job's output, on whatever filesystem Flink wrote it.

The applier reads the log through pyarrow.fs, which knows local paths, `file://`, `s3://` (credentials and
endpoint from the usual AWS settings: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL,
or query parameters of the URL such as `?endpoint_override=HOST:PORT&scheme=http`), `gs://` and `hdfs://`;
any other scheme an installed fsspec implementation serves (`memory://`, `abfs://`, ...) goes through fsspec.
A location that cannot be read (an unknown scheme, a missing bucket, refused credentials, a file where the
folder should be) raises LocationError with the reason, so the applier stops loudly instead of idling on it.

Applied files are retired: after `keep_applied_s` they leave `memory/` for `memory-applied/` (so each poll
lists only the recent part of the log, whatever its age) and are deleted from there after `retention_s`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

import pyarrow.fs as pafs

log = logging.getLogger(__name__)

LOG_DIR = "memory"  # the log's folder in the job's output directory
RETIRED_DIR = "memory-applied"  # applied files, kept there for store.log.retention_s


class LocationError(RuntimeError):
    """The log's location cannot be read: the message says where and why."""


@dataclass(frozen=True)
class LogFile:
    """A committed part file of the log (Flink's file sink hides in-progress files behind a leading dot)."""

    name: str
    mtime_ns: int  # when Flink committed it (renamed it into place)
    size: int


def resolve(output: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path inside it of an output location; LocationError for one nothing can read."""
    scheme = urlsplit(output).scheme if "://" in output else ""
    try:
        filesystem, path = pafs.FileSystem.from_uri(output if scheme else _absolute(output))
    except ValueError as exc:  # (pyarrow.ArrowInvalid: a scheme pyarrow does not know)
        try:
            import fsspec
            from pyarrow.fs import FSSpecHandler, PyFileSystem

            fs, path = fsspec.core.url_to_fs(output)
        except (ImportError, ValueError) as fsspec_exc:
            raise LocationError(f"cannot read {output}: no filesystem for the scheme {scheme!r} (pyarrow: {exc}; "
                                f"fsspec: {fsspec_exc}); use a path, file://, s3://, gs:// or hdfs://") from None
        return PyFileSystem(FSSpecHandler(fs)), path.rstrip("/")
    except OSError as exc:
        raise LocationError(f"cannot read {output}: {_first_line(exc)}") from None
    return filesystem, path.rstrip("/")


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


class LogLocation:
    """The memory log of the job whose output is `output` (a path or URL): list, read and retire its files."""

    def __init__(self, output: str, folder: str = LOG_DIR, retired: str = RETIRED_DIR) -> None:
        self.output = output
        self.fs, root = resolve(output)
        self.root = root
        self.path = f"{root}/{folder}" if root else folder
        self.retired_path = f"{root}/{retired}" if root else retired
        self.uri = f"{output.rstrip('/')}/{folder}"

    @classmethod
    def of(cls, log: LogLocation | str | os.PathLike[str]) -> LogLocation:
        """A location as given, or the one of a log folder's path (`<output>/memory`)."""
        if isinstance(log, LogLocation):
            return log
        text = os.fspath(log).rstrip("/")
        output, _, folder = text.rpartition("/")
        return cls(output or ".", folder)

    def check(self) -> bool:
        """Whether the log's folder exists yet; LocationError if the location cannot be read at all (for an
        object store: its bucket is missing or refused; anywhere: the output or its folder is a file)."""
        try:
            info = self.fs.get_file_info(self.path)
            if info.type == pafs.FileType.Directory:
                return True
            if info.type != pafs.FileType.NotFound:
                raise LocationError(f"cannot read {self.uri}: it is a file, not the log's folder")
            root = self.fs.get_file_info(self.root or ".")
            if root.type == pafs.FileType.File:
                raise LocationError(f"cannot read {self.output}: it is a file, not an output folder")
            bucket = self.root.split("/", 1)[0]
            if self.fs.type_name in ("s3", "gcs") and self.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise LocationError(f"cannot read {self.output}: the bucket {bucket!r} does not exist (or these "
                                    "credentials may not see it)")
            return False
        except OSError as exc:  # (refused credentials, an unreachable endpoint, a folder we may not read)
            raise LocationError(f"cannot read {self.uri}: {_first_line(exc)}") from None

    def committed(self) -> list[LogFile]:
        """The committed files in the log's folder, oldest commit first: one listing, no read."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        except OSError as exc:
            raise LocationError(f"cannot list {self.uri}: {_first_line(exc)}") from None
        found = [LogFile(_name(i.path), i.mtime_ns or 0, i.size or 0) for i in infos
                 if i.type == pafs.FileType.File and not _name(i.path).startswith(".")]
        return sorted(found, key=lambda f: (f.mtime_ns, f.name))

    def exists(self, name: str) -> bool:
        return bool(self.fs.get_file_info(f"{self.path}/{name}").type != pafs.FileType.NotFound)

    def read_bytes(self, name: str) -> bytes:
        with self.fs.open_input_stream(f"{self.path}/{name}") as stream:
            return stream.read()

    def retire(self, names: list[str]) -> None:
        """Move applied files out of the polled folder into the retired one (a rename on local disks; a copy
        and a delete on object stores). A file another applier retired first is skipped."""
        if not names:
            return
        self.fs.create_dir(self.retired_path, recursive=True)
        for name in names:
            try:
                self.fs.move(f"{self.path}/{name}", f"{self.retired_path}/{name}")
            except OSError:
                if self.exists(name):
                    raise

    def expire(self, older_than_ns: int) -> int:
        """Delete retired files committed before `older_than_ns` (epoch ns); returns how many."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.retired_path, allow_not_found=True))
        except OSError as exc:
            raise LocationError(f"cannot list {self.retired_path}: {exc}") from None
        gone = 0
        for info in infos:
            if info.type == pafs.FileType.File and (info.mtime_ns or 0) < older_than_ns:
                try:
                    self.fs.delete_file(info.path)
                    gone += 1
                except FileNotFoundError:
                    pass
        return gone


def _first_line(exc: BaseException) -> str:
    """An error's first line (libhdfs, for one, lists every place it looked for a JVM)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0] + (" (...)" if len(lines) > 1 else "")


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]
