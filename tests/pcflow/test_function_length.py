"""Every function of pcflow's code (plugins/, dags/, include/) is under 60 lines: one that grows past it
does more than one thing, and the project's rule is to split it before it lands.

A function's length is from its `def` to its last line, its docstring left out (a docstring that says why
is never the reason to split). Nested functions count inside their parent and on their own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("plugins", "dags", "include")
LIMIT = 60


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    is_docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    if is_docstring and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def function_lengths(source: str) -> Iterator[tuple[str, int, int]]:
    """(name, first line, length without the docstring) of each function the source defines."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
            yield node.name, node.lineno, length


def too_long(root: Path = ROOT) -> list[str]:
    """`path:line name (length)` of each function at or over the limit."""
    found = []
    for folder in CHECKED:
        for path in sorted((root / folder).rglob("*.py")):
            for name, line, length in function_lengths(path.read_text()):
                if length >= LIMIT:
                    found.append(f"{path.relative_to(root)}:{line} {name} ({length} lines)")
    return found


def test_every_function_is_under_the_limit():
    assert too_long() == [], "split these functions (the limit is 60 lines, docstring not counted)"


def test_the_count_finds_a_long_function_and_leaves_out_its_docstring():
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 1))
    docstring = '    """Why.\n\n    More on why.\n    """\n'
    source = f"def long_one():\n{docstring}{body}\n\nasync def short_one():\n    return 1\n"
    lengths = {name: length for name, _, length in function_lengths(source)}
    assert lengths == {"long_one": LIMIT, "short_one": 2}
