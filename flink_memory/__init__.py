"""flink-memory: streaming long-term memory for AI agents on Apache Flink.

The job (`flink_memory.flink.pipeline.build_job`, `flink-memory run`) batches each agent's memory items, asks an
LLM for one summary per batch and merges them into a global summary per agent; the store
(`flink_memory.store.open_store`) and the service (`flink-memory serve`, `flink_memory.client`) serve it back.
docs/architecture.md maps the package. Importing it loads nothing: each module imports what it needs.
"""
