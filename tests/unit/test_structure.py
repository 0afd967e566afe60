"""The shape of the source (docs/architecture.md, issue 28), enforced on an AST walk of
src/paraplan that includes the imports inside functions: no import circle between modules, no
private name taken from another module, methods that never import one another, nothing below the
command line importing it, and no file over 500 lines or function over 100."""

import ast
import pathlib

import networkx as nx

import paraplan

SRC = pathlib.Path(paraplan.__file__).parent
METHODS = ("csimd", "gropipe", "bipartition", "galvatron", "fddps", "baselines")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        name = "paraplan." + path.relative_to(SRC).with_suffix("").as_posix().replace("/", ".")
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _module_of(name: str) -> str | None:
    """The module a dotted name lives in (`paraplan.x.y.Name` -> `paraplan.x.y`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _edges():
    """(importer, imported module, the name imported or None) for every paraplan import."""
    for module, path in MODULES.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("paraplan"):
                        yield module, _module_of(alias.name), None
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against the importing package
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                if not base.startswith("paraplan"):
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in MODULES:
                        yield module, full, None
                    else:
                        yield module, _module_of(base), alias.name


def _graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for importer, imported, _ in _edges():
        # a package's __init__ importing its own submodules, or a module its package, is no circle
        if imported and importer != imported and not importer.startswith(imported + "."):
            graph.add_edge(importer, imported)
    return graph


def test_no_import_circle_between_modules():
    circles = [sorted(c) for c in nx.strongly_connected_components(_graph()) if len(c) > 1]
    assert not circles, f"import circles: {circles}"


def test_no_private_name_is_imported_from_another_module():
    bad = sorted({f"{importer} takes {imported}.{name}" for importer, imported, name in _edges()
                  if name and name.startswith("_") and not name.startswith("__") and imported != importer})
    assert not bad, "\n".join(bad)


def test_methods_never_import_one_another():
    bad = []
    for importer, imported, _ in _edges():
        mine = _method(importer)
        theirs = _method(imported or "")
        if mine and theirs and mine != theirs:
            bad.append(f"{importer} imports {imported}")
    assert not bad, "\n".join(sorted(set(bad)))


def _method(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "planners" and parts[2] in METHODS:
        return parts[2]
    return None


def test_every_method_has_its_folder():
    for method in METHODS:
        assert (SRC / "planners" / method / "__init__.py").exists(), method


def test_nothing_below_the_command_line_imports_it():
    bad = sorted({f"{importer} imports {imported}" for importer, imported, _ in _edges()
                  if imported and (imported == "paraplan.cli" or imported.startswith("paraplan.cli."))
                  and not (importer.startswith("paraplan.cli") or importer == "paraplan.__main__")})
    assert not bad, "\n".join(bad)


def test_no_file_over_500_lines_and_no_function_over_100():
    long_files, long_functions = [], []
    for module, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > 500:
            long_files.append(f"{module}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 100:
                    long_functions.append(f"{module}.{node.name}: {length} lines")
    assert not long_files and not long_functions, "\n".join(long_files + long_functions)


def test_the_checks_see_what_they_look_for():
    # the walk itself: a known edge and a known private name would be found if they existed
    assert "paraplan.planners.registry" in MODULES
    edges = {(a, b) for a, b, _ in _edges()}
    assert ("paraplan.planners.registry", "paraplan.planners.table") in edges
    graph = _graph()
    graph.add_edge("paraplan.planners.table", "paraplan.planners.registry")
    assert any(len(c) > 1 for c in nx.strongly_connected_components(graph))
