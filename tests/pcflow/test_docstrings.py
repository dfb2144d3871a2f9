"""Every public function, method and class of plugins/pcflow has a docstring (say why, not what).

Public: a name without a leading underscore, at module level or in a public class (so dunders are
out, and `__init__`'s parameters belong in its class's docstring). Two rules exempt a method, and no
name is exempt by itself:
- a property (`property`, `cached_property`, a setter) reads as an attribute: its name and annotation
  say what it holds, and where that is not enough the class docstring says it;
- an override of a method a base class documents (Airflow's `execute`, `execute_complete`,
  `serialize`, a trigger's `run`, a teardown handler's `delete`): the base's docstring is the contract
  the override keeps, and `help()`/`inspect.getdoc` show it. Finding the base needs the class itself,
  so the walk is `ast` and only a method without a docstring is looked up by importing its module.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
PROPERTY_DECORATORS = frozenset({"property", "cached_property", "setter"})


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _definitions(body: list[ast.stmt]) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """The functions and classes a body defines, including those under a module-level if/try/with."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node
        elif isinstance(node, ast.If | ast.Try | ast.With):
            nested = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            nested += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
            yield from _definitions(nested)


def _is_property(node: ast.AST) -> bool:
    for decorator in getattr(node, "decorator_list", []):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in PROPERTY_DECORATORS:
            return True
    return False


def undocumented(package: Path) -> Iterator[tuple[str, str, bool]]:
    """(module, qualname, is a method) of each public definition without a docstring, properties left out."""
    for path in sorted(package.rglob("*.py")):
        module = module_name(path, package.parent)
        pending = [(node, "", False) for node in _definitions(ast.parse(path.read_text()).body)]
        while pending:
            node, prefix, in_class = pending.pop(0)
            if node.name.startswith("_") or (in_class and _is_property(node)):
                continue
            qualname = prefix + node.name
            if not ast.get_docstring(node):
                yield module, qualname, in_class
            if isinstance(node, ast.ClassDef):
                pending += [(child, f"{qualname}.", True) for child in _definitions(node.body)]


def documented_by_a_base(module: str, qualname: str) -> bool:
    """Whether a base class of the method's class defines the same name with a docstring."""
    owner = importlib.import_module(module)
    *classes, name = qualname.split(".")
    for part in classes:
        owner = getattr(owner, part)
    bases = [base for base in inspect.getmro(owner)[1:] if base is not object]
    return any(name in vars(base) and inspect.getdoc(vars(base)[name]) for base in bases)


def offenders(package: Path) -> list[str]:
    return [
        f"{module}:{qualname}"
        for module, qualname, is_method in undocumented(package)
        if not (is_method and documented_by_a_base(module, qualname))
    ]


def test_every_public_definition_has_a_docstring():
    found = offenders(PLUGINS / "pcflow")
    assert not found, f"{len(found)} public definitions without a docstring (say why):\n" + "\n".join(found)


def test_the_walk_names_each_offender_and_only_the_exemptions_pass(tmp_path, monkeypatch):
    """An undocumented function, method and nested class are named; a property, a private name, a
    documented definition and an override of a documented base method are not."""
    package = tmp_path / "docstring_sample"
    package.mkdir()
    (package / "__init__.py").write_text('"""A package."""\n')
    (package / "things.py").write_text(
        "import threading\n"
        "def bare(): pass\n"
        "def _private(): pass\n"
        "def told():\n"
        '    """Told."""\n'
        "class Worker(threading.Thread):\n"
        '    """A thread."""\n'
        "    def run(self): pass\n"
        "    def own(self): pass\n"
        "    @property\n"
        "    def size(self): return 1\n"
        "    class Inner: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert offenders(package) == [
        "docstring_sample.things:bare",
        "docstring_sample.things:Worker.own",
        "docstring_sample.things:Worker.Inner",
    ]
