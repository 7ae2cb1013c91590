"""`flink-memory serve`: an agent's memory as a service: the HTTP JSON API under /v1 (OpenAPI at
/openapi.json) and MCP tools (streamable HTTP at /mcp, or stdio), over the store the job writes.

- memory.py: what the service does (reads from the store; writes as input records of the running job);
- models.py: request and answer bodies; keys.py: service keys (digests) and the agents they grant;
- writer.py: the job's input (a followed directory or a Kafka topic);
- guard.py: authentication, body limits and the access log; http.py: the API; tools.py: the MCP tools;
- server.py: the process (uvicorn with timeouts, or MCP over stdio).
"""
