"""The runtime's packages by concern (docs/architecture.md, the folders): each imports only those
before it, and no plan kind's package imports another's, nor the kinds' lookup above them."""

import ast
import pathlib

import paraplan

RUNTIME = pathlib.Path(paraplan.__file__).parent / "runtime"
# what each part of the runtime may import of the others (its own package always)
KINDS = ("pipeline", "layers", "bipartition", "dag")
BELOW = {
    "rank": set(),
    "state": {"rank"},
    "measure": {"rank", "state"},
    **{kind: {"rank", "state", "measure"} for kind in KINDS},
    "kinds": {"rank", *KINDS},
    "config": {"rank", "kinds"},
    "launcher": {"rank", "state", "measure", "kinds", "config"},
}


def _part(path: pathlib.Path) -> str:
    rel = path.relative_to(RUNTIME).parts
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def _runtime_imports(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):  # imports inside functions too
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["paraplan", "runtime"] and len(parts) > 2:
                found.add(parts[2])
    return found


def test_every_runtime_module_is_in_a_part():
    parts = {_part(p) for p in RUNTIME.rglob("*.py") if p.name != "__init__.py" or p.parent != RUNTIME}
    assert parts == set(BELOW), parts ^ set(BELOW)


def test_each_part_imports_only_the_parts_before_it():
    bad = [f"{p.relative_to(RUNTIME)} imports runtime.{used}" for p in sorted(RUNTIME.rglob("*.py"))
           if p.parent != RUNTIME or p.name != "__init__.py"
           for used in sorted(_runtime_imports(p) - BELOW[_part(p)] - {_part(p)})]
    assert not bad, "\n".join(bad)


def test_the_check_would_see_a_kind_importing_another():
    assert "layers" not in BELOW["dag"] and "kinds" not in BELOW["layers"] and "config" not in BELOW["kinds"]
    assert _runtime_imports(RUNTIME / "kinds.py") >= {"layers", "dag", "pipeline", "bipartition"}
