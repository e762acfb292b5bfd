"""Workers advice that never makes a run slower (issue 42): real fits on quick loaders, where each batch a worker
hands over (pickled, queued through shared memory, rebuilt) costs more than loading it in the training thread.

Each fit's findings are checked for contradictions (tests/input_consistency.py); where the advice changes the
workers, it is followed in a second fit and timed. Timing asserts only on effects many times this machine's noise
(0 against 2 workers on a batch of 2: 1.3-1.7x), and "not slower" with a 5% allowance.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_perf import PerfCallback
from lightning_perf.analysis.rules.inputs.loading import COMPUTES, loading_of
from lightning_perf.analysis.summary import RunSummary
from tests.helpers import TinyModel, loader, trainer
from tests.input_consistency import contradictions

# the workers' share of their time waiting for a core past which others crowded the cores: the large-batch test's
# own 2 workers read 13-16% on a quiet 2-core machine, 48-62% beside two CPU hogs
CROWDED_SHARE = 0.2


def fit(tmp_path, data: DataLoader, steps: int, model=None, **perf) -> RunSummary:
    options = {"enable_profiler": False, "probe_num_workers": "never", "ab_cudnn_benchmark": False, **perf}
    callback = PerfCallback(**options)
    run = trainer(tmp_path, [callback], max_steps=steps, log_every_n_steps=10)
    run.fit(model or TinyModel(), data)
    summary = callback.last_summary
    assert not contradictions(summary), contradictions(summary)
    return summary


def advised_workers(summary: RunSummary) -> int | None:
    changes = [
        f.settings_change["num_workers"] for f in summary.findings if "num_workers" in f.settings_change
    ]
    return changes[0] if changes else None


def busy(summary: RunSummary) -> bool:
    """Other processes used the cores while this run measured (the machine is named among the findings)."""
    return any(f.id == "noisy_machine" for f in summary.findings)


def input_bound(summary: RunSummary) -> bool:
    found = next((f for f in summary.findings if f.id == "input_bound"), None)
    return found is not None and found.severity in ("high", "medium")


def test_in_memory_tensors_with_0_workers_get_no_workers_advice(tmp_path):
    """In-memory tensors and a tiny model: the fetch is a fraction of a millisecond, a worker's hand-off several
    (one worker made such a run 4.4x slower). Failed before: 'set num_workers=1'."""
    summary = fit(tmp_path, loader(4 * 300, 4), 300)
    said = [(f.id, f.evidence, f.recommendation) for f in summary.findings]
    assert advised_workers(summary) is None, (said, summary.probes.handoff)
    if input_bound(summary):  # the wait is a visible share: the hand-off was measured
        handoff = summary.probes.handoff
        assert handoff is not None and handoff.ms_per_batch and handoff.load_ms, handoff
        assert handoff.ms_per_batch > handoff.load_ms > 0, handoff
        said = next(f for f in summary.findings if f.id == "input_bound").recommendation
        # the reason; or, where others held the cores, that no count can be sized beside them
        assert "hands a batch over in" in said or "not measured: other processes" in said, said


def test_the_probe_answers_0_workers_for_in_memory_tensors(tmp_path):
    """probe_num_workers='always' measures 0 against worker counts: 0 is fastest, so no count is advised (or, on a
    machine busied by other work, the probe says 'not measured' and no count is advised either)."""
    summary = fit(tmp_path, loader(4 * 300, 4), 300, probe_num_workers="always", probe_budget_s=4.0)
    probe = summary.probes.num_workers
    assert probe is not None
    assert probe.suggested == 0 or (probe.disturbed and probe.suggested is None), probe.reason
    assert advised_workers(summary) is None, [f.recommendation for f in summary.findings]


def test_batch_of_2_cheap_samples_with_2_workers_is_told_fewer_and_following_it_is_faster(tmp_path):
    """Two workers hand over a batch of 2 in-memory samples: the hand-off is the wait. Failed before: 'set
    num_workers=4' and prefetch_factor=4 (1.3-1.4x slower); 0 workers is faster."""
    steps = 400
    before = fit(tmp_path / "before", loader(2 * steps, 2, num_workers=2), steps)
    advised = advised_workers(before)
    assert advised is not None and advised < 2, [f.recommendation for f in before.findings]
    assert not any(f.id == "prefetch_factor" for f in before.findings)
    after = fit(tmp_path / "after", loader(2 * steps, 2, num_workers=advised), steps)
    speedup = before.timing.step_time_ms.mean / after.timing.step_time_ms.mean
    # others holding the cores give the run with more processes more of the machine (0.92x measured beside a
    # load of 4.5): the advice is for the machine it measured, so a fit the tool found busy excuses it
    assert speedup > 1.0 or busy(before) or busy(after), f"2 -> {advised} workers: {speedup:.2f}x"


class Generated(Dataset):
    """Large generated samples (3x256x256 float32): cheap to make, 12.6 MB a batch of 16 to hand over."""

    def __len__(self) -> int:
        return 16 * 40

    def __getitem__(self, index: int):
        return torch.rand(3, 256, 256), torch.zeros(1)


