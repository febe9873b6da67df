"""The corpus's LanceDB search indexes (ANN vectors, full text, ids, keyword links), built once the corpus
reaches LEXGRAPH_LANCE_THRESHOLD chunks so that query processes need not load it (lexgraph.query.lance_backend).
The engine side is lexgraph.storage.lance_indexes; this asset only decides when and records what it did."""

import dagster as dg

from assets.catalog import CORPUS, spec_kwargs
from assets.partitions import GRAPH_WRITER_POOL
from assets.skeleton import keyword_index, skeleton_selection
from lexgraph.indexing import corpus_keywords, corpus_state
from lexgraph.storage import lance_indexes
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
    settings, store, files = index.settings(), lancedb.get(), index.corpus_files()
    indexed = store.indexed_hashes()  # the catalog this update is made from
    digest = corpus_state.catalog_digest(indexed)
    chunks = store.count("chunks")
    common = {"chunks": chunks, "threshold": settings.lance_threshold, "query_backend": settings.query_backend,
              "catalog_digest": digest}
    if chunks == 0 or not settings.uses_lance(chunks):
        context.log.info(f"{chunks} chunks, below LEXGRAPH_LANCE_THRESHOLD={settings.lance_threshold}: queries "
                         "load the index into memory; no search indexes built")
        files.record_built(corpus_state.SEARCH_INDEXES, digest, settings)
        return dg.MaterializeResult(metadata={**common, "decision": "below threshold: none"})
    extract = index.extract_store()
    links = lance_indexes.DocumentLinks(indexed, lambda docs: corpus_keywords.keyword_chunk_links(extract, docs))
    report = lance_indexes.refresh(store, files.root, links)
    files.record_built(corpus_state.SEARCH_INDEXES, digest, settings)  # last: a crash before it leaves the step out of step
    context.log.info(f"search indexes: {report['decision']} over {chunks} chunks in {report['seconds']} s")
    return dg.MaterializeResult(metadata={
        **common, "decision": report["decision"], "seconds": report["seconds"],
        "build_seconds": dg.MetadataValue.json(report["build_seconds"]),
        "keyword_links": dg.MetadataValue.json(report["keyword_links"]),
        "unindexed_rows": report["unindexed_rows"],
        "state": dg.MetadataValue.path(str(lance_indexes.state_path(files.root)))})
