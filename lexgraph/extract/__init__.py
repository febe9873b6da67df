"""Reading, normalising, chunking, embedding and keyword extraction: what each document yields."""
