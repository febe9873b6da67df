"""Bring a pristine index written before fa27705 to what the current search_indexes asset keeps: the
per-document record of the keyword_links table, and the keyword ANN's training size (the index exists)."""
import sys, time
from pathlib import Path
from lexgraph.indexing import corpus_index as ci
from lexgraph.settings import Settings
from lexgraph.storage import lance_indexes as li
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.vector_store import KEYWORDS, VectorStore
s = Settings.from_env(home=sys.argv[1])
store, extract, corpus = VectorStore(s.lance_uri), ExtractStore(s.extract_dir), Path(s.index_dir) / "corpus"
t = time.time()
print(li.update_keyword_links(store, corpus, li.DocumentLinks(store.indexed_hashes(), lambda d: ci.keyword_chunk_links(extract, d))))
state = li.read_state(corpus)
state["keyword_trained_rows"] = store.db.open_table(KEYWORDS).count_rows()
li._write_state(corpus, state)
print("done", round(time.time() - t, 1), "s", state["keyword_trained_rows"])
