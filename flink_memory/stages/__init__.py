"""The stage cores (planner, batcher, merger) and how one is run: plain Python, no PyFlink.

protocol.py is what every core implements, driver.py loads a key's state, runs a core and commits it, calls.py
holds the effects a core asks for, messages.py what flows between stages (the memory log the stages write is
flink_memory.memory_log).
"""
