"""No call that builds or imports code by name takes anything derived from a record.

Every `instantiate(`, `call(`, `get_class(`, `get_method(`, `get_object(`, `_locate(` and
`import_module(` in medvqa/ is listed with the expressions that feed it, followed back through
the assignments of its function and, where a parameter feeds it, through every call of that
function in medvqa/ (a few levels up). The test fails if any of them is fed by a record reader
(`read_record`, `read_plain_json`, `read_manifest`, a W&B record) or a record's name for it
(`record`, `trained`, `recorded`, `from_run`, ...), and if a call appears or changes that is not
in `REVIEWED` (each entry says where its argument comes from: review a new one, then list it).
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "medvqa"
SINKS = {
    "instantiate",
    "call",
    "get_class",
    "get_method",
    "get_object",
    "_locate",
    "import_module",
    "__import__",
}
# What a record (or a file of a run folder) is called wherever it is read: a feed with one of
# these parts is derived from one.
RECORD_PARTS = {
    "read_record",
    "read_plain_json",
    "read_manifest",
    "_read_splits",
    "wandb_run_record",
    "record",
    "records",
    "recorded",
    "previous",
    "trained",
    "trained_cfg",
    "from_run",
    "meta",
    "manifest",
    "report",
}
# Every such call, as `module:function` -> its source; and where its argument comes from.
REVIEWED = {
    "medvqa/scoring/pipeline.py:build_families": (
        "instantiate(node, _convert_='all')",
        "the composed `metric` node (Scoring.from_config(cfg.metric, ...))",
    ),
    "medvqa/generation/predict.py:prediction_trainer": (
        "instantiate(options, **fixed)",
        "the composed `trainer` node",
    ),
    "medvqa/models/adapters.py:build_adapter_config": (
        "instantiate(adapter_cfg, _convert_='all')",
        "the composed `peft.adapter` (task=eval: the installed option's, tasks.from_run)",
    ),
    "medvqa/models/builders/cache.py:CachedModelBuilder._pretrain_source": (
        "instantiate(data)",
        "the builder's own `pretrain.data` node (composed)",
    ),
    "medvqa/models/builders/cache.py:builder_from_yaml": (
        "instantiate(node)",
        "a shipped model YAML (the shipping command, tests)",
    ),
    "medvqa/models/families/base.py:transformers_class": (
        "importlib.import_module(module or 'transformers')",
        "a registered model family's class attribute",
    ),
    "medvqa/models/loading.py:resolve_pretrained": (
        "instantiate(model_cfg.builder)",
        "the composed `model.builder` (task=eval: the installed option's)",
    ),
    "medvqa/planning/sizes.py:dataset_name": (
        "get_class(str(cfg.dataset._target_))",
        "the composed `dataset`",
    ),
    "medvqa/planning/setup.py:build_setup": (
        "get_class(str(cfg.dataset._target_))",
        "the composed `dataset`",
    ),
    "medvqa/plugins.py:_import": (
        "importlib.import_module(module)",
        "built-in plug-in packages, $MEDVQA_PLUGINS, entry points (the user's environment)",
    ),
    "medvqa/plugins.py:discover": (
        "importlib.import_module(package)",
        "the plug-in kinds' packages (PACKAGES)",
    ),
    "medvqa/runner.py:task_of": (
        "instantiate({k: v for k, v in options.items() if k != 'name'})",
        "the composed `task` node",
    ),
    "medvqa/tasks/common.py:prepare_splits": ("instantiate(cfg.dataset)", "the composed `dataset`"),
    "medvqa/tasks/train_eval.py:check_model_for_data": (
        "get_class(str(cfg.dataset._target_))",
        "the composed `dataset`",
    ),
    "medvqa/tasks/train_eval.py:train_eval": ("instantiate(cfg.prompt)", "the composed `prompt`"),
    "medvqa/tasks/train_eval.py:_fit": ("instantiate(cfg.trainer, ", "the composed `trainer`"),
    "medvqa/tracking.py:instantiate_group": (
        "instantiate(node)",
        "a composed group (`logger`, `callbacks`)",
    ),
    "medvqa/training/strategies.py:_strategy_class": (
        "get_class(str(strategy.get('_target_')))",
        "the composed `trainer.strategy`",
    ),
}


@dataclass
class Function:
    path: Path
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef


def _own(function: ast.AST) -> list[ast.AST]:
    """The nodes of a function's own body: not those of the functions and classes nested in it
    (each is a function of its own here)."""
    out, todo = [], list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _functions() -> list[Function]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))

        def visit(node: ast.AST, prefix: str, path: Path = path) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    out.append(Function(path, f"{prefix}{child.name}", child))
                    visit(child, f"{prefix}{child.name}.")

        visit(tree, "")
    return out


# Calls whose value is a number or a truth value, whatever they are given: no class name.
PLAIN_CALLS = {"bool", "int", "float", "len", "isinstance", "callable"}


def _data(expr: ast.AST) -> list[ast.AST]:
    """The nodes of an expression its value is made of: the condition of `a if cond else b`
    chooses between values and is not one (`callbacks if fit else []`), and a comparison or a
    number (`trained is None`, `len(rows)`) names no class."""
    out, todo = [], [expr]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.Compare) or (
            isinstance(node, ast.Call) and _name(node) in PLAIN_CALLS
        ):
            continue
        children = [node.body, node.orelse] if isinstance(node, ast.IfExp) else None
        todo.extend(children or ast.iter_child_nodes(node))
    return out


def _names(expr: ast.AST) -> set[str]:
    """The variables an expression reads (what data flows through)."""
    return {n.id for n in _data(expr) if isinstance(n, ast.Name)}


def _words(expr: ast.AST) -> set[str]:
    """The variables, attributes and called functions an expression is made of."""
    out = set()
    for node in _data(expr):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
    return out


def _bindings(function: ast.AST) -> list[tuple[set[str], ast.AST]]:
    """(variables bound, the expression bound to them) of every binding in a function."""
    out = []
    for node in _own(function):
        if isinstance(node, ast.Assign):
            out.append((set().union(*(_names(t) for t in node.targets)), node.value))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
            out.append((_names(node.target), node.value))
        elif isinstance(node, ast.For | ast.comprehension):
            out.append((_names(node.target), node.iter))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            out.append((_names(node.optional_vars), node.context_expr))
        elif isinstance(node, ast.NamedExpr):
            out.append((_names(node.target), node.value))
    return out


def feeds(function: Function, expr: ast.AST) -> list[ast.AST]:
    """The expressions `expr` is computed from inside `function` (its bindings followed back,
    whatever their order: a variable bound anywhere in the function counts)."""
    found, names = [expr], _names(expr)
    pending = _bindings(function.node)
    changed = True
    while changed:
        changed = False
        for bound, value in pending:
            if bound & names and value not in found:
                found.append(value)
                names |= _names(value)
                changed = True
    return found


def _parameters(function: Function) -> list[str]:
    args = function.node.args
    every = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return [a for a in every if a not in ("self", "cls")]


def upstream(
    function: Function, exprs: list[ast.AST], index: dict, depth: int = 3
) -> list[ast.AST]:
    """What the callers of `function` pass for its parameters that feed `exprs` (and on up)."""
    names = set().union(*(_names(e) for e in exprs))
    params = [p for p in _parameters(function) if p in names]
    if not params or depth == 0:
        return []
    out: list[ast.AST] = []
    positional = _parameters(function)
    for caller, call in _callers(function, index):
        for param in params:
            arg = next((k.value for k in call.keywords if k.arg == param), None)
            if arg is None and positional.index(param) < len(call.args):
                arg = call.args[positional.index(param)]
            if arg is not None:
                fed = feeds(caller, arg)
                out += fed + upstream(caller, fed, index, depth - 1)
    return out


def _module(path: Path) -> str:
    parts = ["medvqa", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> the dotted name it stands for (`from medvqa import plugins` -> plugins:
    medvqa.plugins; `from medvqa.x import f` -> f: medvqa.x.f)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                base = ".".join([*module.split(".")[: -node.level], node.module])
            out.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            out.update({a.asname or a.name: a.name for a in node.names})
    return out


def _call_index(functions: list[Function]) -> dict[str, list[tuple[Function, ast.Call]]]:
    """Callee (`module.qualname`, or `.name` for a method called on an object) -> its calls."""
    paths = sorted({f.path for f in functions})
    imports = {path: _imports(ast.parse(path.read_text()), _module(path)) for path in paths}
    index: dict[str, list[tuple[Function, ast.Call]]] = defaultdict(list)
    for function in functions:
        module, names = _module(function.path), imports[function.path]
        for node in _own(function.node):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name):
                callee = names.get(func.id, f"{module}.{func.id}")
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                target = names.get(func.value.id)
                callee = f"{target}.{func.attr}" if target else f".{func.attr}"
            elif isinstance(func, ast.Attribute):
                callee = f".{func.attr}"
            else:
                continue
            index[callee].append((function, node))
    return index


def _callers(function: Function, index: dict) -> list[tuple[Function, ast.Call]]:
    own = f"{_module(function.path)}.{function.qualname}"
    calls = list(index.get(own, []))
    if "." in function.qualname:  # a method: called on objects, by its name
        calls += index.get(f".{function.qualname.rpartition('.')[2]}", [])
    return calls


@functools.cache
def sink_calls() -> dict[str, tuple[str, set[str]]]:
    """`module:function` -> (the call's source, every word of what feeds it)."""
    functions = _functions()
    index = _call_index(functions)
    out = {}
    for function in functions:
        for node in _own(function.node):
            if not (isinstance(node, ast.Call) and _name(node) in SINKS):
                continue
            fed = [e for arg in [*node.args, *(k.value for k in node.keywords)]
                   for e in feeds(function, arg)]  # fmt: skip
            fed += upstream(function, fed, index)
            key = f"{function.path.relative_to(PACKAGE.parent)}:{function.qualname}"
            out[key] = (ast.unparse(node), set().union(*(_words(e) for e in fed)))
    return out


@pytest.mark.heavy  # the package's every function parsed and followed: seconds
def test_every_call_that_builds_code_by_name_is_reviewed() -> None:
    calls = sink_calls()
    unreviewed = {
        key: source
        for key, (source, _) in calls.items()
        if key not in REVIEWED or not source.startswith(REVIEWED[key][0])
    }
    assert not unreviewed, (
        "calls that build or import code by name, not reviewed: check that nothing a record "
        f"holds feeds them, then list them in REVIEWED: {unreviewed}"
    )
    gone = sorted(set(REVIEWED) - set(calls))
    assert not gone, f"reviewed calls that are gone (remove them from REVIEWED): {gone}"


@pytest.mark.heavy
def test_no_call_that_builds_code_takes_anything_from_a_record() -> None:
    tainted = {
        key: sorted(fed & RECORD_PARTS)
        for key, (_, fed) in sink_calls().items()
        if fed & RECORD_PARTS
    }
    assert not tainted, f"fed by what a record holds: {tainted}"


def test_the_feed_finder_sees_a_record_through_assignments_and_callers() -> None:
    """The finder itself: a record read two steps and one call away is found."""
    source = (
        "def build(node):\n    return instantiate(node)\n"
        "def report(path):\n    rec = read_record(path)\n    node = rec['config']\n"
        "    build(node)\n"
    )
    tree = ast.parse(source)
    build, report = (Function(PACKAGE / "x.py", f.name, f) for f in tree.body)
    call = next(n for n in ast.walk(build.node) if isinstance(n, ast.Call))
    index = {
        "medvqa.x.build": [(report, n) for n in ast.walk(report.node) if isinstance(n, ast.Call)
                           and _name(n) == "build"]
    }  # fmt: skip
    fed = feeds(build, call.args[0])
    words = set().union(*(_words(e) for e in fed + upstream(build, fed, index)))
    assert "read_record" in words
