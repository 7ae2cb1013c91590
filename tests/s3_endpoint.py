"""A local S3 endpoint for tests: moto's server (the test extra's moto[server]) in a process of its own on
localhost, a bucket in it, and the settings that point Flink's S3 plugin (flink-s3-fs-hadoop, fetched by
tests/s3/pom.xml into .jars/plugins/) and the applier (pyarrow.fs: the AWS_* variables) at it."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from cluster import ROOT, free_port

PLUGIN = ROOT / ".jars" / "plugins" / "s3-fs-hadoop"  # (make test: mvn -f tests/s3/pom.xml package)
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "flink-memory-test", "AWS_SECRET_ACCESS_KEY": "flink-memory-test",
               "AWS_REGION": "us-east-1"}


class LocalS3:
    def __init__(self, workdir: Path, bucket: str = "flink-memory") -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        self.log = workdir / "moto.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a process that reads the bucket through pyarrow (the applier, the tests) needs."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    @property
    def flink_settings(self) -> dict[str, Any]:
        """The cluster's settings for Flink's S3 plugin (docs/deployment.md, "S3")."""
        return {"s3.endpoint": self.endpoint, "s3.path.style.access": True,
                "s3.access-key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
                "s3.secret-key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                "fs.s3a.endpoint.region": CREDENTIALS["AWS_REGION"]}

    def url(self, path: str) -> str:
        return f"s3://{self.bucket}/{path}"

    def start(self) -> LocalS3:
        if not (PLUGIN.is_dir() and any(PLUGIN.glob("flink-s3-fs-hadoop-*.jar"))):
            raise AssertionError(f"no S3 plugin in {PLUGIN}: run `mvn -q -f tests/s3/pom.xml package`")
        with self.log.open("w") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                             str(self.port)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise AssertionError(f"moto's S3 server did not start:\n{self.log.read_text()[-2000:]}") from None
                time.sleep(0.3)
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name=CREDENTIALS["AWS_REGION"],
                     aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"]).create_bucket(Bucket=self.bucket)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def __enter__(self) -> LocalS3:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()

