"""The imports follow docs/ARCHITECTURE.md: the engine is Dagster-free (no lexgraph module imports the Dagster
layer, even lazily, and importing all of it leaves no dagster in sys.modules); no module imports a layer above
its own; and no modules import each other in a circle. Every import counts, at any depth: at module level, inside
a function, under `if TYPE_CHECKING:`, relative, and `importlib.import_module` / `__import__` with a literal name."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("dagster", "orchestration", "assets", "resources")
PACKAGES = ("lexgraph", "resources", "assets", "orchestration", "deploy", "benchmarks", "tests")

# The layers, bottom first (docs/ARCHITECTURE.md, "What each package may import"). A module may import its own
# layer and the layers below it. "name.*" is a package and everything in it; a plain name is that module only.
LAYERS = (
    ("base", ("lexgraph", "lexgraph.ids", "lexgraph.errors", "lexgraph.atomic_json", "lexgraph.faults",
              "lexgraph.progress", "lexgraph.deferred_imports", "lexgraph.defaults", "lexgraph.embedding_model",
              "lexgraph.settings", "lexgraph.ledger", "lexgraph.terms", "lexgraph.storage.*")),
    ("extract", ("lexgraph.extract.*", "lexgraph.inbox")),
    ("indexing", ("lexgraph.indexing.*",)),
    ("query", ("lexgraph.query.*",)),
    ("index facade", ("lexgraph.index",)),
    ("evaluation", ("lexgraph.evaluation.*",)),
    ("cli", ("lexgraph.cli",)),
    ("resources", ("resources.*",)),
    ("assets", ("assets.*",)),
    ("orchestration", ("orchestration.*",)),
    ("deploy", ("deploy.*",)),
)
OUTSIDE = ("benchmarks", "tests")  # may import any layer; no layer imports them

# Upward imports that are known and not yet removed: (importer, imported) -> why. Each must still occur
# (test_every_named_exception_is_still_needed): delete an entry when its import goes. None today.
UPWARD_EXCEPTIONS: dict[tuple[str, str], str] = {}
# Import circles that are known and not yet broken: frozenset of modules -> why. None today.
CIRCLE_EXCEPTIONS: dict[frozenset, str] = {}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


MODULES = {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _imports(path: Path) -> list[str]:
    """Every module name this file imports, as written (relative imports made absolute)."""
    module = _module_name(path)
    return _imports_of(path.read_text(), str(path), module if path.name == "__init__.py" else module.rpartition(".")[0])


def _imports_of(source: str, filename: str, package: str) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(source, filename)):  # every import, at any depth
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            # `from a import b` imports a, and a.b when b is a module
            names += [base] + [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            names.append(str(node.args[0].value))
    return names


def _graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (with the packages above them, whose __init__ runs first)."""
    graph = {}
    for module, path in MODULES.items():
        targets = set()
        for name in _imports(path):
            parts = name.split(".")
            targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & MODULES.keys()
        graph[module] = targets - {module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]; counter[0] += 1
                    stack.append(child); on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop(); on_stack.discard(member); component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _one_circle(graph: dict[str, set[str]], component: list[str]) -> str:
    """A shortest path from the component's first module back to itself, for the failure message."""
    start, members = component[0], set(component)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for child in sorted(graph[path[-1]] & members):
            if child == start:
                return " -> ".join(path + [start])
            if child not in seen:
                seen.add(child); paths.append(path + [child])
    return ""


def _layer(module: str) -> int | None:
    for rank, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if module == entry.removesuffix(".*") or (entry.endswith(".*") and module.startswith(entry[:-1])):
                return rank
    return None


def test_no_engine_module_imports_the_dagster_layer():
    offenders = [f"{p.relative_to(ROOT)}: {name}" for p in sorted((ROOT / "lexgraph").rglob("*.py"))
                 for name in _imports(p) if name.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_the_graph_sees_lazy_relative_and_type_checking_imports():
    graph = _graph()
    assert "lexgraph.storage.vector_store" in graph["lexgraph.storage.lance_indexes"]  # module level
    assert "lexgraph.extract.onnx_export" in graph["lexgraph.extract.embedder"]  # inside a method
    source = "import a.b\ndef f():\n    from . import b\nif TYPE_CHECKING:\n    from ..d import e\n"
    assert _imports_of(source, "x.py", "lexgraph.query") == ["a.b", "lexgraph.query", "lexgraph.d"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _one_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c"]) == "a -> b -> c -> a"


def test_no_import_circle():
    graph = _graph()
    circles = [component for component in _circles(graph) if frozenset(component) not in CIRCLE_EXCEPTIONS]
    assert [_one_circle(graph, component) + f"  (all of: {', '.join(component)})" for component in circles] == []


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m.split(".")[0] not in OUTSIDE and _layer(m) is None] == []


def test_no_import_runs_up_a_layer():
    upward = []
    for importer, targets in _graph().items():
        if importer.split(".")[0] in OUTSIDE:
            continue
        for target in sorted(t for t in targets if not any(other.startswith(t + ".") for other in targets)):
            if target.split(".")[0] in OUTSIDE:
                upward.append(f"{importer} -> {target} (benchmarks and tests are outside the layers)")
            elif None not in (_layer(importer), _layer(target)) and _layer(target) > _layer(importer) \
                    and (importer, target) not in UPWARD_EXCEPTIONS:  # a module without a layer: the test above
                upward.append(f"{importer} ({LAYERS[_layer(importer)][0]}) -> {target} ({LAYERS[_layer(target)][0]})")
    assert upward == []


def test_every_named_exception_is_still_needed():
    graph = _graph()
    gone = [f"{a} -> {b}" for a, b in UPWARD_EXCEPTIONS if b not in graph.get(a, ())]
    gone += [", ".join(sorted(c)) for c in CIRCLE_EXCEPTIONS if sorted(c) not in _circles(graph)]
    assert gone == [], "these imports are gone: delete their entries in UPWARD_EXCEPTIONS / CIRCLE_EXCEPTIONS"


@pytest.mark.subprocess
def test_importing_every_engine_module_loads_no_dagster():
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                     for p in (ROOT / "lexgraph").rglob("*.py"))
    script = ("import importlib, sys\n"
              f"for name in {modules!r}:\n    importlib.import_module(name)\n"
              "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'orchestration', 'assets', 'resources'))\n"
              "print(len(sys.modules)); assert not leaked, leaked\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.strip()) > 50  # the engine really was imported
