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


def _runtime_imports(path: pathlib.Path, source: str | None = None) -> set[str]:
    """The runtime parts a module imports: `import paraplan.runtime.X...`, `from paraplan.runtime.X
    import ...`, `from paraplan.runtime import X` and relative imports (`from ..X import ...`)
    resolved against the module's own package."""
    here = path.relative_to(RUNTIME).parent.parts  # the module's package below runtime/
    found = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):  # inside functions too
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up from the module's package, inside runtime/
                up = here[:len(here) - (node.level - 1)] if node.level - 1 <= len(here) else ()
                base = ".".join(["paraplan", "runtime", *up, *([base] if base else [])])
            names = [base] if base != "paraplan.runtime" else [f"{base}.{a.name}" for a in node.names]
        else:
            continue
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


def test_the_check_sees_every_form_of_import():
    """A kind's module importing another kind (or the kinds' lookup above it) in each form."""
    module = RUNTIME / "dag" / "sample.py"
    for source, part in (("from paraplan.runtime.layers.hybrid import hybrid_refusal\n", "layers"),
                         ("import paraplan.runtime.pipeline.stage_loop\n", "pipeline"),
                         ("from paraplan.runtime import kinds\n", "kinds"),
                         ("def f():\n    from ..bipartition import bipartition_rank\n", "bipartition"),
                         ("from ..layers.meshes import Meshes\n", "layers")):
        used = _runtime_imports(module, source)
        assert part in used and part not in BELOW["dag"], (source, used)
    assert _runtime_imports(module, "from .program import build_program\n") == {"dag"}  # its own package
