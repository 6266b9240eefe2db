"""Fail on any import cycle between the modules of a package (default: mqk), function-level imports included.

import-linter's contracts (pyproject.toml, `lint-imports`) hold the layers; its `acyclic_siblings` contract sees a
cycle between sibling modules or packages, but not one through a package's own `__init__` (the package imports a
child that imports the package back). This check walks grimp's graph of every import statement, wherever it stands
(module level, inside a function, under TYPE_CHECKING), and reports each strongly connected set of modules with the
lines that tie it together. Exit status 1 if there is one.

    python tools/import_cycles.py [PACKAGE ...]
"""

from __future__ import annotations

import sys

import grimp


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """The sets of two or more modules that import each other, directly or not (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
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
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def main(argv: list[str]) -> int:
    packages = argv or ["mqk"]
    graph = grimp.build_graph(*packages, include_external_packages=False, exclude_type_checking_imports=False)
    cycles = strongly_connected(graph)
    for members in cycles:
        print(f"import cycle among {len(members)} modules:")
        inside = set(members)
        for importer in members:
            for imported in sorted(graph.find_modules_directly_imported_by(importer) & inside):
                for detail in graph.get_import_details(importer=importer, imported=imported):
                    print(f"  {importer}:{detail['line_number']}: {detail['line_contents']}")
    n_modules = len(graph.modules)
    if cycles:
        print(f"{len(cycles)} import cycle(s) in {', '.join(packages)} ({n_modules} modules)")
        return 1
    print(f"no import cycles in {', '.join(packages)} ({n_modules} modules, function-level imports included)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
