"""lexgraph: the engine (no Dagster here; see DESIGN.md §2)."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lexgraph")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0.0.0+checkout"
