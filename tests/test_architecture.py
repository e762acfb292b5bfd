"""The package's shape: imports run one way between the stages, no cycles, a torch-free top level."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import lightning_perf

PACKAGE = Path(lightning_perf.__file__).parent
# Stages from the top (commands) to the bottom (pure analysis): a module may import only its own stage or
# stages below it.
LAYERS = [
    "cli",
    "trial",
    "callback",
    "output",
    "probes",
    "collect",
    "traces",
    "analysis",
    "console",
    "atomic_file",
    "errors",
]
MAX_MODULE_LINES = 420


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every lightning_perf module this file imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_perf"):
            if node.module == "lightning_perf":
                continue
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lightning_perf."))
    return found


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


def test_no_import_cycle():
    graph = {name: {t for t in imports_of(path) if t in modules()} for name, path in modules().items()}
    graph.pop("lightning_perf")
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(node) :], node]))
        if node in done:
            return
        for target in graph.get(node, ()):
            visit(target, [*path, node])
        done.add(node)

    for node in graph:
        visit(node, [])


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