class PoolModel(TinyModel):
    def training_step(self, batch, batch_idx):
        images, target = batch
        return super().training_step(
            (images.mean(dim=(1, 2, 3)).unsqueeze(1).expand(-1, 8), target), batch_idx
        )


def test_large_generated_samples_with_2_workers_are_never_told_more_workers(tmp_path):
    """12.6 MB batches cost ~14 ms each to hand over here: 2 workers were told 4 (0 is 1.4x faster). Now the
    hand-off is charged: never more workers, and fewer only where the model predicts them faster."""
    data = DataLoader(Generated(), batch_size=16, num_workers=2)
    summary = fit(tmp_path, data, 40, model=PoolModel())
    advised = advised_workers(summary)
    assert advised is None or advised < 2, [f.recommendation for f in summary.findings]
    if input_bound(summary):
        assert summary.probes.handoff is not None
        assert summary.probes.handoff.batch_bytes == 16 * 3 * 256 * 256 * 4 + 16 * 4


def test_large_in_memory_samples_with_2_workers_are_told_0_and_following_it_is_faster(tmp_path):
    """12.6 MB batches already in memory: the workers spend their time handing them over (2 workers 10.5-11.7 ms
    a step here, 0 workers 2.1-2.6 ms). Told 0 workers, also where the saturated workers fire batched_transforms
    (which used to replace the advice with "More workers will not help"); following it is faster."""
    data = TensorDataset(torch.randn(480, 3, 256, 256), torch.randn(480, 1))
    summary = fit(tmp_path / "two", DataLoader(data, batch_size=16, num_workers=2), 60, model=PoolModel())
    advised = advised_workers(summary)
    loading = loading_of(summary)
    if busy(summary) or (loading is not None and (loading.queue_share or 0.0) >= CROWDED_SHARE):
        # others used the cores (CI's other test process), named or seen as the workers' wait for a core (26% in
        # one CI run, the machine not named busy; the model then kept 2): never more workers
        assert advised is None or advised < 2, [f.recommendation for f in summary.findings]
        return
    assert advised == 0, [f.recommendation for f in summary.findings]
    followed = fit(tmp_path / "zero", DataLoader(data, batch_size=16, num_workers=0), 60, model=PoolModel())
    assert advised_workers(followed) is None  # and the run that follows it is told to keep it
    assert followed.timing.step_time_ms.mean < summary.timing.step_time_ms.mean


class Decode(Dataset):
    """Each sample computes 2 ms of CPU time (a JPEG decode, a pandas row), no sleep."""

    def __len__(self) -> int:
        return 4 * 120

    def __getitem__(self, index: int):
        end = time.thread_time() + 0.002
        while time.thread_time() < end:
            pass
        return torch.zeros(8), torch.zeros(1)


def test_a_decoding_loader_with_0_workers_beside_two_hogs_is_not_named_waiting(tmp_path, cpu_hogs):
    """Under load a fetch that computes is half on a core, half waiting for one: before, 'waits 50% of its time
    (storage, network, a sleep or a lock)'. Now the training thread's run-queue time during its fetches says so,
    the machine is named first, and no workers count is given beside 'measure again before acting'."""
    summary = fit(tmp_path, DataLoader(Decode(), batch_size=4), 120, model=TinyModel(step_delay_s=0.005))
    loading = loading_of(summary)
    assert loading is not None and loading.cause == COMPUTES, loading.describe() if loading else None
    assert summary.timing.fetches_runqueue_sampled >= 3
    assert "waiting for a core" in loading.describe()
    first = summary.findings[0]
    assert first.id == "noisy_machine" and first.severity == "high", [f.title for f in summary.findings]
    assert advised_workers(summary) is None


def test_short_epochs_with_restarting_workers_are_graded_on_wall_time(tmp_path):
    """Workers that restart every short epoch: each start-up is a wait the steps leave out (before: '6.6% wait',
    not input-bound, while the starts took a third of the wall time). Graded with the later epochs' starts
    counted, and the fix said as a settings change."""
    data = loader(4 * 8, 4, num_workers=2)  # 8 in-memory batches an epoch, non-persistent workers
    options = {"enable_profiler": False, "probe_num_workers": "never", "ab_cudnn_benchmark": False}
    callback = PerfCallback(**options)
    model = TinyModel(step_delay_s=0.03)  # 30 ms steps: the steady wait is a few percent of them
    trainer(tmp_path, [callback], max_epochs=12, log_every_n_steps=10).fit(model, data)
    summary = callback.last_summary
    assert not contradictions(summary), contradictions(summary)
    found = {f.id: f for f in summary.findings}
    assert summary.timing.epochs == 12
    assert found["input_bound"].severity in ("high", "medium"), found["input_bound"].evidence
    assert "start-up counted" in found["input_bound"].evidence
    assert found["input_bound"].settings_change == {"persistent_workers": True}
