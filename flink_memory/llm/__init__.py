"""LLM access: the OpenAI-compatible client, the embedded llama.cpp server and the replay journal."""

from flink_memory.llm.client import ChatRequest, ChatResult, LLMCallError, LLMClient, UsageStats

__all__ = ["ChatRequest", "ChatResult", "LLMCallError", "LLMClient", "UsageStats"]
