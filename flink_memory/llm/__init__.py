"""LLM I/O: the OpenAI-compatible client, the embedded llama.cpp server, the replay journal, the call pool
and the model tokenizers. The request value types they exchange with the core are `flink_memory.requests`."""
