"""The typed reader changes no figure: every figure of every real trace equals its dump made with the reader
before typed decoding (main at 3029584; tests/traces/figure_dump.py wrote tests/traces/fixtures/)."""

from __future__ import annotations

import json

import pytest

from tests.traces.figure_dump import FIXTURES, canonical, dump

FOLDERS = sorted(p.stem for p in FIXTURES.glob("*.json"))


def test_every_real_trace_has_a_dump(realtraces):
    assert sorted(p.name for p in realtraces.iterdir() if p.is_dir()) == FOLDERS


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_figure_equals_the_dump_of_the_previous_reader(realtraces, folder):
    expected = json.loads((FIXTURES / f"{folder}.json").read_text())
    now = _as_in(json.loads(canonical(dump(realtraces / folder))), expected)
    for key in expected:  # one assertion a part, so a difference names where it is
        assert now[key] == expected[key], key
    assert now == expected


def _as_in(now, expected):
    """``now`` with only the keys ``expected`` has: keys added since the dump (e.g. a trace's ``backend``, from
    the cross-rank view) are new figures, not changed ones; every key of the dump must still be there."""
    if isinstance(expected, dict) and isinstance(now, dict):
        return {k: _as_in(now[k], v) if k in now else now.get(k, "<missing>") for k, v in expected.items()}
    if isinstance(expected, list) and isinstance(now, list) and len(now) == len(expected):
        return [_as_in(n, e) for n, e in zip(now, expected, strict=True)]
    return now
