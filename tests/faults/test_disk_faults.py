"""A full or read-only disk at every file the callback writes, injected by patching ``open`` (no root, no tmpfs).

Sites: Kineto's trace export (it logs and returns instead of raising: emulated with its ``.tmp`` left
behind), the rewritten trace, the collapsed stacks, the Speedscope export, and the run summary (written
before the probes and updated after them). Training must finish with the same weights, one warning must name
the OS error, no partial file may sit under a final name, and what was written before stays whole.
"""

from __future__ import annotations

import builtins
import errno
import logging
import os
from types import SimpleNamespace

import pytest
import torch

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.atomic_file import TEMP_SUFFIX
from tests.faults.checks import check_all, seeded_fit

pytestmark = pytest.mark.slow
# two cycles with every export on: each writes a Kineto trace, its rewrite, stacks and a Speedscope file
# and a diagnosis, so that the summary is written twice: before the probes and updated after them
CONFIG = dict(skip_first=1, wait=0, warmup=1, active=1, repeat=2, with_stack=True, export_speedscope=True,
              probe_num_workers="never", log_hparams=False)  # fmt: skip
ERRORS = {"ENOSPC": errno.ENOSPC, "EROFS": errno.EROFS}


class DiskFaults:
    """Counts the writes lightning-perf makes (its temporaries, and torch's trace exports) and fails one."""

    def __init__(self, monkeypatch, fail_at: int | None = None, code: int = errno.ENOSPC) -> None:
        self.sites: list[str] = []
        self.fail_at = fail_at
        self.code = code
        real_open = builtins.open
        real_export = torch.profiler.profile.export_chrome_trace

        def fake_open(file, mode="r", *args, **kwargs):
            name = os.path.basename(str(file))
            if "w" not in str(mode) or not (name.startswith(".") and TEMP_SUFFIX in name):
                return real_open(file, mode, *args, **kwargs)
            if not self._hit(_site(name)):
                return real_open(file, mode, *args, **kwargs)
            handle = real_open(file, mode, *args, **kwargs)
            return _FailingWrites(handle, self.code, str(file))

        def fake_export(prof, path, *args, **kwargs):
            if not self._hit("kineto"):
                return real_export(prof, path, *args, **kwargs)
            with real_open(path + ".tmp", "w") as partial:  # what Kineto leaves when its write fails
                partial.write('{"traceEvents": [')

        def fake_statvfs(path):  # the disk as the injected error describes it
            full = self.code == errno.ENOSPC
            return SimpleNamespace(
                f_flag=0 if full else os.ST_RDONLY, f_bavail=0 if full else 10**6, f_frsize=4096
            )

        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", fake_export)
        monkeypatch.setattr(os, "statvfs", fake_statvfs)

    def _hit(self, site: str) -> bool:
        self.sites.append(site)
        return len(self.sites) - 1 == self.fail_at


def _site(temporary: str) -> str:
    for part, site in (("summary", "summary"), (".pt.trace.json", "trace"), (".stacks.txt", "stacks"),
                       (".speedscope.json", "speedscope"), ("perf_diagnosis", "diagnosis")):  # fmt: skip
        if part in temporary:
            return site
    return temporary


class _FailingWrites:
    """A real file whose first write puts half its data on disk, then raises the disk error."""

    def __init__(self, handle, code: int, path: str) -> None:
        self._handle, self._code, self._path = handle, code, path

    def write(self, data):
        self._handle.write(data[: len(data) // 2])
        self._handle.flush()
        raise OSError(self._code, os.strerror(self._code), self._path)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()


@pytest.fixture(scope="module")
def write_sites(tmp_path_factory):
    """The writes of a clean run, in order (the sweep fails each of them in turn)."""
    patch = pytest.MonkeyPatch()
    try:
        faults = DiskFaults(patch)
        seeded_fit(tmp_path_factory.mktemp("clean"), [PerfCallback(**CONFIG)])
    finally:
        patch.undo()
    return faults.sites


def test_the_sweep_covers_every_kind_of_write(write_sites):
    # kineto + rewrite + stacks + speedscope per cycle (rewrite: the staged name, then its own temporary), and
    # the summary and the diagnosis once each (no num_workers probe runs here to update them)
    assert {"kineto", "summary", "diagnosis"} <= set(write_sites)
    assert write_sites.count("kineto") == 2 and write_sites.count("summary") == 1
    assert write_sites.count("diagnosis") == 1 and len(write_sites) == 10


@pytest.mark.parametrize("error", list(ERRORS))
def test_a_disk_error_at_every_write(tmp_path, monkeypatch, caplog, write_sites, reference_weights, error):
    """One case per write site and error (the count is asserted above; the loop keeps the ids stable)."""
    for index, site in enumerate(write_sites):
        run_dir = tmp_path / f"{index}-{site}"
        faults = DiskFaults(monkeypatch, fail_at=index, code=ERRORS[error])
        callback = PerfCallback(**CONFIG)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lightning_perf"):
            fit_trainer, model = seeded_fit(run_dir, [callback])
        monkeypatch.undo()
        where = f"write {index} ({site})"
        assert fit_trainer.state.finished, where
        assert all(a.equal(b) for a, b in zip(model.parameters(), reference_weights, strict=True)), where
        named = [r.getMessage() for r in caplog.records if error in r.getMessage()]
        assert len(named) == 1, f"{where}: expected one warning naming {error}, got {named}"
        assert faults.sites[index] == site, where
        log_dir = fit_trainer.log_dir
        summary = check_all(log_dir, callback)
        if site != "summary":
            assert summary is not None, where
            # the failing write's cycle (each starts with torch's export): its trace is lost when the trace
            # itself failed, kept when an export beside it failed; the disk being full, no cycle follows
            cycle = write_sites[: index + 1].count("kineto")
            assert len(summary.traces) == (cycle - 1 if site in ("kineto", "trace") else cycle), where
        elif index == write_sites.index("summary"):  # the first write: none is on disk, none is retried
            assert not os.path.exists(os.path.join(log_dir, SUMMARY_FILENAME)), where
        else:  # the update after the probes failed: the first summary stays, whole
            assert RunSummary.load(os.path.join(log_dir, SUMMARY_FILENAME)).timing.steps > 0, where
