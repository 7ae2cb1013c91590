"""An agent loop with long-term memory from `flink-memory serve`, over HTTP (MemoryClient) or MCP (the official
SDK's client). Copy it and put your model where `answer` is.

Each turn: recall what the memory holds about the user's message, answer with it in the prompt, remember the
exchange. The running job summarizes what is remembered; `show_memory` / `memory()` is the summary of it all.

    flink-memory keys add agent-0 --keys keys.json                      # prints a key once
    flink-memory run --input inbox/ --follow --output out/ &            # the job: the only writer of memory
    flink-memory serve --store out/memory.sqlite --input inbox/ --keys keys.json &
    FLINK_MEMORY_KEY=fmk_... python samples/agent_loop.py --agent agent-0            # over HTTP
    FLINK_MEMORY_KEY=fmk_... python samples/agent_loop.py --agent agent-0 --mcp      # over MCP
"""

from __future__ import annotations

import argparse
import asyncio
import os

from flink_memory.client import MemoryClient, MemoryServiceError

TURNS = ["My dog is a beagle named Rex.", "I paid 300 EUR for the boat.", "What is the name of my dog?"]


def answer(message: str, memories: list[str]) -> str:
    """Your model goes here: the user's message with the recalled memories in its prompt."""
    context = "\n".join(f"- {m}" for m in memories) or "- (nothing yet)"
    return f"(answering {message!r} with what I remember:\n{context})"


def loop_over_http(url: str, key: str | None, agent: str) -> None:
    memory = MemoryClient(url, key=key, agent_id=agent)
    for message in TURNS:
        try:
            memories = [hit.text for hit in memory.recall(message, k=5)]
        except MemoryServiceError as exc:
            if exc.status != 404:  # 404: this agent has no memory yet
                raise
            memories = []
        print(answer(message, memories))
        accepted = memory.remember(messages=[{"role": "user", "content": message}])
        print(f"  remembered as {accepted.id}")


async def loop_over_mcp(url: str, key: str | None, agent: str) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"authorization": f"Bearer {key}"} if key else {}
    transport = streamable_http_client(f"{url}/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=30))
    async with Client(transport) as memory:
        for message in TURNS:
            found = await memory.call_tool("recall", {"question": message, "agent_id": agent})
            hits = [] if found.is_error else found.structured_content["hits"]
            print(answer(message, [hit["text"] for hit in hits]))
            stored = await memory.call_tool("remember", {"text": message, "agent_id": agent})
            print(f"  remembered as {stored.structured_content['id']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8765")
    parser.add_argument("--agent", default="agent-0")
    parser.add_argument("--mcp", action="store_true", help="through the MCP tools instead of the HTTP API")
    args = parser.parse_args()
    key = os.environ.get("FLINK_MEMORY_KEY")
    if args.mcp:
        asyncio.run(loop_over_mcp(args.url, key, args.agent))
    else:
        loop_over_http(args.url, key, args.agent)


if __name__ == "__main__":
    main()
