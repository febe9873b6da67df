"""One dynamic partition per document, keyed by lexgraph.ids.document_id of its inbox path."""
import warnings

import dagster as dg

# single_run backfill policy is marked beta; we depend on it deliberately for batching.
warnings.filterwarnings("ignore", category=dg.BetaWarning)

documents = dg.DynamicPartitionsDefinition(name="documents")

# Per-document assets accept a range of partitions in one run, so a folder of N files is one run
# with one model load, not N processes.
batched = dg.BackfillPolicy.single_run()

# Kùzu admits a single writer process; every asset or op that writes the graph joins this pool.
GRAPH_WRITER_POOL = "kuzu_writer"
