"""The layering rules, checked on the source with `ast`: `workers -> brokers -> llamarl`, the core
never imports a worker (by statement or by a module name in a string), no import cycle between
modules nor between llamarl's packages, and each worker file only wires a process (under 80 lines).

Every import statement counts, wherever it is in the file (a function-local import is still a
dependency); `import a.b` and `from a import b` point at module `a.b` when it exists, else at `a`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("llamarl", "brokers", "workers")
MAX_WORKER_LINES = 80
MAX_ROOT_MODULES = 12  # so that llamarl/'s folder list explains the system
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of ours that importing `name` loads last (its longest existing prefix)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _is_import_call(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def imports(module: str) -> Iterator[tuple[str, int, str]]:
    """(imported module of ours, line, how) for every import in `module`'s file."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    seen: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        names: list[tuple[str, str]] = []
        if isinstance(node, ast.Import):
            names = [(alias.name, "import") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [(f"{base}.{alias.name}", "from-import") for alias in node.names]
        elif isinstance(node, ast.Call) and _is_import_call(node) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names = [(first.value, "import by string")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # A module name held in a string (a table of modules to import or run).
            if "." in node.value and node.value in MODULES:
                names = [(node.value, "module name in a string")]
        for name, how in names:
            target = _resolve(name)
            if target is not None and target != module and (target, node.lineno) not in seen:
                seen.add((target, node.lineno))  # import_module("x") is also a string "x"
                yield target, node.lineno, how


def _graph() -> dict[str, set[str]]:
    return {module: {target for target, _, _ in imports(module)} for module in MODULES}


def test_the_walk_sees_every_package_and_resolves_imports() -> None:
    assert {m.split(".")[0] for m in MODULES} == set(PACKAGES)
    assert "llamarl.config" in _graph()["llamarl.tasks.factory"]


def test_core_and_brokers_never_import_workers() -> None:
    found = [
        f"{MODULES[module].relative_to(REPO)}:{line}: {how} of {target}"
        for module in MODULES
        if not module.startswith("workers")
        for target, line, how in imports(module)
        if target == "workers" or target.startswith("workers.")
    ]
    assert found == [], "llamarl/ and brokers/ must not depend on workers/:\n" + "\n".join(found)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) through each strongly connected component."""
    return [_cycle_in(graph, component) for component in _components(graph)]


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node, each sorted (Tarjan's SCCs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def _cycle_in(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, within it."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & members):
            if target == start:
                return [*paths[node], start]
            if target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    raise AssertionError(f"no cycle through {start}")


def test_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules() -> None:
    cycles = [" -> ".join(cycle) for cycle in _cycles(_graph())]
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def _package(module: str) -> str | None:
    """The package of llamarl/ that `module` is in (llamarl.roles.build -> roles); None for
    llamarl itself, its top-level modules (llamarl/*.py) and modules outside llamarl/."""
    parts = MODULES[module].relative_to(REPO).parts
    return parts[1] if parts[0] == "llamarl" and len(parts) > 2 else None


def _package_edges() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) package of llamarl -> where the imports that make the edge are
    (file:line), from every import in the package's files."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module in MODULES:
        if (importer := _package(module)) is None:
            continue
        for target, line, _ in imports(module):
            imported = _package(target)
            if imported is not None and imported != importer:
                edges.setdefault((importer, imported), []).append(f"{MODULES[module].relative_to(REPO)}:{line}")
    return edges


def test_the_package_graph_holds_every_package_and_its_edges() -> None:
    edges = _package_edges()
    packages = {path.parent.name for path in (REPO / "llamarl").glob("*/__init__.py")}
    assert {package for edge in edges for package in edge} == packages
    assert "llamarl/roles/build.py" in " ".join(edges[("roles", "training")])


def test_no_import_cycle_between_llamarl_packages() -> None:
    """llamarl's packages read as layers (docs/architecture.md): none imports, even inside a
    function or under TYPE_CHECKING, a package that imports it back."""
    edges = _package_edges()
    graph: dict[str, set[str]] = {package: set() for edge in edges for package in edge}
    for importer, imported in edges:
        graph[importer].add(imported)
    found = []
    for component in _components(graph):
        cycle = _cycle_in(graph, component)
        found.append(f"{', '.join(component)} import each other, for one: {' -> '.join(cycle)}")
        found += [f"  {a} -> {b}: {', '.join(edges[(a, b)])}" for a, b in pairwise(cycle)]
    assert found == [], "import cycles between llamarl's packages:\n" + "\n".join(found)


def test_worker_files_only_wire_a_process() -> None:
    long = {
        str(path.relative_to(REPO)): n
        for path in sorted((REPO / "workers").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) >= MAX_WORKER_LINES
    }
    assert long == {}, f"worker files of {MAX_WORKER_LINES} lines or more: {long}"


def test_the_library_root_holds_few_modules() -> None:
    root = sorted(p.name for p in (REPO / "llamarl").glob("*.py") if p.name != "__init__.py")
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules directly under llamarl/: {root}"


def test_modules_and_functions_stay_short() -> None:
    long_modules, long_functions = {}, {}
    for module, path in MODULES.items():
        source = path.read_text()
        if (n := len(source.splitlines())) > MAX_MODULE_LINES:
            long_modules[module] = n
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions[f"{module}.{node.name}"] = length
    assert long_modules == {}, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert long_functions == {}, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"
