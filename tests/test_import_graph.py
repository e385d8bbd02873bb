"""The package's import graph (issues 18, 31): no upward import between layers
(core <- planners <- epoch <- torch_glue / streaming <- integrations / cli), no
planner importing a sibling (they share planners/toolkit.py), the plan layer and
the streaming glue free of Numba (core holds kernels only where named), no cycle
among module-level imports, and no cycle hidden by a function-level import."""

from __future__ import annotations

import ast
import functools
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "streambatch")
LAYER = {"core": 0, "planners": 1, "epoch": 2, "torch_glue": 3, "streaming": 3, "integrations": 4, "cli": 4}


def modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


MODULES = modules()


@functools.cache
def parsed(path: str) -> ast.Module:
    """The syntax tree of one module, parsed once for every test here (they walk the same ~200 files)."""
    with open(path) as f:
        return ast.parse(f.read())


@functools.cache
def imports(module: str) -> list[tuple[str, bool]]:
    return _imports(module)


def _imports(module: str) -> list[tuple[str, bool]]:
    """(imported streambatch module, at module level) of every import in ``module``."""
    path = MODULES[module]
    package = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
    tree = parsed(path)
    top = set()
    for node in tree.body:  # module level, including ``if TYPE_CHECKING:`` / try blocks at that level
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                break
            top.add(id(sub))
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            mod = ".".join(x for x in (base, node.module) if x)
            names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        for n in names:
            while n and n not in MODULES:
                n = n.rpartition(".")[0]
            if n.startswith("streambatch"):
                out.append((n, id(node) in top and not _type_checking(tree, node)))
    return out


def _type_checking(tree, node) -> bool:
    for top in tree.body:
        if (isinstance(top, ast.If) and "TYPE_CHECKING" in ast.unparse(top.test)
                and any(sub is node for sub in ast.walk(top))):
            return True
    return False


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYER.get(parts[1]) if len(parts) > 1 else None


def test_no_upward_imports():
    bad = []
    for m in MODULES:
        for target, _ in imports(m):
            a, b = layer(m), layer(target)
            if a is not None and b is not None and b > a:
                bad.append(f"{m} -> {target}")
            if a == b == 3 and m.startswith("streambatch.torch_glue") and target.startswith("streambatch.streaming"):
                bad.append(f"{m} -> {target} (streaming builds on torch_glue, not the reverse)")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def cycles(module_level_only: bool) -> list[list[str]]:
    graph = {m: sorted({t for t, top in imports(m) if (top or not module_level_only) and t != m}) for m in MODULES}
    # a package's __init__ importing its own submodules is how re-exports work: not an edge back
    for m, targets in graph.items():
        graph[m] = [t for t in targets if not (MODULES[m].endswith("__init__.py") and t.startswith(m + "."))]
        # a submodule importing its parent package means importing the parent's __init__
    color: dict[str, int] = {}
    found = []

    def visit(m, stack):
        color[m] = 1
        stack.append(m)
        for t in graph[m]:
            if color.get(t) == 1:
                found.append(stack[stack.index(t):])
            elif t not in color:
                visit(t, stack)
        stack.pop()
        color[m] = 2

    for m in sorted(graph):
        if m not in color:
            visit(m, [])
    return found


def test_no_cycles_among_module_level_imports():
    assert not cycles(True), "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles(True))


def test_no_cycles_behind_function_level_imports():
    found = cycles(False)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def function_level_imports(module: str) -> list[int]:
    """Lines of the imports of streambatch modules inside functions of ``module``."""
    path = MODULES[module]
    tree = parsed(path)
    lines = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("streambatch")):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_function_level_imports_are_lazy_for_start_up():
    # A function-level import is kept only to spare start-up (no numba before the first plan: test_startup.py),
    # and says so; one that only hid a cycle must be a module-level import now (the graph has no cycles).
    bad = []
    for m, path in MODULES.items():
        if layer(m) not in (0, 1, 2, 3):  # the command line and integrations import lazily to keep --help fast
            continue
        with open(path) as f:
            text = f.read().splitlines()
        for line in function_level_imports(m):
            i = line - 1
            while i > 0 and "lazy" not in text[i] and text[i].strip().startswith(("from ", "import ")):
                i -= 1  # an import block shares the comment above it
            if "lazy" not in text[i]:
                bad.append(f"{m}:{line}: {text[line - 1].strip()}")
    assert not bad, "function-level imports without a '# lazy for start-up' reason:\n" + "\n".join(bad)


# streaming's parts, lowest first: a module imports its own part and the parts before it, never one after
# (the stages read downward: catalog (shards) -> the pass's stages (pipeline) -> the dataset; the epoch plan is the
# plan layer's, streambatch.epoch).
STREAMING = ("errors", "formats", "io", "runtime", "shards", "pipeline", "options", "dataset")


def streaming_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "streaming" else None


def test_streaming_parts_import_downward():
    bad = []
    for m in MODULES:
        a = streaming_part(m)
        if a is None:
            continue
        for target, _ in imports(m):
            b = streaming_part(target)
            if b is not None and STREAMING.index(b) > STREAMING.index(a):
                bad.append(f"{m} -> {target}")
    assert not bad, "streaming imports against the stage order " + str(STREAMING) + ":\n" + "\n".join(sorted(bad))
    assert {streaming_part(m) for m in MODULES} - {None} == set(STREAMING)  # every part has its place


