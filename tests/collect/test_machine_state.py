"""MachineWatch: other processes' CPU, measured from two readings of the machine's counters."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from lightning_perf.collect.sampling.machine_state import MachineWatch

BURN_S = 1.0


def test_a_busy_child_counts_as_ours_and_an_outside_process_as_other():
    watch = MachineWatch()
    # a child of ours (as a DataLoader worker is) burning CPU: our cores, not "other processes"
    # it burns a fixed amount of CPU time, whatever share of a core this shared machine gives it
    subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 0.5: pass"], check=True)
    state = watch.finish()
    assert state is not None and state.wall_s is not None and state.own_cores is not None
    # its CPU seconds are counted as ours (the kernel accounts them in 10 ms ticks: leave room)
    assert state.own_cores * state.wall_s >= 0.4
    assert state.cpu_count and state.other_cores is not None and 0.0 <= state.other_cores <= state.cpu_count
    assert state.steal_pct is not None and state.steal_pct >= 0.0
    assert state.load_avg_1m is not None


def test_an_outside_burner_shows_as_other_processes(tmp_path):
    # the shell exits at once and leaves the burner orphaned (re-parented): not ours, "other processes"
    pid_file = tmp_path / "pid"
    burn = f"import os,time\nopen({str(pid_file)!r},'w').write(str(os.getpid()))\nend=time.time()+5\nwhile time.time()<end: pass"
    subprocess.run(["sh", "-c", f'{sys.executable} -c "{burn}" >/dev/null 2>&1 &'], check=True)
    try:
        deadline = time.time() + 5
        while not pid_file.exists() or not pid_file.read_text():
            assert time.time() < deadline, "the burner did not start"
            time.sleep(0.05)
        watch = MachineWatch()
        time.sleep(BURN_S)  # we only sleep: our own share stays near zero
        state = watch.finish()
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert state is not None and state.own_cores is not None and state.other_cores is not None
    assert state.own_cores < 0.3
    assert state.other_cores > 0.3  # the burner (and whatever else this machine runs) was busy
