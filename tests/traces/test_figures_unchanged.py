"""The typed reader changes no figure: every figure of every real trace equals its dump made with the reader
before typed decoding (main at 3029584; tests/traces/figure_dump.py wrote tests/traces/fixtures/)."""

from __future__ import annotations

import json

import pytest

from tests.traces.figure_dump import FIXTURES, as_in, canonical, dump

FOLDERS = sorted(p.stem for p in FIXTURES.glob("*.json"))


def test_every_real_trace_has_a_dump(realtraces):
    assert sorted(p.name for p in realtraces.iterdir() if p.is_dir()) == FOLDERS


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_figure_equals_the_dump_of_the_previous_reader(realtraces, folder):
    expected = json.loads((FIXTURES / f"{folder}.json").read_text())
    now = as_in(json.loads(canonical(dump(realtraces / folder))), expected)
    for key in expected:  # one assertion a part, so a difference names where it is
        assert now[key] == expected[key], key
    assert now == expected
