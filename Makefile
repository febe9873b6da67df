# lexgraph: two set-up commands, `make demo` and `make test`, both create the virtualenv if missing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export LEXGRAPH_HOME ?= $(CURDIR)/.lexgraph
export HF_HUB_OFFLINE := 1
SHARED ?= ../shared

.PHONY: install bytecode demo test test-fast dev dev-prod bench bench-musique bench-router bench-ingest bench-scale bench-incremental bench-extraction bench-extraction-cost bench-build-ratio bench-graph-backend bench-serve bench-sensor bench-embedder bench-query-scale bench-generalize bench-combined clean

# torch is installed first and pinned: the local CPU build; an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: bytecode

# The project's modules compiled ahead (compileall skips those up to date): where PYTHONDONTWRITEBYTECODE is set,
# as on these machines, every process compiled them from source again, 0.7 s of a no-change `lexgraph ingest`
# of the 100k bench index (docs/decisions/process-start.md). A module edited later is compiled in memory until the
# next make.
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 lexgraph orchestration assets resources benchmarks deploy >/dev/null

$(DAGSTER_HOME)/dagster.yaml: orchestration/dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp orchestration/dagster.yaml $@

demo: bytecode $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/lexgraph ingest sample/corpus
	$(BIN)/lexgraph status
	$(BIN)/lexgraph search "Who is the CEO of the engine supplier Kestrel?" -k 3

# two workers (pytest-xdist), one test file per worker at a time: most tests wait on Dagster runs and
# subprocesses, so two at once cut the wall time on 2 cores by a third (984 s → 666 s, measured 2026-11-30)
test: bytecode
	$(BIN)/pytest -q -n 2 --dist loadfile

# the fast subset, under 3 minutes: no index built, no Dagster instance, no other process, no PostgreSQL (the
# markers are in pyproject.toml, tests/conftest.py gives them); `make test` stays the whole suite
test-fast: bytecode
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not slow"

dev: bytecode $(DAGSTER_HOME)/dagster.yaml
	LEXGRAPH_INBOX=$${LEXGRAPH_INBOX:-sample/corpus} $(BIN)/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

# The production instance (orchestration/dagster.prod.yaml): Dagster's storage in PostgreSQL, the queued run
# coordinator with the kuzu_writer pool, run monitoring and run retries. Needs DAGSTER_PG_HOST, DAGSTER_PG_USER,
# DAGSTER_PG_PASSWORD and DAGSTER_PG_DB (DAGSTER_PG_PORT defaults to 5432); the database must exist, Dagster
# creates its tables. Its DAGSTER_HOME (compute logs, the instance file) is .dagster_prod.
DAGSTER_PROD_HOME ?= $(CURDIR)/.dagster_prod

$(DAGSTER_PROD_HOME)/dagster.yaml: orchestration/dagster.prod.yaml
	mkdir -p $(DAGSTER_PROD_HOME)
	cp orchestration/dagster.prod.yaml $@

dev-prod: bytecode $(DAGSTER_PROD_HOME)/dagster.yaml
	@: "$${DAGSTER_PG_HOST:?is not set (make dev-prod)}" "$${DAGSTER_PG_USER:?is not set (make dev-prod)}" \
	   "$${DAGSTER_PG_PASSWORD?is not set (make dev-prod; empty for a server that needs none)}" \
	   "$${DAGSTER_PG_DB:?is not set (make dev-prod)}"
	DAGSTER_HOME=$(DAGSTER_PROD_HOME) DAGSTER_PG_PORT=$${DAGSTER_PG_PORT:-5432} \
	  LEXGRAPH_INBOX=$${LEXGRAPH_INBOX:-sample/corpus} $(BIN)/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

bench: $(STAMP)
	$(BIN)/lexgraph bench --corpus $(SHARED)/datasets/lihua-world/LiHuaWorld.zip --questions $(SHARED)/datasets/lihua-world/questions.dev.json

bench-musique: $(STAMP)
	$(BIN)/lexgraph bench --corpus $(SHARED)/datasets/musique/corpus/document.txt --questions $(SHARED)/datasets/musique/questions.dev.json --budget 12000

bench-router: $(STAMP)
	$(BIN)/python -m benchmarks.bench_router --shared $(SHARED)

bench-ingest: $(STAMP)
	$(BIN)/python -m benchmarks.bench_ingest --corpus $(SHARED)/datasets/lihua-world/LiHuaWorld.zip

bench-scale: bytecode
	$(BIN)/python -m benchmarks.bench_scale

