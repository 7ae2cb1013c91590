"""The memory service's MCP tools (`flink-memory serve`, /mcp) as a Flink Agents `@mcp_server` resource,
with the service key kept out of the agent plan, logs and checkpoints (invariant 5).

Flink Agents' MCPServer sends `headers` as given, and its plan holds them in clear (the plan JSON is in the
job graph). Its `auth` (an httpx.Auth, cloudpickled into the plan) is the way in: ServiceKeyAuth holds only where
the key is, a file (or an environment variable, for local runs: Flink logs environments), and reads it for each
request, as the connection is made; what is serialized (the plan, the tools' copies of the server) names the
file. (Flink Agents 0.3.1's Flink runtime builds every MCP server as its own MCPServer class, whatever the
descriptor names, so the key's place travels in `auth`, which that class restores.)

    @mcp_server
    @staticmethod
    def memory_tools() -> ResourceDescriptor:
        return memory_mcp_server("http://memory:8765/mcp", key_file="/run/secrets/memory_key")
"""

from __future__ import annotations

import base64
import os
from collections.abc import Generator
from pathlib import Path

import cloudpickle
import httpx
from flink_agents.api.resource import ResourceDescriptor


class KeyUnavailable(RuntimeError):
    """The service key's file or variable is missing or empty (the message names it, never a key)."""


class ServiceKeyAuth(httpx.Auth):
    """`Authorization: Bearer <key>` with the key read when a request is sent; it keeps no key."""

    def __init__(self, key_file: str | None = None, key_env: str | None = None) -> None:
        if (key_file is None) == (key_env is None):
            raise ValueError("name the service key's place: key_file=PATH or key_env=VARIABLE (one of them)")
        self.key_file, self.key_env = key_file, key_env

    def key(self) -> str:
        if self.key_file is not None:
            try:
                key = Path(self.key_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise KeyUnavailable(f"the service key file {self.key_file}: {exc.strerror}") from None
            where = f"the service key file {self.key_file}"
        else:
            key = os.environ.get(str(self.key_env), "").strip()
            where = f"the service key variable {self.key_env}"
        if not key:
            raise KeyUnavailable(f"{where} is empty")
        return key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.key()}"
        yield request

    def __repr__(self) -> str:
        place = f"key_file={self.key_file!r}" if self.key_file else f"key_env={self.key_env!r}"
        return f"ServiceKeyAuth({place})"


MCP_SERVER_CLASS = "flink_agents.integrations.mcp.mcp.MCPServer"


def memory_mcp_server(endpoint: str, *, key_file: str | None = None, key_env: str | None = None,
                      timeout: int = 30) -> ResourceDescriptor:
    """The descriptor of an `@mcp_server` resource for flink-memory's /mcp, its key read from a file (or a
    variable) per request. Flink Agents' own MCPServer class (its Flink runtime builds no other), with `auth` as
    MCPServer serializes it (cloudpickled): a ServiceKeyAuth, which holds where the key is, not the key."""
    auth = ServiceKeyAuth(key_file, key_env)
    return ResourceDescriptor(clazz=MCP_SERVER_CLASS, endpoint=endpoint, timeout=timeout,
                              auth=base64.b64encode(cloudpickle.dumps(auth)).decode())
