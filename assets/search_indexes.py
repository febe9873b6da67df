"""The corpus's LanceDB search indexes (ANN vectors, full text, ids, keyword links), built once the corpus
reaches LEXGRAPH_LANCE_THRESHOLD chunks so that query processes need not load it (lexgraph.query.lance_backend).
The engine side is lexgraph.indexing.corpus_update.update_search_indexes; this asset shows what it did."""

import dagster as dg

from assets.catalog import CORPUS, spec_kwargs
from assets.partitions import GRAPH_WRITER_POOL
from assets.skeleton import keyword_index, skeleton_selection
from assets.corpus_result import corpus_result
from lexgraph.indexing import corpus_update
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
