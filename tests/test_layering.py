"""The engine is Dagster-free: no lexgraph module imports the Dagster layer, even lazily, and
importing all of it leaves no dagster in sys.modules."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("dagster", "orchestration", "assets", "resources")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):  # every import, at any depth
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            names.append(str(node.args[0].value))
    return names


def test_no_engine_module_imports_the_dagster_layer():
    offenders = [f"{p.relative_to(ROOT)}: {name}" for p in sorted((ROOT / "lexgraph").rglob("*.py"))
                 for name in _imports(p) if name.split(".")[0] in FORBIDDEN]
    assert offenders == []


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
