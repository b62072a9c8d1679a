"""The import graph of `medvqa/`: no cycle, and no arrow from a lower layer up to a higher one.

Edges are read from the source (ast), so a lazy import inside a function counts as much as one
at the top of a module (it is the same dependency, only deferred), and so does
`importlib.import_module("<literal>")`. The plug-in registry's discovery (`pkgutil` over the
plug-in packages) is not an edge: plug-ins register themselves into it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "medvqa"

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def read_layers(path: Path = ARCHITECTURE) -> dict[str, int]:
    r"""Folder or top-level module -> layer, from docs/architecture.md's table (its rows
    `| \`name\` | layer | ... |`): the doc is the one place the layers are written."""
    layers = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[1].isdigit():
            name = cells[0].split("`")[1]
            layers[name] = int(cells[1])
    return layers


# Lower layers never import higher ones. A module's layer is that of its first dotted part
# below `medvqa` (the package's own modules are listed one by one).
LAYERS: dict[str, int] = read_layers()


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["medvqa", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the medvqa modules it imports (anywhere in its source)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                # `from module import name` imports the module; `from pkg import module` the
                # module and the package's __init__ too (it runs first, and may bind the name)
                targets += [base, *(f"{base}.{a.name}" for a in node.names)]
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                targets.append(node.args[0].value)
        for target in targets:
            if target.split(".")[0] != "medvqa":
                continue
            found = resolve(target)
            if found and found != module:
                graph[module].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = set(graph) | {t for ts in graph.values() for t in ts}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                    found.append(sorted(component))
    return found


def layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    if part not in LAYERS:
        pytest.fail(f"{module} is in no layer: add a row for {part!r} to docs/architecture.md")
    return LAYERS[part]


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.heavy
def test_the_graph_sees_lazy_and_dynamic_imports() -> None:
    graph = import_graph()
    # lazy, inside a function
    assert "medvqa.models.saving" in graph["medvqa.provenance"]
    # the registry's own package scan is not an edge, but a literal import_module would be
    assert "medvqa.config" not in graph["medvqa.plugins"]
    # `from medvqa import plugins`: the module, and the package's __init__, which runs first
    assert {"medvqa", "medvqa.plugins"} <= graph["medvqa.views.base"]
    assert len(graph) > 50


@pytest.mark.heavy
def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (break each by moving the shared part down a layer):\n" + (
        "\n".join(" <-> ".join(c) for c in found)
    )


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder (first part below `medvqa`) -> the other folders its modules import."""
    out: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        for target in targets:
            a, b = (m.split(".")[1] if "." in m else "" for m in (module, target))
            if a != b:
                out[a].add(b)
    return out


def test_the_layers_come_from_the_architecture_doc() -> None:
    assert LAYERS["data"] == 1 and LAYERS["cli"] == max(LAYERS.values())
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    missing = sorted((folders | modules) - set(LAYERS))
    assert not missing, f"folders or modules without a row in docs/architecture.md: {missing}"


@pytest.mark.heavy
def test_no_folder_loop() -> None:
    """No two folders import each other, directly or round a longer loop."""
    found = cycles(folder_graph(import_graph()))
    assert not found, "folders that import each other:\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_no_import_goes_up_a_layer() -> None:
    up = [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if layer(target) > layer(module)
    ]
    assert not up, "imports that go up a layer:\n" + "\n".join(up)


@pytest.mark.parametrize("script", ["score", "report", "select", "rater", "catalog"])
def test_a_console_scripts_help_imports_no_model_code(script: str) -> None:
    """`medvqa-<script> --help` answers without importing torch or Lightning (seconds each):
    what a run needs is imported where the run starts. (`medvqa-convert` converts weights:
    torch is its work.)"""
    import subprocess
    import sys

    probe = (
        f"import sys\nfrom medvqa.cli.{script} import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-500:]