bench-incremental: $(STAMP)
	$(BIN)/python -m benchmarks.bench_incremental --corpus $(SHARED)/datasets/lihua-world/LiHuaWorld.zip

# the KET-RAG table (issue 40): retrieval from the offline extraction and from GPT-3.5's recorded extractions at
# β = 0.2 ... 1.0, with the LLM calls and tokens of each, on HippoRAG's MuSiQue passages; indexes kept under
# $(LEXGRAPH_HOME)/bench/extraction-table. LIMIT=N: the first N questions and their passages only (minutes).
MUSIQUE_HIPPORAG := $(SHARED)/datasets/musique-hipporag
bench-extraction: $(STAMP)
	$(BIN)/python -m benchmarks.bench_extraction_table --corpus $(MUSIQUE_HIPPORAG)/corpus \
	  --questions $(MUSIQUE_HIPPORAG)/questions.dev.json --recording $(MUSIQUE_HIPPORAG)/openie_gpt-3.5-turbo-1106.json \
	  $(if $(LIMIT),--limit $(LIMIT))

# a full `lexgraph ingest` of LiHua-World with this checkout against REF's code (default: the commit before the
# spaCy extractor), alternating, as a ratio (issue 40: at most 1.25x)
REF ?= 36df744
REPEATS ?= 3
bench-build-ratio: $(STAMP)
	$(BIN)/python -m benchmarks.bench_build_ratio --ref $(REF) --repeats $(REPEATS) --corpus $(SHARED)/datasets/lihua-world/LiHuaWorld.zip

# the same full LiHua-World ingest on Kùzu and on LadybugDB (LEXGRAPH_GRAPH_BACKEND=ladybug), alternating, as a
# ratio, with each graph's open-and-lock time; then the SIMILAR diff of one added document written into a
# 100,000-chunk graph on each, alternating, as a ratio (graphs built once, cached under .lexgraph/bench/similar-diff-*)
bench-graph-backend: $(STAMP)
	$(BIN)/python -m benchmarks.bench_build_ratio --variant LEXGRAPH_GRAPH_BACKEND=ladybug --corpus $(SHARED)/datasets/lihua-world/LiHuaWorld.zip
	$(BIN)/python -m benchmarks.bench_similar_diff --chunks 100000 --repeats 3

# what LLM extraction costs by β, adding one document, and offline extraction against embedding throughput
# (issue 8), with the synthetic test LLM on LiHua-World
bench-extraction-cost: $(STAMP)
	$(BIN)/python -m benchmarks.bench_extraction --corpus $(SHARED)/datasets/lihua-world/LiHuaWorld.zip --embed-repeats 1

# the routed and answered question out of corpus: four dev corpora (each indexed once, cached), thresholds chosen
# leave-one-corpus-out and 5-fold, the sample's paraphrases and unanswerable questions (docs/BENCHMARKS.md)
bench-generalize: bytecode
	$(BIN)/python -m benchmarks.bench_generalize --shared $(SHARED)

# the four dev corpora in one cached index, each corpus's recall on both query backends against alone (ALONE="memory=R.json lance=R.json ...")
bench-combined: bytecode
	$(BIN)/python -m benchmarks.bench_combined --shared $(SHARED) $(foreach r,$(ALONE),--alone $(r))

# needs the LiHua-World index that `make bench` caches; serves it read-only
bench-serve: $(STAMP)
	$(BIN)/python -m benchmarks.bench_serve --home .lexgraph/bench/lihuaworld-aac215cda60d/index --questions $(SHARED)/datasets/lihua-world/questions.dev.json

# the inbox sensor over 10,000 small files on a temporary SQLite instance (docs/BENCHMARKS.md)
bench-sensor: $(STAMP)
	$(BIN)/python -m benchmarks.bench_sensor

# torch against the default embedding backend: throughput on the same texts, then a full LiHua-World build each
bench-embedder: $(STAMP)
	$(BIN)/python -m benchmarks.bench_embedder --corpus $(SHARED)/datasets/lihua-world/LiHuaWorld.zip --questions $(SHARED)/datasets/lihua-world/questions.dev.json

# lexgraph serve over synthetic 100k- and 1M-chunk indexes through LanceDB's search indexes (built once, cached)
bench-query-scale: $(STAMP)
	$(BIN)/python benchmarks/bench_query_scale.py --chunks 100000
	$(BIN)/python benchmarks/bench_query_scale.py --chunks 1000000

clean:
	rm -rf .lexgraph .dagster_home
