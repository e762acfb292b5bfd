"""The package's shape: imports run one way between the stages, no cycles, a torch-free top level."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import lightning_perf

PACKAGE = Path(lightning_perf.__file__).parent
# Stages from the top (commands) to the bottom (pure analysis): a module may import only its own stage or
# stages below it.
LAYERS = [
    "cli",
    "tensorboard_plugin",
    "tune",
    "trial",
    "callback",
    "run_end",
    "output",
    "probes",
    "collect",
    "traces",
    "analysis",
    "console",
    "atomic_file",
    "processes",
    "yaml_budget",
    "errors",
]
# A module past this is split at a concept's seam, never cut by count (420 before issue 55 shaped the code: five
# modules sat at exactly 420 lines)
MAX_MODULE_LINES = 600
# A function a reader follows in one screen or two; past this it is cut into its named steps
MAX_FUNCTION_LINES = 80
# Functions still over the bound, each to be cut into its steps; a list that only shrinks (empty since issue 55)
LONG_FUNCTIONS: set[str] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every lightning_perf module this file imports, at module level, inside functions or under
    ``if TYPE_CHECKING:``. ``from lightning_perf.collect import compile_events`` is an import of the module
    ``lightning_perf.collect.compile_events`` (and of the package ``lightning_perf.collect``, whose
    ``__init__`` runs first); the names of the top-level package itself (``from lightning_perf import
    console`` -> ``lightning_perf.console``) likewise.

    TYPE_CHECKING-guarded imports count: they never run, so they cannot fail an import, but they are a
    dependency all the same (the module names the other's types, a type checker follows the edge, and the
    first ``isinstance`` on that type turns it into a run-time import). A cycle through one is a cycle of the
    design: break it with a protocol in the lower module, as ``collect.compile_events.WatchedFit`` does."""
    known = modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_perf"):
            if node.level:
                raise AssertionError(f"{path}: relative import of {node.module}; import by the full name")
            for alias in node.names:
                if f"{node.module}.{alias.name}" in known:
                    found.add(f"{node.module}.{alias.name}")
            if node.module != "lightning_perf":
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lightning_perf."))
    return found


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def stage(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def test_every_module_belongs_to_a_stage():
    for name in modules():
        assert stage(name) in [*LAYERS, "__init__"], f"{name} is outside the stages {LAYERS}"


def test_imports_run_one_way_down_the_stages():
    wrong = []
    for name, path in modules().items():
        if stage(name) == "__init__":
            continue
        for target in imports_of(path):
            if LAYERS.index(stage(target)) < LAYERS.index(stage(name)):
                wrong.append(f"{name} -> {target}")
    assert not wrong, "imports going up the stages: " + ", ".join(wrong)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (the top-level ``lightning_perf`` left out: its public
    names load lazily, on first use)."""
    known = modules()
    graph = {name: {t for t in imports_of(path) if t in known} for name, path in known.items()}
    graph.pop("lightning_perf")
    for targets in graph.values():
        targets.discard("lightning_perf")
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import each other (Tarjan's strongly connected
    components, iterative), as a path that starts and ends at the same module; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1 or node in graph.get(node, ()):
                    groups.append(group)
    return sorted(path_through(graph, group) for group in groups)


def path_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle from the group's first module back to itself, inside the group (breadth first)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph.get(node, set()) & group):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {sorted(group)}")  # not reached: a group is strongly connected


def test_no_import_cycle():
    """No module imports itself through others: across stages, and inside one stage or folder too."""
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_the_cycle_check_sees_every_import_form(tmp_path):
    """The forms a cycle can hide in are read as imports: ``from package import module``, an import inside a
    function, one under ``TYPE_CHECKING`` (as ``collect.run_state`` <-> ``collect.compile_events`` once was)."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from lightning_perf.collect import compile_events\n"
        "from lightning_perf import console\n"
        "if TYPE_CHECKING:\n"
        "    from lightning_perf.collect.run_state import PerfSession\n"
        "def later():\n"
        "    import lightning_perf.output.loggers\n"
    )
    assert imports_of(source) == {
        "lightning_perf.collect",
        "lightning_perf.collect.compile_events",
        "lightning_perf.console",
        "lightning_perf.collect.run_state",
        "lightning_perf.output.loggers",
    }
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set(), "e": {"e"}, "f": {"g"}, "g": {"f"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["e", "e"], ["f", "g", "f"]]


def test_every_module_imports_in_a_fresh_interpreter_and_the_top_level_loads_no_torch():
    names = [n for n in modules() if not n.endswith("__main__")]
    code = (
        "import sys, importlib, lightning_perf\n"
        "assert 'torch' not in sys.modules, 'import lightning_perf loaded torch'\n"
        "assert 'lightning' not in sys.modules\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_public_names_resolve_lazily_and_are_listed():
    code = (
        "import sys, lightning_perf\n"
        "listed = set(dir(lightning_perf))\n"
        "assert set(lightning_perf.__all__) <= listed, set(lightning_perf.__all__) - listed\n"
        "assert 'torch' not in sys.modules\n"
        "for name in lightning_perf.__all__: getattr(lightning_perf, name)\n"
        "from lightning_perf.errors import LightningPerfError\n"
        "from lightning_perf.analysis.summary import SummaryError\n"
        "from lightning_perf.traces.read.reader import TraceError\n"
        "from lightning_perf.trial.spec import TrialError\n"
        "from lightning_perf.analysis.verdicts.comparison import CompareError\n"
        "from lightning_perf.traces.report.build import ReportError\n"
        "from lightning_perf.collect.sampling.nvml import GpuUnavailable\n"
        "for e in (SummaryError, TraceError, TrialError, CompareError, ReportError, GpuUnavailable):\n"
        "    assert issubclass(e, LightningPerfError), e\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (PACKAGE / "py.typed").exists()


def test_no_module_is_over_the_size_limit():
    big = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    over = {n: lines for n, lines in big.items() if lines > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split along a seam): {over}"


def long_functions() -> dict[str, int]:
    """Every function (method, nested function) of the package over ``MAX_FUNCTION_LINES``, by qualified name."""
    found = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found[f"{name}.{node.name}"] = lines
    return found


def test_no_function_is_over_the_size_limit():
    found = long_functions()
    over = {name: lines for name, lines in found.items() if name not in LONG_FUNCTIONS}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (cut them into their steps): {over}"
    shrunk = LONG_FUNCTIONS - set(found)
    assert not shrunk, f"no longer over {MAX_FUNCTION_LINES} lines: take them off LONG_FUNCTIONS: {shrunk}"
