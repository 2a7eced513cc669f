"""No module of the package imports itself back through others: every import is counted, those under
`TYPE_CHECKING` and those inside functions included, so the layers stay one-way (a module that needs part of
another's object takes a Protocol of it: jobpool/store/calls.py `HasStore`, jobpool/submit.py `Submitter`).

`from package import module` counts as importing that module only; `from package import name` (a name the
package's __init__ defines) as importing the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

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


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its text."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
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
