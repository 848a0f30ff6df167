"""The library's module graph in three numbers: module count, largest modules, import cycles.

    python benchmarks/module_graph.py [PACKAGE]     # default: exporters; run from the checkout to measure

Built with grimp (import-linter's graph library), so it counts every import import-linter counts,
function-level ones included. A cycle is a strongly connected component of more than one module.
"""

from __future__ import annotations

import os
import sys

import grimp

ROOT = os.getcwd()  # the checkout measured (its package shadows an installed one)


def _lines(module: str) -> int:
    path = os.path.join(ROOT, *module.split("."))
    path = path + ".py" if os.path.exists(path + ".py") else os.path.join(path, "__init__.py")
    with open(path, encoding="utf-8") as handle:
        return sum(1 for _ in handle)


def cycles(graph, modules: list[str]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root) & set(modules))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child) & set(modules)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
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
                    found.append(sorted(component))
    return found


def main(package: str = "exporters") -> None:
    sys.path.insert(0, ROOT)
    graph = grimp.build_graph(package, include_external_packages=False)
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    sizes = sorted(((_lines(m), m) for m in modules), reverse=True)
    found = cycles(graph, modules)
    print(f"modules: {len(modules)}")
    print("largest: " + ", ".join(f"{m} ({n} lines)" for n, m in sizes[:3]))
    print(f"cycles: {len(found)}" + "".join(f"\n  {len(c)} modules: {', '.join(c)}" for c in found))


if __name__ == "__main__":
    main(*sys.argv[1:])
