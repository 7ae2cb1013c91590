"""Token counting and request budgets, pure Python: the estimate, calibration, the counter, budgets, splits.

Every request builder (batch, part, merge, global, planner windows) sizes its request with one `Budget`, so a
configuration accepted at start never produces a request that does not fit. Tokenizers that need a model
file or a server (llama.cpp's /tokenize, Hugging Face, tiktoken) live in `flink_memory.llm.tokenizers`: this
package does no I/O, so the core can count without loading them.
"""
