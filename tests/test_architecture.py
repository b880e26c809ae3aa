"""The package's shape: no import cycles, seams without `hasattr`, and a README map that matches the tree.

Every `import` counts, at module level or inside a function (a lazy import still ties two modules
together), including those under `if TYPE_CHECKING:`. Importing `a.b.c` also depends on the packages
`a.b` and `a` (Python runs their `__init__` first).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "lite_verl"


def module_name(path: Path, base: Path = REPO) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, modules: set[str], base: Path = REPO) -> set[str]:
    """The project modules `path` imports (the deepest existing module of each dotted name)."""
    name = module_name(path, base)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, name, path.name == "__init__.py")
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t.startswith("lite_verl") and t != name:
                found.add(t)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    files = sorted(root.rglob("*.py"))
    modules = {module_name(f, root.parent) for f in files}
    graph = {module_name(f, root.parent): imports_of(f, modules, root.parent) for f in files}
    for mod in list(graph):  # a submodule import runs its packages' __init__ first
        parts = mod.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in graph and parent != mod:
                graph[mod].add(parent)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), plus self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _is_package_import(importer: str, target: str) -> bool:
    """A package's own __init__ re-exporting its submodules is not a cycle of concerns."""
    return target.startswith(importer + ".")


def test_cycle_finder_finds_a_cycle(tmp_path):
    pkg = tmp_path / "lite_verl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from lite_verl.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from lite_verl import a\n")
    graph = import_graph(pkg)
    graph = {m: {t for t in deps if not _is_package_import(m, t)} for m, deps in graph.items()}
    assert cycles(graph) == [["lite_verl.a", "lite_verl.sub.b"]]


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 40  # the walk found the package
    graph = {m: {t for t in deps if not _is_package_import(m, t)} for m, deps in graph.items()}
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_loop_and_update_choose_no_behaviour_by_hasattr():
    for name in ("loop.py", "update.py"):
        text = (PACKAGE / name).read_text()
        assert not re.search(r"\b(hasattr|getattr)\(", text), (
            f"{name} asks an engine or backend what it can do"
        )


def test_readme_architecture_map_matches_the_tree():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^lite_verl/([\w/]+?)/?\s", section, re.M))
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    top_modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    for name in packages | top_modules:
        assert name in {x.split("/")[0].removesuffix(".py") for x in listed} or f"{name}.py" in section, (
            f"README's architecture map does not name lite_verl/{name}"
        )
    for entry in listed:
        assert (PACKAGE / entry).exists() or (PACKAGE / f"{entry}.py").exists(), f"README names {entry}"
