"""Two fits with identical settings while a CPU-burning process runs beside them: compare must not call a
confident slowdown. It says "no measurable difference", calls the difference noise, or flags the machine."""

from __future__ import annotations

import subprocess
import sys

from lightning_perf import PerfCallback
from lightning_perf.cli import main
from tests.helpers import TinyModel, loader, trainer

BURN = "import time\nend = time.time() + 60\nwhile time.time() < end:\n    pass\n"


def fit(tmp_path, version: str) -> str:
    callback = PerfCallback(enable_profiler=False, utilization=False, probe_num_workers="never")
    run = trainer(tmp_path, [callback], limit_train_batches=60, logger=True)
    run.logger._version = version  # a named run, as `--name`/version would give it
    run.fit(TinyModel(), loader(n=240, batch_size=4))
    return run.logger.log_dir


def test_identical_fits_beside_a_cpu_burner_are_never_a_confident_change(tmp_path, capsys):
    burner = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        first, second = fit(tmp_path, "first"), fit(tmp_path, "second")
    finally:
        burner.kill()
        burner.wait()
    assert main(["compare", first, second, "--no-tensorboard", "--fail-if-slower", "5"]) in (0, 1)
    out = capsys.readouterr().out
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    flagged = (
        "same settings: differences are noise" in verdict
        or "no measurable difference" in verdict
        or "the machine changed between the runs" in verdict
        or "measured on a busy machine" in out
    )
    assert flagged, out
    assert "method: batch means" in out
    # with nothing differing, a significant difference is blamed on the machine, never on the settings
    assert "(no settings differ between the runs)" in out
