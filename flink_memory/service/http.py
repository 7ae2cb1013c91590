"""The HTTP JSON API under /v1 (FastAPI: its OpenAPI document is generated from the models, at
/openapi.json), with MCP's streamable HTTP endpoint at /mcp in the same app, behind the Guard.

Handlers only translate: each calls one MemoryService method (in a worker thread: the store is synchronous)
and a ServiceError becomes its status with `{"detail": reason}`. Validation errors are 422 with a readable
reason, never a 500.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter
from starlette.exceptions import HTTPException

from flink_memory.ids import RECORD_ID_PATTERN
from flink_memory.service.guard import Guard
from flink_memory.service.keys import KeyRing
from flink_memory.service.memory import MemoryService, ServiceError
from flink_memory.service.models import (
    MAX_PAGE,
    Accepted,
    AgentsResponse,
    AgentStore,
    ChildrenResponse,
    Health,
    HistoryResponse,
    MemoryResponse,
    Problem,
    RecallRequest,
    RecallResponse,
    RememberRequest,
)
from flink_memory.service.page import add_page

VERSION = "1"


REASONS = {400: "the request is malformed", 401: "no valid key", 403: "this server is read-only",
           404: "no memory for this agent (an agent the key does not grant is answered the same)",
           408: "the body arrived too slowly", 413: "the body is over 1 MiB (or over the job's input topic's "
                                                 "message size limit)",
           422: "invalid request, or a record the job would dead-letter (the job's reason)",
           503: "the store or the job's input cannot be reached"}
# What each kind of operation can answer besides success: the Guard's body limits (400, 408, 413) on every
# one, the key (401, on a server with keys) on all but the health check
HEALTH = (400, 408, 413)
READ = (400, 401, 404, 408, 413, 422, 503)
WRITE = (400, 401, 403, 404, 408, 413, 422, 503)


def problems(codes: tuple[int, ...], keys: bool) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": Problem, "description": REASONS[code]} for code in codes if keys or code != 401}


def create_app(service: MemoryService, keyring: KeyRing | None, *, mcp_app: Any = None,
               body_timeout_s: float = 10.0) -> Guard:
    """The ASGI app: the API (and MCP at /mcp when `mcp_app`, a Starlette app from
    flink_memory.service.tools, is given), behind the Guard."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if mcp_app is not None:
                await stack.enter_async_context(mcp_app.router.lifespan_context(mcp_app))
            yield
        await run_in_threadpool(service.close)

    keys = keyring is not None
    read, write = problems(READ, keys), problems(WRITE, keys)
    app = FastAPI(title="flink-memory", version=VERSION, docs_url=None, redoc_url=None, lifespan=lifespan,
                  description="An agent's long-term memory: read (memory, recall) and write (memories, forget). "
                              "Writes are input records of the running job (202).")

    @app.exception_handler(ServiceError)
    async def service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{**e, "loc": [p for p in e.get("loc", ()) if p != "body"]} for e in exc.errors()]
        reason = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in errors[:5])
        return JSONResponse({"detail": reason or "invalid request"}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    def grant(request: Request) -> Any:
        return request.scope["state"]["grant"]

    @app.get("/v1/health", response_model=Health, responses=problems(HEALTH, keys), tags=["service"],
             openapi_extra={"security": []} if keys else None)
    def health() -> Health:
        """Whether the store can be read, and where writes go."""
        return service.health()

    @app.get("/v1/agents/{agent_id}/memory", response_model=MemoryResponse, responses=read, tags=["read"])
    def memory(agent_id: str, request: Request, tree: bool = False) -> MemoryResponse:
        """The agent's current memory (its live global summary); with tree=true the live tree below it."""
        return service.memory(grant(request), agent_id, tree)

    @app.post("/v1/agents/{agent_id}/recall", response_model=RecallResponse, responses=read, tags=["read"])
    def recall(agent_id: str, body: RecallRequest, request: Request) -> RecallResponse:
        """The agent's live memory units and summary nodes that best match a question, best first."""
        return service.recall(grant(request), agent_id, body)

    @app.get("/v1/agents", response_model=AgentsResponse, responses=read, tags=["read"])
    def agents(request: Request) -> AgentsResponse:
        """The agents with memory in the store that the key may read."""
        return service.agents(grant(request))

    @app.get("/v1/agents/{agent_id}/nodes/{node_id}/children", response_model=ChildrenResponse, responses=read,
             tags=["read"])
    def children(agent_id: str, node_id: str, request: Request, offset: int = Query(0, ge=0),
                 limit: int = Query(100, ge=1, le=MAX_PAGE)) -> ChildrenResponse:
        """A page of a live node's children, one level down the tree: nodes, or a batch node's memory units."""
        return service.children(grant(request), agent_id, node_id, offset, limit)

    @app.get("/v1/agents/{agent_id}/history", response_model=HistoryResponse, responses=read, tags=["read"])
    def history(agent_id: str, request: Request, offset: int = Query(0, ge=0),
                limit: int = Query(100, ge=1, le=MAX_PAGE)) -> HistoryResponse:
        """The agent's live units and nodes over time, newest first, with what changed marked."""
        return service.history(grant(request), agent_id, offset, limit)

    @app.get("/v1/agents/{agent_id}/store", response_model=AgentStore, responses=read, tags=["read"])
    def agent_store(agent_id: str, request: Request) -> AgentStore:
        """The store as the service sees it for this agent: rows, vectors and their model, the commits applied."""
        return service.agent_store(grant(request), agent_id)

    @app.post("/v1/agents/{agent_id}/memories", status_code=202, response_model=Accepted, responses=write,
              tags=["write"], openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"$ref": "#/components/schemas/RememberRequest"}}}}})
    async def remember(agent_id: str, request: Request) -> Accepted:
        """Remember (or update, by id) a memory: an input record without agent_id, validated as the job
        validates its input, handed to the running job."""
        body = await request.body()
        return await run_in_threadpool(service.remember, grant(request), agent_id, body)

    @app.delete("/v1/agents/{agent_id}/memories/{record_id}", status_code=202, response_model=Accepted,
                responses=write, tags=["write"])
    def delete(agent_id: str, request: Request,
               record_id: str = Path(json_schema_extra={"pattern": RECORD_ID_PATTERN, "maxLength": 512})) -> Accepted:
        """Retract a record: its text leaves every unit and summary once the job applies it."""
        return service.delete(grant(request), agent_id, record_id)

    @app.delete("/v1/agents/{agent_id}", status_code=202, response_model=Accepted, responses=write,
                tags=["write"])
    def forget(agent_id: str, request: Request) -> Accepted:
        """Forget everything of the agent."""
        return service.forget(grant(request), agent_id)

    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = original()
            components = schema["components"]["schemas"]
            remember = TypeAdapter(RememberRequest).json_schema(ref_template="#/components/schemas/{model}")
            components.update(remember.pop("$defs", {}))
            components["RememberRequest"] = remember
            if service.embedder is None:  # this server recalls by keyword only
                components["RecallRequest"]["properties"]["mode"]["enum"] = ["hybrid", "keyword"]
            if keys:  # (a server without keys answers every caller on loopback: no key to declare)
                schema["components"]["securitySchemes"] = {"key": {"type": "http", "scheme": "bearer"}}
                schema["security"] = [{"key": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    add_page(app)
    if mcp_app is not None:
        app.router.routes.extend(mcp_app.routes)
    return Guard(app, keyring, body_timeout_s=body_timeout_s)

