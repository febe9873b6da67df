"""Defer the part of LanceDB's import that an embedded index never uses.

`import lancedb` imports `lance_namespace`, which takes ~100 model classes from the generated REST client
`lance_namespace_urllib3_client`; that package's own `__init__` also builds every API class of the REST
namespace service (about 0.45 s of each command's 1 s LanceDB import on this machine, for a client lexgraph
never calls: its tables are local paths or object-storage URIs opened by LanceDB's native client).

`defer_rest_client_package` registers the package without running its `__init__`, so `import
<package>.models` loads the models alone; the first use of anything the `__init__` defines (`ApiClient`,
`TableApi`, …) runs it then, so code that does use the REST client still gets the whole package.
"""
from __future__ import annotations

import importlib.util
import sys
import types

REST_CLIENT = "lance_namespace_urllib3_client"


class _DeferredPackage(types.ModuleType):
    """A package whose `__init__` runs on the first lookup of a name it has not got yet."""

    def __getattr__(self, name: str):
        if name.startswith("__") or self.__dict__.get("_deferred_ran"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        self.__dict__["_deferred_ran"] = True
        self.__spec__.loader.exec_module(self)  # the real __init__, in this module's namespace
        return getattr(self, name)


def defer_rest_client_package(name: str = REST_CLIENT) -> bool:
    """Register `name` as a deferred package unless it is imported already or not installed as a package.
    -> whether it was deferred."""
    if name in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return False
    package = _DeferredPackage(name)
    package.__spec__, package.__loader__ = spec, spec.loader
    package.__path__, package.__file__ = list(spec.submodule_search_locations), spec.origin
    package.__package__ = name
    sys.modules[name] = package
    return True
