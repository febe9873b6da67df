"""Per-document stages and the corpus-wide KET-RAG build: KNN graph, PageRank, skeleton, keyword index."""
