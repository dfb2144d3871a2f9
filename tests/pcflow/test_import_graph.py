"""pcflow's modules import each other in one direction: no cycle, counting the imports made inside
functions too (a cycle that only a deferred import hides is still two modules that cannot change alone)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from dagrun import REPO

PLUGINS = REPO / "plugins"


def module_name(path: Path) -> str:
    parts = path.relative_to(PLUGINS).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every pcflow module -> the pcflow modules it imports, anywhere in its body."""
    modules = {module_name(p): p for p in (PLUGINS / "pcflow").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_pcflow_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_early_stopping_rule_is_pure():
    graph = import_graph()
    assert "pcflow.readings.stopping" in graph["pcflow.slurm.trigger"]
    assert {m for m in graph["pcflow.readings.stopping"] if m.startswith("pcflow.")} <= {
        "pcflow.readings.jsonlines",
        "pcflow.readings.series",
    }


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def lint_imports(plugins: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's contracts of pyproject.toml (the layers) over the `pcflow` package under `plugins`,
    as `make lint` runs them; no cache, so a copied tree is judged afresh."""
    argv = [str(Path(sys.executable).with_name("lint-imports")), "--config", str(REPO / "pyproject.toml"), "--no-cache"]
    env = {"PYTHONPATH": str(plugins), "PATH": "/usr/bin:/bin"}
    return subprocess.run(argv, cwd=plugins, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_pcflow_keeps_its_layers():
    result = lint_imports(PLUGINS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_the_layers_contract_catches_an_upward_import_and_an_unplaced_module(tmp_path):
    """What the check is for: the foundation importing the pipeline, at module level or inside a function,
    the Slurm stage importing the metrics or the code stage or the budget the Slurm stage (layers above
    each), and a new module in no layer. An import by name it does not see (hence the test below)."""
    shutil.copytree(PLUGINS / "pcflow", tmp_path / "pcflow", ignore=shutil.ignore_patterns("__pycache__"))
    plants = {
        "errors.py": "from pcflow import pipeline",
        "patterns.py": "def _planted():\n    from pcflow.pipeline import assembly",
        "naming.py": "def _planted():\n    __import__('pcflow.pipeline')",
        "slurm/progress.py": "def _planted():\n    from pcflow.metrics import harvest",
        "budget.py": "def _planted():\n    from pcflow.slurm import queries",
        "slurm/payload.py": "from pcflow.code import deliver",
    }
    for module, code in plants.items():
        with (tmp_path / "pcflow" / module).open("a") as planted:
            planted.write(f"\n{code}  # noqa: E402\n")
    (tmp_path / "pcflow" / "unplaced.py").write_text('"""A module no layer names."""\n')
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pcflow.errors is not allowed to import pcflow.pipeline" in result.stdout
    assert "pcflow.patterns is not allowed to import pcflow.pipeline" in result.stdout
    assert "pcflow.naming is not allowed" not in result.stdout
    assert "pcflow.slurm.progress -> pcflow.metrics.harvest" in result.stdout
    assert "pcflow.budget -> pcflow.slurm.queries" in result.stdout
    assert "pcflow.slurm.payload -> pcflow.code.deliver" in result.stdout
    assert "- pcflow.unplaced" in result.stdout


#: The only imports by name (importlib.import_module, __import__) in pcflow, which lint-imports cannot see,
#: so none may hide an import the layers forbid: (module, function) -> why it is not a plain import.
DYNAMIC_IMPORTS = {
    ("pcflow.compat", "moved.__getattr__"): "a shim left at an old path resolves the names Airflow stored "
    "(trigger class paths) to where they live now, on first use; the names are the shim's data",
    ("pcflow.ui.mount", "LazyApp.__call__"): "the plugin's app (pcflow_plugin.py: pcflow.ui.app:app), imported "
    "on the first request so that no other Airflow process loads FastAPI",
    ("pcflow.dataset", "__getattr__"): "the package's own exports (pcflow.dataset.*, one layer), imported on "
    "first use so that parsing a DAG file loads no boto3",
}


def dynamic_imports(path: Path) -> set[str]:
    """The functions (dotted within the module) that call importlib.import_module or __import__."""
    found: set[str] = set()

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, (*scope, child.name))
                continue
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name in ("import_module", "__import__"):
                    found.add(".".join(scope) or "<module>")
            visit(child, scope)

    visit(ast.parse(path.read_text()), ())
    return found


def test_pcflow_imports_nothing_by_name_but_its_stored_name_shims():
    """An import by name is invisible to lint-imports (as the teardown registry's lazy import of the cluster
    stage was): each one left is listed in DYNAMIC_IMPORTS with why."""
    found = {
        (module_name(path), function)
        for path in (PLUGINS / "pcflow").rglob("*.py")
        for function in dynamic_imports(path)
    }
    assert found == set(DYNAMIC_IMPORTS)


def test_the_architecture_page_names_the_contract_s_layers_in_order():
    """docs/architecture.md's table is the layer picture a maintainer reads: one row per layer of the
    contract, top down, naming exactly that layer's modules (so a module moved in pyproject.toml moves
    on the page too)."""
    import re
    import tomllib

    contract = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    layers = [set(re.split(r"\s*[:|]\s*", layer.strip())) for layer in contract["layers"]]
    page = (REPO / "docs" / "architecture.md").read_text()
    rows = [line.split("|")[2] for line in page.splitlines() if re.match(r"^\| [a-z][^|]* \| `", line)]
    assert [set(re.findall(r"`([a-z_]+)`", row)) for row in rows] == layers
