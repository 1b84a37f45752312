"""The shape of the code itself: no function of app/ or model/ longer than a screen (80 lines, its docstring
included), so that each reads at once and does one thing."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONGEST = 80


def long_functions(folder: str, longest: int = LONGEST) -> dict[str, int]:
    """Every function (methods and nested functions too) of ``folder``'s modules over ``longest`` lines, as
    ``path:line name`` → lines."""
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > longest:
                    found[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    return found


def test_no_function_of_app_or_model_is_longer_than_80_lines() -> None:
    assert long_functions("app") == {}
    assert long_functions("model") == {}


def test_the_count_sees_long_functions() -> None:
    """The check itself finds a long function: the test suite has some (a shorter bound finds more)."""
    assert long_functions("app", longest=40)
    assert all(lines > 40 for lines in long_functions("model", longest=40).values())
