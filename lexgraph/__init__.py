"""lexgraph: the engine (no Dagster here; see DESIGN.md §2)."""
from importlib.metadata import PackageNotFoundError, version

from lexgraph.deferred_imports import defer_rest_client_package

defer_rest_client_package()  # before anything imports lancedb: see lexgraph.deferred_imports

try:
    __version__ = version("lexgraph")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0.0.0+checkout"
