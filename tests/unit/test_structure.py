"""The shape of the source (docs/architecture.md, issue 28), enforced on an AST walk of
src/paraplan that includes the imports inside functions: no import circle between modules, no
private name taken from another module, methods that never import one another, nothing below the
command line importing it, and no file over 400 lines, class over 200 or function over 100 (a
guard, not a target: a file split along its seams, issue 47)."""

import ast
import pathlib

import networkx as nx

import paraplan

SRC = pathlib.Path(paraplan.__file__).parent


def _registered_methods() -> tuple[str, ...]:
    """The method folders, planners/<method>/: those of the modules that register planners
    (planners/registry.py: PLANNER_MODULES)."""
    from paraplan.planners.registry import PLANNER_MODULES

    return tuple(dict.fromkeys(m.split(".")[2] for m in PLANNER_MODULES if m.count(".") >= 3))


METHODS = _registered_methods()


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
    assert {p.parent.name for p in (SRC / "planners").glob("*/__init__.py")} == set(METHODS) != set()
    for method in METHODS:
        assert (SRC / "planners" / method / "__init__.py").exists(), method


def test_nothing_below_the_command_line_imports_it():
    bad = sorted({f"{importer} imports {imported}" for importer, imported, _ in _edges()
                  if imported and (imported == "paraplan.cli" or imported.startswith("paraplan.cli."))
                  and not (importer.startswith("paraplan.cli") or importer == "paraplan.__main__")})
    assert not bad, "\n".join(bad)


MAX_FILE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 400, 200, 100


def _too_long(module: str, text: str) -> list[str]:
    """The file if it is over MAX_FILE_LINES, and every class and function (methods and nested
    ones included) over its cap, by the lines from its `def` / `class` to its end."""
    out = []
    if text.count("\n") > MAX_FILE_LINES:
        out.append(f"{module}: {text.count(chr(10))} lines (file)")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            cap = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            length = node.end_lineno - node.lineno + 1
            if length > cap:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                out.append(f"{module}.{node.name}: {length} lines ({kind})")
    return out


def test_no_file_over_400_lines_no_class_over_200_and_no_function_over_100():
    too_long = [line for module, path in sorted(MODULES.items()) for line in _too_long(module, path.read_text())]
    assert not too_long, "\n".join(too_long)


def test_the_checks_see_what_they_look_for():
    # the walk itself: a known edge and a known private name would be found if they existed
    assert "paraplan.planners.registry" in MODULES
    edges = {(a, b) for a, b, _ in _edges()}
    assert ("paraplan.planners.registry", "paraplan.planners.table") in edges
    graph = _graph()
    graph.add_edge("paraplan.planners.table", "paraplan.planners.registry")
    assert any(len(c) > 1 for c in nx.strongly_connected_components(graph))
    # the size caps: a class, a method in it and a file just over theirs are found, each at its cap is not
    method = "    def m(self):\n" + "        x = 1\n" * (MAX_FUNCTION_LINES - 1)
    padding = "    y = 1\n" * (MAX_CLASS_LINES - 1 - MAX_FUNCTION_LINES)
    at_caps = "class C:\n" + method + padding
    assert at_caps.count("\n") == MAX_CLASS_LINES and not _too_long("m", at_caps)
    over = "class C:\n" + method + "        x = 1\n" + padding + "    y = 1\n"
    assert sorted(_too_long("m", over)) == [f"m.C: {MAX_CLASS_LINES + 2} lines (class)",
                                            f"m.m: {MAX_FUNCTION_LINES + 1} lines (function)"]
    long_file = "x = 1\n" * (MAX_FILE_LINES + 1)
    assert _too_long("m", long_file) == [f"m: {MAX_FILE_LINES + 1} lines (file)"]
    assert not _too_long("m", "x = 1\n" * MAX_FILE_LINES)