def planner_of(module: str) -> str | None:
    """The planner (sub-package of streambatch.planners) a module belongs to, or None."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "planners" and os.path.isdir(os.path.join(ROOT, "planners", parts[2])):
        return parts[2]
    return None


def test_no_planner_imports_a_sibling():
    # A planner imports its own modules, the shared ones beside it (base, options, toolkit, step_order, ...) and
    # the layers below; never another planner, nor the registry package that imports every planner. Planners
    # compose through the registry at run time (core/registry.py), e.g. the shard-affine planner's pools.
    bad = []
    for m in MODULES:
        own = planner_of(m)
        if not m.startswith("streambatch.planners."):
            continue
        for target, _ in imports(m):
            other = planner_of(target)
            if target == "streambatch.planners" or (other is not None and other != own):
                bad.append(f"{m} -> {target}")
    assert not bad, "planners importing a sibling (or shared code importing a planner):\n" + "\n".join(sorted(bad))
    assert {p for m in MODULES if (p := planner_of(m))} >= {"greedy", "bucketed", "shard_affine"}


def test_the_plan_layer_and_the_glue_hold_no_kernels():
    # Numba lives in the planners (and core's hashing, shuffles and fewest-steps count); the plan layer (epoch) is
    # numpy, and streaming touches bytes: no kernels, and no planner chosen by name (the read-mode registry and the
    # planners' own constants name them).
    import ast

    from streambatch.planners import PLANNERS

    bad = []
    for m, path in MODULES.items():
        if not m.startswith(("streambatch.epoch", "streambatch.streaming")):
            continue
        tree = parsed(path)
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if kernel_import(node):
                bad.append(f"{m}:{node.lineno}: imports numba")
            if (m.startswith("streambatch.streaming") and isinstance(node, ast.Constant)
                    and id(node) not in docstrings and node.value in PLANNERS):
                bad.append(f"{m}:{node.lineno}: names the planner {node.value!r}")
    assert not bad, "\n".join(bad)


# The core modules that may hold kernels (import numba at module level): the hashes and shuffles every layer draws
# from, and the fewest-steps count of core/bounds.py (issue 30). That count is part of the batch rule: the
# constraint (core/constraint.py) answers "how few steps can these lengths take" for every planner, and the plan
# layer's step budget (epoch/step_budget.py) asks it over a whole epoch, below any planner, so it cannot live in
# planners/toolkit.py without an upward import. Anything else in core is numpy.
CORE_KERNELS = {"streambatch.core.hashing", "streambatch.core.shuffle", "streambatch.core.bounds_kernel",
                "streambatch.core.jit"}


def kernel_import(node: ast.AST) -> bool:
    """Whether ``node`` imports Numba: numba itself, or its ``njit`` from core/jit.py (issue 32: every kernel
    module takes it from there, directly or through planners/toolkit.py's re-export)."""
    if not isinstance(node, (ast.Import, ast.ImportFrom)):
        return False
    module = getattr(node, "module", None) or ""
    names = [a.name for a in node.names] + [module]
    return (any(n == "numba" or n.startswith("numba.") for n in names)
            or isinstance(node, ast.ImportFrom) and (any(a.name in ("njit", "jit") for a in node.names)
                                                      or module == "jit" or module.endswith("core.jit")))


def imports_numba(path: str) -> list[int]:
    """Lines of the module-level imports of numba (or of core/jit.py's njit) in the file at ``path`` (a
    function-level one is lazy)."""
    tree = parsed(path)
    return [node.lineno for node in tree.body if kernel_import(node)]


def test_numba_in_core_only_where_named():
    bad = [f"{m}:{line}: imports numba" for m, path in MODULES.items()
           if m.startswith("streambatch.core.") and m not in CORE_KERNELS for line in imports_numba(path)]
    assert not bad, "\n".join(bad)
    # the check sees what it is about: the named kernel modules do import numba (through core/jit.py's njit,
    # issue 32), and so does a planner's kernel module
    for m in ("streambatch.core.hashing", "streambatch.core.shuffle", "streambatch.core.bounds_kernel",
              "streambatch.core.jit", "streambatch.planners.bucketed.sort", "streambatch.planners.shard_affine.walk"):
        assert imports_numba(MODULES[m]), m
    assert not imports_numba(MODULES["streambatch.core.bounds"])  # the numpy side of the fewest steps


def test_the_graph_sees_imports():
    # the walker finds the edges it is about (a test that cannot fail by seeing none)
    edges = {t for t, _ in imports("streambatch.streaming.dataset")}
    assert "streambatch.epoch.windows" in edges and "streambatch.core.config" in edges
    assert layer("streambatch.cli.main") == 4 and layer("streambatch.core.cost") == 0
    assert layer("streambatch.epoch.epoch_plan") == 2
    assert function_level_imports("streambatch.epoch.sample_loop")  # (the lazy interleaver import)
    assert planner_of("streambatch.planners.bucketed.steps") == "bucketed"
    assert planner_of("streambatch.planners.base") is None
    edges = {t for t, _ in imports("streambatch.planners.shard_affine.planner")}
    assert "streambatch.planners.options" in edges and "streambatch.planners.shard_affine.holders" in edges
    assert {t for t, _ in imports("streambatch.planners.greedy.placement")} >= {"streambatch.planners.toolkit"}


def test_no_two_classes_share_a_name():
    # one name, one class: a reader who greps a name finds the one thing it means (there were two EpochPlans)
    import ast
    import collections

    where = collections.defaultdict(list)
    for m, path in MODULES.items():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(m)
    twice = {name: ms for name, ms in where.items() if len(ms) > 1}
    assert not twice, twice
    assert len(where["EpochPlan"]) == 1 and where["EpochPlan"] == ["streambatch.epoch.epoch_plan"]
