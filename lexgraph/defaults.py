"""The default of every setting, and the values some settings allow, at the bottom of the layers.

lexgraph.settings gives these when a variable is unset, and the stages that have a default of their own (the KNN
graph's k, the skeleton's beta, the embedder's model and backend, the extraction schema's entity types, the LLM
client's patience) import it from here, so a default is written once and nothing below the stages imports them.
"""
from __future__ import annotations

# --- the index: chunks and their vectors (lexgraph.extract.embedder) ------------------------------------------------
DEFAULT_EMBED_MODEL = "all-MiniLM-L6-v2"
TORCH, ONNX, ONNX_INT8 = "torch", "onnx", "onnx-int8"
EMBED_BACKENDS = (TORCH, ONNX, ONNX_INT8)
# Adopted after docs/decisions/embedder.md: torch's vectors (cosine 1.0000),
# a fraction of the time.
DEFAULT_EMBED_BACKEND = ONNX
DEFAULT_CHUNK_TOKENS = 200

# --- the corpus build (lexgraph.indexing) ----------------------------------------------------------------------------
# Chosen by measurement (LiHua-World: 1,401 chunks of <=150 words, all-MiniLM-L6-v2; and
# benchmarks/bench_scale.py). From K=8 the semantic graph alone is connected. Going from 10 to 20
# cuts the old chunks whose selection flips when 10 documents are added from ~21 to ~16 (each
# newly selected chunk is an LLM call) and lifts the β=0.8 selection from 0.87 to 0.94 Jaccard
# of K=30's, for ~2x edges but ~+6% build time at 50k chunks (the HNSW build dominates).
# Beyond 20 neither figure improves.
DEFAULT_KNN_K = 20
KNN_MODES = ("auto", "exact", "approx")
# The share of chunks (top by PageRank) in the skeleton, KET-RAG's β.
DEFAULT_BETA = 0.8

# --- extraction (lexgraph.extract.schemas, lexgraph.extract.llm_config) ---------------------------------------------
DEFAULT_ENTITY_TYPES: tuple[str, ...] = (
    "person", "organization", "location", "vessel", "contract", "product", "event", "date", "money", "other",
)
# The chat model asked when an endpoint is configured without LEXGRAPH_LLM_MODEL.
DEFAULT_LLM_MODEL = "gpt-4o-mini"
LLM_MODES = ("json", "tools")
DEFAULT_LLM_MODE = "json"
DEFAULT_LLM_TIMEOUT = 60.0             # seconds per request
DEFAULT_LLM_MAX_RETRIES = 4            # transport retries after the first request (429, 5xx, timeouts)
DEFAULT_LLM_VALIDATION_RETRIES = 2     # instructor re-asks after a malformed or invalid answer
DEFAULT_LLM_BACKOFF = 1.0              # first backoff, seconds; doubles each retry
DEFAULT_LLM_BACKOFF_MAX = 30.0         # cap on any wait, Retry-After included
DEFAULT_LLM_BREAKER_FAILURES = 5       # consecutive failed calls that open the circuit breaker; 0: no breaker
DEFAULT_LLM_BREAKER_COOLDOWN = 60.0    # open this long, then one probe call; doubles after a failed probe
DEFAULT_LLM_BREAKER_COOLDOWN_MAX = 900.0  # cap on the doubled cool-down
PII_MASKING = ("off", "on")

# --- the query side (lexgraph.query) ---------------------------------------------------------------------------------
# `memory` loads every chunk vector, BM25 and keyword link into the process (fastest on small corpora), `lance`
# queries LanceDB's ANN and full-text indexes, `auto` picks lance from LEXGRAPH_LANCE_THRESHOLD chunks on (the
# ingestion's search_indexes asset builds those indexes from there).
QUERY_BACKENDS = ("auto", "memory", "lance")
# The embedded graph database: Kùzu (the design's, its last release 0.11.3) or LadybugDB, its maintained fork
# (`ladybug` on PyPI, same API); docs/SCALING.md, "The graph store".
GRAPH_BACKENDS = ("kuzu", "ladybug")
DEFAULT_LANCE_THRESHOLD = 20_000
# torch intra-op threads in `lexgraph serve`. Requests already run in parallel (one thread each); a second
# intra-op thread per request only waits for a core, which on the 2-core machine made answers ~5x
# slower under load (docs/decisions/serving.md). Override for a machine with cores to spare.
DEFAULT_SERVE_TORCH_THREADS = 1
# The questions of the retrieval_benchmark asset.
DEFAULT_QUESTIONS = "sample/questions.json"
