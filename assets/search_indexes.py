"""The corpus's LanceDB search indexes (ANN vectors, full text, ids, keyword links), built once the corpus
reaches LEXGRAPH_LANCE_THRESHOLD chunks so that query processes need not load it (lexgraph.query.lance_backend).
The engine side is lexgraph.indexing.corpus_update.update_search_indexes; this asset shows what it did."""

import dagster as dg

from assets.catalog import CORPUS, spec_kwargs
from assets.partitions import GRAPH_WRITER_POOL
from assets.skeleton import keyword_index, skeleton_selection
from assets.corpus_result import corpus_result
from assets.lexical import lexical_graph
from lexgraph.indexing import corpus_update
from lexgraph.query import graph_tables_step
from resources import IndexResource, LanceDBResource


@dg.asset(
    kinds={"python", "lancedb"}, **spec_kwargs("search_indexes", CORPUS), deps=[skeleton_selection, keyword_index],
    pool=GRAPH_WRITER_POOL,
    description="LanceDB's own search indexes over the chunk table, from LEXGRAPH_LANCE_THRESHOLD chunks on (or "
    "always with LEXGRAPH_QUERY_BACKEND=lance): an IVF_PQ vector index (cosine; IVF_FLAT below 10,000 chunks), a "
    "native full-text index on the text, a BTREE on chunk_id, and the keyword→chunk links as a table. Rows "
    "written after an index was built are searched flat until folded in: optimized once they pass 5 % of the "
    "table, retrained when the table has doubled or halved. Runs after skeleton_selection and keyword_index.",
)
def search_indexes(context: dg.AssetExecutionContext, index: IndexResource,
                   lancedb: LanceDBResource) -> dg.MaterializeResult:
    outcome = corpus_update.update_search_indexes(index.corpus_files(), index.extract_store(), lancedb.get(),
                                                  index.settings())
    figures = outcome.figures
    if "seconds" in figures:
        context.log.info(f"search indexes: {figures['decision']} over {figures['chunks']} chunks in {figures['seconds']} s")
    else:
        context.log.info(f"{figures['chunks']} chunks, below LEXGRAPH_LANCE_THRESHOLD={figures['threshold']}: queries "
                         "load the index into memory; no search indexes built")
    return corpus_result(context, outcome)


@dg.asset(
    kinds={"python", "parquet", "lancedb"}, **spec_kwargs("graph_tables", CORPUS), deps=[lexical_graph, search_indexes],
    pool=GRAPH_WRITER_POOL,
    description="The lexical graph as LanceDB tables for the lance query backend (from LEXGRAPH_LANCE_THRESHOLD "
    "chunks on, or always with LEXGRAPH_QUERY_BACKEND=lance): entities with their vectors, names, mentions and "
    "relations; statements with their vectors, topics and bridging facts and entities; each keyed by row with a "
    "BTREE, vectors with an ANN index from 20,000 rows. The graph and agentic routes read them a question at a "
    "time instead of loading the graph. Rewritten whole when the lexical graph changed; below the threshold none.",
)
def graph_tables(context: dg.AssetExecutionContext, index: IndexResource, lancedb: LanceDBResource) -> dg.MaterializeResult:
    outcome = graph_tables_step.update_graph_tables(index.corpus_files(), lancedb.get(), index.extract_store(),
                                                     index.settings())
    context.log.info(f"graph tables: {outcome.figures['decision']} ({outcome.figures['chunks']} chunks)")
    return corpus_result(context, outcome)
