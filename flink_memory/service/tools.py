"""The memory as MCP tools (the official `mcp` SDK): recall, show_memory, remember, forget_memory, the same
MemoryService methods the HTTP API calls, for the agents the caller's key grants.

Over streamable HTTP (/mcp, stateless: every request carries its key) the grant is the one the Guard put in
the request's scope; over stdio (`flink-memory serve --stdio`, a local assistant) it is every agent, or the
one `--agent` names. `agent_id` may be left out when the grant names exactly one agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from flink_memory.records import Message
from flink_memory.service.memory import Everyone, Grant, MemoryService, ServiceError
from flink_memory.service.models import MAX_K, MAX_QUESTION, Mode, RecallRequest

INSTRUCTIONS = ("Long-term memory of an agent. recall(question) finds what you remembered; show_memory() is the "
                "summary of everything; remember(text) stores a fact or note (the memory job takes it within "
                "seconds); forget_memory(id) retracts one memory, forget_memory() everything.")


def build_mcp(service: MemoryService, stdio_grant: Grant | None = None) -> MCPServer:
    """The MCP server; `stdio_grant` is the grant of a stdio session (HTTP requests carry their own)."""
    logging.getLogger("mcp").setLevel(logging.WARNING)  # its INFO lines repeat tool errors and arguments
    server = MCPServer("flink-memory", instructions=INSTRUCTIONS, log_level="WARNING")

    def answer(call: Callable[..., BaseModel], *args: Any) -> dict[str, Any]:
        """A tool's answer as JSON; a ServiceError becomes a tool error with its reason (HTTP's detail)."""
        try:
            return call(*args).model_dump(mode="json")
        except ServiceError as exc:
            raise ToolError(str(exc)) from None

    def caller(ctx: Context, agent_id: str | None) -> tuple[Grant, str]:
        request = ctx.request_context.request
        if request is None:  # stdio
            grant: Any = stdio_grant or Everyone()
        else:  # streamable HTTP: the Guard checked the key
            grant = request.scope.get("state", {}).get("grant")
            if grant is None:
                raise ToolError("no valid key")
        if agent_id is None:
            default = getattr(grant, "default_agent", lambda: None)()
            if default is None:
                raise ToolError("name the agent (agent_id): the caller may use more than one")
            agent_id = default
        if not grant.allows(agent_id):  # (the caller knows its own agents: this tells it nothing about others)
            whose = "this session's" if request is None else "this key's"
            raise ToolError(f"agent {agent_id!r} is not among {whose} agents")
        return grant, agent_id

    @server.tool()
    def recall(question: Annotated[str, Field(min_length=1, max_length=MAX_QUESTION)],
               ctx: Context,
               k: Annotated[int, Field(ge=1, le=MAX_K)] = 5,
               mode: Mode = "hybrid",
               agent_id: str | None = None,
               diversity: Annotated[float | None, Field(ge=0.0, le=1.0)] = None) -> dict[str, Any]:
        """What the memory holds about a question: the best matching memories and summaries, best first, each
        covering distinct memory (diversity 0..1; a hit's folds name what it stands for)."""
        grant, agent = caller(ctx, agent_id)
        return answer(service.recall, grant, agent, RecallRequest(question=question, k=k, mode=mode,
                                                                  diversity=diversity))

    @server.tool()
    def show_memory(ctx: Context, agent_id: str | None = None) -> dict[str, Any]:
        """The agent's current memory: one summary of everything it remembers (null before the first)."""
        grant, agent = caller(ctx, agent_id)
        return answer(service.memory, grant, agent)

    @server.tool()
    def remember(ctx: Context,
                 text: str | None = None,
                 messages: list[Message] | None = None,
                 id: str | None = None,
                 ts: str | None = None,
                 metadata: dict[str, Any] | None = None,
                 agent_id: str | None = None) -> dict[str, Any]:
        """Remember a fact or note (`text`) or a conversation (`messages`); the same `id` again updates it.
        Answers the record id; the memory job makes it searchable within seconds."""
        grant, agent = caller(ctx, agent_id)
        record: dict[str, Any] = {"id": id, "ts": ts, "metadata": metadata}
        if text is not None:
            record["text"] = text
        if messages is not None:
            record["messages"] = [m.source_dict() for m in messages]
        return answer(service.remember, grant, agent, record)

    @server.tool()
    def forget_memory(ctx: Context, id: str | None = None, agent_id: str | None = None) -> dict[str, Any]:
        """Retract the memory with this `id`; without an id, forget everything the agent remembers."""
        grant, agent = caller(ctx, agent_id)
        if id is not None:
            return answer(service.delete, grant, agent, id)
        return answer(service.forget, grant, agent)

    return server
