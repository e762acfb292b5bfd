"""Reading gzip traces with ISA-L's decompressor (``isal``) changes nothing but the speed: the same text and the
same figures as the standard library's zlib, and the same named errors on corrupt or truncated files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lightning_perf.traces.read import gunzip
from lightning_perf.traces.read.json_scanner import TraceError
from lightning_perf.traces.read.loader import load_trace
from lightning_perf.traces.report.build import find_traces
from tests.traces.figure_dump import FIXTURES, as_in, canonical, dump

FOLDERS = sorted(p.stem for p in FIXTURES.glob("*.json"))


@pytest.fixture(params=["isal", "zlib"])
def decompressor(request, monkeypatch):
    """Each test twice: with the decompressor installed here (isal) and with the fallback of platforms
    without an isal wheel (the standard library's gzip)."""
    if request.param == "zlib":
        monkeypatch.setattr(gunzip, "_gzip_module", gzip)
    return request.param


def test_isal_is_installed_where_it_has_wheels():
    # pyproject installs isal on x86_64 and arm64: this machine must read traces with it
    assert gunzip.FAST_GUNZIP


@pytest.mark.parametrize("folder", FOLDERS)
def test_isal_and_zlib_read_the_same_text(realtraces, folder):
    (path,) = find_traces(str(realtraces / folder))
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        expected = fh.read()
    with gunzip.open_gzip_text(path) as fh:
        assert fh.read() == expected


@pytest.mark.parametrize("folder", FOLDERS)
def test_either_decompressor_gives_every_figure_of_the_dump(realtraces, folder, decompressor):
    expected = json.loads((FIXTURES / f"{folder}.json").read_text())
    assert as_in(json.loads(canonical(dump(realtraces / folder))), expected) == expected


def test_a_truncated_gzip_trace_is_a_named_error(realtraces, tmp_path, decompressor):
    (path,) = find_traces(str(realtraces / "resnet50_v100_workers4"))
    data = Path(path).read_bytes()
    cut = tmp_path / "cut.pt.trace.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="cut.pt.trace.json.gz: truncated or corrupt gzip data"):
        load_trace(cut)


def test_corrupt_gzip_data_is_a_named_error(realtraces, tmp_path, decompressor):
    (path,) = find_traces(str(realtraces / "resnet50_v100_workers4"))
    data = Path(path).read_bytes()
    first_block = data.index(b"\x00", 10) + 1  # after the header's file name (torch's files have one)
    bad = (
        data[:first_block] + bytes([data[first_block] | 0x06]) + data[first_block + 1 :]
    )  # a reserved block type
    named = tmp_path / "bad.pt.trace.json.gz"
    named.write_bytes(bad)
    with pytest.raises(TraceError, match="bad.pt.trace.json.gz: truncated or corrupt gzip data"):
        load_trace(named)
    # a file not named as torch names traces is sniffed for traceEvents: a corrupt one is simply not a trace
    (tmp_path / "other.json.gz").write_bytes(bad)
    assert find_traces(str(tmp_path)) == [str(named)]
