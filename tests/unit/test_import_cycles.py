"""No module of the package imports itself back through others: every import is counted, those under
`TYPE_CHECKING` and those inside functions included, so the layers stay one-way (a module that needs part of
another's object takes a Protocol of it: jobpool/store/calls.py `HasStore`, jobpool/submit.py `Submitter`).

`from package import module` counts as importing that module only; `from package import name` (a name the
package's __init__ defines) as importing the package.

And `Pool` is the public facade only: no module but the few that make a pool for a person imports
jobpool/api.py or names `Pool` in its code (prose may); the supervisor, the workers and the fleet take the
store, the CLI and the dashboard `operations.PoolOperations`.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

import pytest

import jobpool

ROOT = Path(jobpool.__file__).parent


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: Collection[str]) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its text."""
    return imports_in(name, path.name == "__init__.py", path.read_text(), known)


def imports_in(name: str, is_package: bool, text: str, known: Collection[str]) -> set[str]:
    """The package's modules that module `name` (a package's __init__ when `is_package`) imports in `text`."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            names = [f"{source}.{a.name}" for a in node.names]
            found.update(n for n in names if n in known)
            if source in known and any(n not in known for n in names):
                found.add(source)
    found.discard(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_package_has_no_import_cycle() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "jobpool.store.calls" in graph and graph["jobpool.api"], "the scan found the package's imports"
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


#: The modules that may import jobpool/api.py or name `Pool`: the API itself, the import surface, and the
#: places that make a pool for a person (the CLI's, the dashboard's, `jobpool up`'s).
MAKES_A_POOL = frozenset({"jobpool.api", "jobpool", "jobpool.cli.app", "jobpool.dashboard.server",
                          "jobpool.up.stack"})
API = "jobpool.api"


def _annotations(tree: ast.AST) -> list[ast.expr]:
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            out.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            out.append(node.returns)
    return out


def pool_uses(name: str, is_package: bool, text: str, known: Collection[str]) -> list[str]:
    """Where module `name` (`text`) imports jobpool/api.py or names `Pool` in code: an import of the module or
    of the name (under `TYPE_CHECKING` or in a function too), the name or an attribute of that name, a quoted
    annotation naming it, or the module's name given as text (`importlib.import_module`)."""
    tree = ast.parse(text)
    found = [f"imports {API}"] if API in imports_in(name, is_package, text, known) else []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any("Pool" in (a.name, a.asname) for a in node.names):
            found.append(f"line {node.lineno}: imports Pool")
        elif (isinstance(node, ast.Name) and node.id == "Pool") or (
                isinstance(node, ast.Attribute) and node.attr == "Pool"):
            found.append(f"line {node.lineno}: names Pool")
        elif isinstance(node, ast.Constant) and node.value == API:
            found.append(f"line {node.lineno}: names {API} as text")
    for annotation in _annotations(tree):
        for quoted in ast.walk(annotation):
            if isinstance(quoted, ast.Constant) and isinstance(quoted.value, str):
                inner = ast.walk(ast.parse(quoted.value, mode="eval"))
                if any(isinstance(n, ast.Name) and n.id == "Pool" for n in inner):
                    found.append(f"line {quoted.lineno}: names Pool in a quoted annotation")
    return found


def test_only_the_places_that_make_a_pool_name_it() -> None:
    known = modules()
    uses = {name: pool_uses(name, path.name == "__init__.py", path.read_text(), known)
            for name, path in known.items()}
    assert all(uses[name] for name in MAKES_A_POOL), "the scan finds the places that make a pool"
    assert {name: found for name, found in uses.items() if found and name not in MAKES_A_POOL} == {}


@pytest.mark.parametrize("text", [
    "from ..api import Pool",
    "from .. import api",
    "import jobpool.api",
    "from jobpool import Pool",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..api import Pool as Facade",
    "def make() -> None:\n    from ..api import Pool",
    "import jobpool\nx = jobpool.Pool",
    "def sweep(pool: 'Pool') -> None: ...",
    "def sweep(pool: 'list[Pool]') -> None: ...",
    "import importlib\napi = importlib.import_module('jobpool.api')",
])
def test_the_scan_finds_pool_named(text: str) -> None:
    assert pool_uses("jobpool.supervisor.sweep", False, text, {API, "jobpool.supervisor.sweep"})


def test_the_scan_leaves_prose_and_other_pools_alone() -> None:
    text = ('"""Like `Pool.cancel` (jobpool/api.py), a Pool in prose."""\n'
            "from ..store.calls import Store\nfrom concurrent.futures import ThreadPoolExecutor\n"
            "import redis\npool = redis.ConnectionPool()\nkeys: 'PoolKeys'\n")
    assert pool_uses("jobpool.supervisor.sweep", False, text, {API, "jobpool.store.calls"}) == []
