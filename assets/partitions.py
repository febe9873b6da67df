"""One dynamic partition per document, keyed by lexgraph.ids.document_id of its inbox path."""
import warnings
import weakref

import dagster as dg

# single_run backfill policy is marked beta; we depend on it deliberately for batching.
warnings.filterwarnings("ignore", category=dg.BetaWarning)

documents = dg.DynamicPartitionsDefinition(name="documents")

# Per-document assets accept a range of partitions in one run, so a folder of N files is one run
# with one model load, not N processes.
batched = dg.BackfillPolicy.single_run()

# Kùzu admits a single writer process; every asset or op that writes the graph joins this pool.
GRAPH_WRITER_POOL = "kuzu_writer"


_RUN_KEYS: "weakref.WeakKeyDictionary[dg.OpExecutionContext, tuple[str, ...]]" = weakref.WeakKeyDictionary()


def step_partition_keys(context: dg.OpExecutionContext) -> tuple[str, ...]:
    """The step's partition keys, read once per step. Dagster's `context.partition_keys` asks the instance
    whether both ends of the range exist on every read (on a SQLite instance, two queries and two
    connections each time), and the per-document assets read it several times per step."""
    keys = _RUN_KEYS.get(context)
    if keys is None:
        keys = _RUN_KEYS[context] = tuple(context.partition_keys)
    return keys
