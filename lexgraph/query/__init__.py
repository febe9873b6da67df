"""Retrieval channels over a built index."""
