"""Benchmark metrics, question files and the retrieval benchmark."""
