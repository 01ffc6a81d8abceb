"""The layering of docs/architecture.md, held against the import graph of the package (imports inside functions and
under `TYPE_CHECKING` included): a module imports only modules of its own layer or of lower ones, no two modules
import each other (directly or through others), `engine/tables` is pyiceberg only (no Spark, no config), and
`engine/tables/commits.py` is the only module that imports pyiceberg's private API."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kafscale_lakehouse

PACKAGE_DIR = Path(kafscale_lakehouse.__file__).parent
ROOT = "kafscale_lakehouse"

# Lowest first. A module belongs to the longest prefix listed; each layer may import its own and lower layers.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("format", "redaction", "local_processes"),
    ("etcd",),
    ("storage",),
    ("offsets",),
    ("schema",),
    ("value_formats",),
    ("config",),
    ("engine.errors", "engine.phases"),
    ("engine.tables",),
    ("engine.spark",),
    ("engine.maintenance",),
    ("connections",),
    ("engine.ingestion",),
    ("orchestration", "apps", "definitions", "defs", "demo_assets"),
)
TOP_LEVEL_PACKAGE = ""  # kafscale_lakehouse/__init__.py


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.cache
def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE_DIR.rglob("*.py")}


@functools.cache
def syntax_tree(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once for all the tests of this file."""
    return ast.parse(path.read_text(), str(path))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    """Every import statement anywhere in the module, resolved to the project's module it reads (a name imported
    from a package is the submodule when one has that name, else the package)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(syntax_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                yield Import(name, candidate if candidate in modules else source, node.lineno)


@functools.cache
def project_graph() -> tuple[dict[str, Path], tuple[Import, ...]]:
    modules = all_modules()
    edges = tuple(imp for name, path in modules.items() for imp in imports_of(name, path, modules)
                  if imp.imported.startswith(ROOT) and imp.imported != imp.importer)
    return modules, edges


def layer_of(module: str) -> int:
    relative = module[len(ROOT) + 1:]
    best, best_length = None, -1
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (relative == prefix or relative.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = rank, len(prefix)
    if best is None:
        if relative == "engine":  # re-exports EngineError only
            return layer_of(f"{ROOT}.engine.errors")
        if relative == TOP_LEVEL_PACKAGE:
            return len(LAYERS)
        raise AssertionError(f"module {module} belongs to no layer of test_layers.LAYERS: give it one")
    return best


def test_every_module_belongs_to_a_layer():
    for module in all_modules():
        layer_of(module)


def test_no_module_imports_a_higher_layer():
    _, edges = project_graph()
    upward = sorted({f"{e.importer} (layer {layer_of(e.importer)}) imports {e.imported} (layer "
                     f"{layer_of(e.imported)}), line {e.line}"
                     for e in edges if layer_of(e.imported) > layer_of(e.importer)})
    assert not upward, "lower layers import higher ones:\n" + "\n".join(upward)


def strongly_connected(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module are import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
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
                        components.append(sorted(component))
    return components


def test_no_import_cycles():
    modules, edges = project_graph()
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
    cycles = strongly_connected(set(modules), graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_tables_use_neither_spark_nor_config():
    modules, _ = project_graph()
    found = [f"{name} imports {imp.imported} (line {imp.line})"
             for name, path in modules.items() if name.startswith(f"{ROOT}.engine.tables")
             for imp in imports_of(name, path, modules)
             if imp.imported.split(".")[0] == "pyspark" or imp.imported.startswith(f"{ROOT}.config")]
    assert not found, "engine/tables is pyiceberg only:\n" + "\n".join(sorted(set(found)))


def test_only_the_commit_machinery_imports_private_pyiceberg_api():
    modules, _ = project_graph()
    found = []
    for name, path in modules.items():
        for node in ast.walk(syntax_tree(path)):
            private = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyiceberg"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                private += [node.module] if any(p.startswith("_") for p in (node.module or "").split(".")) else []
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_convert_schema"):
                private = [node.attr]
            if private and name != f"{ROOT}.engine.tables.commits":
                found.append(f"{name}: {private} (line {node.lineno})")
    assert not found, "pyiceberg's private API outside engine/tables/commits.py:\n" + "\n".join(found)


def test_no_production_module_imports_the_test_support():
    """The wheel ships `kafscale_lakehouse` only; the test support (the Confluent-compatible registry server, the test
    servers, the benchmarks' harness) lives in `kafscale_lakehouse_tests/support/`, outside it, and no module of the
    package imports it (the demo starts the registry from the repository: scripts/run-demo.sh)."""
    import kafscale_lakehouse_tests.support.schema_registry as registry_server

    assert PACKAGE_DIR not in Path(registry_server.__file__).resolve().parents
    modules, _ = project_graph()
    found = [f"{name} imports {imp.imported} (line {imp.line})"
             for name, path in modules.items() for imp in imports_of(name, path, modules)
             if imp.imported.split(".")[0] == "kafscale_lakehouse_tests"]
    assert not found, "production modules import the test support:\n" + "\n".join(sorted(set(found)))


def test_the_layer_rules_catch_an_upward_import():
    """The checks above can fail: a format module importing the engine, and two modules importing each other."""
    assert layer_of(f"{ROOT}.format.segment") < layer_of(f"{ROOT}.engine.tables.summary")
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected({"a", "b", "c", "d"}, graph) == [["a", "b", "c"]]
