"""The package's shape: no import cycles (imports inside functions and type-only imports count),
the layers' direction between top-level packages, and nothing heavy or platform-bound imported just
by importing a module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import localinfer

PACKAGE = Path(localinfer.__file__).parent


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere, TYPE_CHECKING blocks included: a
    type-only import is a dependency of the reader and the checker, and hides a cycle as well."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in mods:
                t = t.rpartition(".")[0]
            # a module importing its own package's face (``localinfer``'s lazy API) is no cycle
            if t and t != name and not name.startswith(t + "."):
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, f, mods) for m, f in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_the_import_graph_has_no_cycles():
    assert _cycles(_graph()) == []


def _top(module: str) -> str:
    """``localinfer.X`` for a module of subpackage or module X (``localinfer.cli.main`` -> ``localinfer.cli``)."""
    return ".".join(module.split(".")[:2])


def _package_edges() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) between top-level packages -> the module imports that make the edge.
    ``localinfer`` itself (the lazy library face) is left out: a module importing it imports nothing."""
    edges: dict[tuple[str, str], list[str]] = {}
    for m, deps in _graph().items():
        for d in deps:
            a, b = _top(m), _top(d)
            if a != b and "localinfer" not in (a, b):
                edges.setdefault((a, b), []).append(f"{m} -> {d}")
    return edges


# Who may import the terminal side (besides itself): the core never prints. __main__ is
# `python -m localinfer`, the CLI's entry point.
MAY_IMPORT = {
    "localinfer.render": {"localinfer.cli"},
    "localinfer.cli": {"localinfer.__main__"},
}


def test_only_the_cli_and_render_import_render_and_only_the_cli_imports_the_cli():
    wrong = sorted(
        via
        for (a, b), vias in _package_edges().items()
        if b in MAY_IMPORT and a not in MAY_IMPORT[b]
        for via in vias
    )
    assert wrong == []


# --- the pipeline's order (written by the tree reorganisation; keep it true) ---
# The pipeline, upstream first: a top-level package imports only packages before it (the
# request is plain values; the engine takes them; generate runs them; features, processes
# and the terminal come last). Leaves at the top (errors, paths, units...) are outside it.
LAYERS = [
    "localinfer.request",
    "localinfer.gguf",
    "localinfer.engine",
    "localinfer.system",
    "localinfer.store",
    "localinfer.answer",
    "localinfer.generate",
    "localinfer.usage",
    "localinfer.embed",
    "localinfer.remote",
    "localinfer.backends",
    "localinfer.chat",
    "localinfer.batch",
    "localinfer.bench",
    "localinfer.serve",
    "localinfer.resident",
    "localinfer.launch",
    "localinfer.render",
    "localinfer.cli",
]


def test_the_packages_follow_the_pipeline():
    order = {p: i for i, p in enumerate(LAYERS)}
    tops = {_top(m) for m in _modules()} - {"localinfer"}
    packages = {t for t in tops if (PACKAGE / t.split(".")[1]).is_dir()}
    assert packages <= set(order), f"a package not in LAYERS: {sorted(packages - set(order))}"
    upstream = sorted(
        via
        for (a, b), vias in _package_edges().items()
        if a in order and b in order and order[b] > order[a]
        for via in vias
    )
    assert upstream == []


def test_the_top_holds_only_the_face_and_leaves():
    loose = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 8, f"{len(loose)} loose modules at the top (a stage belongs in its package): {loose}"
# --- end of the pipeline's order ---


def test_no_cycle_between_top_level_packages():
    graph: dict[str, set[str]] = {}
    for a, b in _package_edges():
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    assert _cycles(graph) == []


def test_importing_the_package_and_the_cli_loads_nothing_heavy():
    code = (
        "import sys, localinfer, localinfer.cli.main\n"
        "heavy = {'llama_cpp', 'numpy', 'huggingface_hub', 'rich', 'typer', 'jinja2', 'psutil'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
