"""Which layer may import which, read from every import statement in leapp/ (late imports included).

ruff's banned-api is global, so the rules scoped to a directory live here:
leapp.bundle and leapp.pipeline_format stay free of torch and Warp (leapp
inspect and the C++ side's schema use them without either); the recorder and
the exporter meet only in leapp._contract; Warp's private API is reached only
through leapp._warp_private. Inside one package folder no two modules import
each other, directly or around a circle (imports only a type checker runs, under
``if TYPE_CHECKING:``, do not count). A module's ``__all__`` names only what
the module itself defines: no module re-exports another's names (package
``__init__`` files gather their package's). The checkers themselves are tested
on made-up sources.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "leapp"

# importer prefix -> banned import prefixes
RULES: dict[str, tuple[str, ...]] = {
    "leapp.bundle": ("torch", "warp"),
    "leapp.pipeline_format": ("torch", "warp"),
    "leapp._recorder": ("leapp._export",),
    "leapp._export": ("leapp._recorder",),
    "leapp._contract": ("leapp._recorder", "leapp._export"),
    "leapp": ("warp._src",),
}
ALLOWED_PRIVATE_WARP = {"leapp._warp_private"}
# (importing file, imported module) left for another branch to change; each must still exist
PENDING: set[tuple[str, str]] = set()  # (file, module) imports allowed for now; none left


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Every module an import statement anywhere in ``source`` names (``from m import a``: m and m.a)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(module: str, imports: set[str]) -> list[str]:
    bad = []
    for importer, banned in RULES.items():
        if not _under(module, importer):
            continue
        for name in sorted(imports):
            for prefix in banned:
                if _under(name, prefix) and not (prefix == "warp._src" and module in ALLOWED_PRIVATE_WARP):
                    bad.append(f"{module} imports {name} (banned in {importer}: {prefix})")
    return bad


def _package_imports() -> dict[Path, tuple[str, set[str]]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        out[path] = (module, imported_modules(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"))
    return out


def test_layers_import_only_what_they_may():
    found = []
    for path, (module, imports) in _package_imports().items():
        relative = path.relative_to(PACKAGE.parent).as_posix()
        imports = {name for name in imports if not any(relative == f and _under(name, m) for f, m in PENDING)}
        found += violations(module, imports)
    assert not found, "\n".join(found)


def test_pending_exceptions_are_still_needed():
    imports = {path.relative_to(PACKAGE.parent).as_posix(): names for path, (_, names) in _package_imports().items()}
    stale = [(f, m) for f, m in PENDING if m not in imports.get(f, set())]
    assert not stale, f"remove these from PENDING (and leapp/_recorder/model.py when unused): {stale}"


@pytest.mark.parametrize(("module", "is_package", "source", "expected"), [
    ("leapp._recorder.session", False, "def f():\n    from .._export import compile\n", "leapp._export"),
    ("leapp._recorder", True, "from .._export.compile import compile_session\n", "leapp._export.compile"),
    ("leapp._export.paths", False, "from leapp._recorder import names\n", "leapp._recorder.names"),
    ("leapp.bundle.reader", False, "if False:\n    import torch.fx\n", "torch.fx"),
    ("leapp.pipeline_format.reader", False, "from warp import types\n", "warp"),
    ("leapp._recorder.dtypes", False, "import warp._src.codegen as c\n", "warp._src.codegen"),
    ("leapp._contract.records", False, "from ..  import _export\n", "leapp._export"),
])
def test_the_checker_finds_each_kind_of_violation(module, is_package, source, expected):
    found = violations(module, imported_modules(source, module, is_package))
    assert any(f"imports {expected} " in v for v in found), found


def test_the_checker_allows_what_the_layers_may_do():
    assert not violations("leapp._warp_private", {"warp._src.context"})
    assert not violations("leapp._export.compile", {"leapp._contract.records", "torch", "warp"})
    assert not violations("leapp._recorder.node", {"leapp._contract.backends", "leapp._warp_private"})
    assert module_name(PACKAGE / "_recorder" / "__init__.py") == "leapp._recorder"


def runtime_imports(source: str, module: str, is_package: bool) -> set[str]:
    """``imported_modules`` without the imports under ``if TYPE_CHECKING:`` (they never run)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            node.body = [ast.Pass()]
    return imported_modules(ast.unparse(tree), module, is_package)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (module -> modules it imports): its strongly connected components of
    more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_inside_a_package_folder():
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "__init__.py":
            module = module_name(path)
            modules[module] = (path.parent, runtime_imports(path.read_text(encoding="utf-8"), module, False))
    graph = {m: {i for i in imports if i in modules and i != m and modules[i][0] == folder}
             for m, (folder, imports) in modules.items()}
    assert not circles(graph), circles(graph)


def test_the_circle_checker_finds_circles_and_skips_type_only_imports():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\ndef f():\n    from .c import C\n"
    assert runtime_imports(source, "leapp.x.a", False) >= {"leapp.x.c"}
    assert "leapp.x.b" not in runtime_imports(source, "leapp.x.a", False)


def reexported(source: str) -> list[str]:
    """Names a module's ``__all__`` lists but the module does not define at its top level (imports do not count)."""
    tree = ast.parse(source)
    defined, listed = set(), []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defined.add(name.id)
                        if name.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                            listed = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return [name for name in listed if name not in defined]


def test_no_module_re_exports_another_modules_names():
    found = {module_name(path): names for path in sorted(PACKAGE.rglob("*.py")) if path.name != "__init__.py"
             if (names := reexported(path.read_text(encoding="utf-8")))}
    assert not found, f"import these from where they are defined, and drop them from __all__: {found}"


def test_the_re_export_checker_tells_definitions_from_imports():
    source = "from x import A\nB = 1\ndef c(): pass\nclass D: pass\n__all__ = ['A', 'B', 'c', 'D']\n"
    assert reexported(source) == ["A"]
