"""Stores: Parquet extract files, LanceDB vectors, the embedded Kùzu graph."""
