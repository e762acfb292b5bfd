"""The case study's sizes from a step timed on this machine, so that it ends with a measured before/after in minutes.

A fixed size cannot fit every machine: 60 steps of 64 images take 9 s on an idle 2-core CPU and 18 min where a
step takes 17.6 s, and a fixed ``--budget-s`` either starves the rounds there or lets ``tune`` run extra rounds for
long. So the study times a few training steps of the example's own model and loader in this process first (a few
seconds), halves the batch while a step takes over a second, and derives the timed steps and the budget that the
diagnosis and the planned rounds need from that step time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

# A step of a second or less keeps every round short on a slow CPU; below 8 images a batch says little.
MAX_STEP_S = 1.0
MIN_BATCH_SIZE = 8
# Timed work per measured run: enough steps to average out a step's jitter, few enough to stay in minutes.
TIMED_S_PER_RUN = 6.0
MIN_STEPS, MAX_STEPS = 20, 200
# What a measured run costs besides its steps: a fresh process importing torch and Lightning, the CLI building
# the model and data, the warm-up steps. Measured ~10 s on the idle 2-core machine; on the long side on purpose.
RUN_OVERHEAD_S = 12.0
WARMUP_STEPS = 3  # tune's own default warm-up of each round
DIAGNOSIS_EXTRA_S = 10.0  # the diagnosis's num_workers probe (5 s) and its profiler
DIAGNOSIS_MIN_STEPS = 20  # tune diagnoses at least this many steps
# baseline, num_workers, batched_transforms and their combination: what tune proposes for the example's config
VARIANTS = 4
# room above the estimate for a busy machine's slower steps, and for an extra round where the verdict is close
BUDGET_MARGIN = 1.5
CALIBRATION_STEPS = 3
# The floor of the budget: where a small batch is compute-bound, tune's candidates are torch.compile and
# channels_last, whose compile (~30 s a round on 2 cores, measured) the timed step cannot foresee; two rounds of
# the baseline and three such candidates need about 7 min there.
MIN_BUDGET_S = 420.0


@dataclass(frozen=True)
class StudySize:
    """The sizes the study runs with, and the step time they came from."""

    batch_size: int
    steps: int
    budget_s: float
    step_s: float

    def expected_s(self, repeats: int) -> float:
        """Seconds the diagnosis and ``repeats`` rounds of every variant take at the timed step."""
        run_s = RUN_OVERHEAD_S + (self.steps + WARMUP_STEPS) * self.step_s
        diagnosis_s = RUN_OVERHEAD_S + DIAGNOSIS_EXTRA_S
        diagnosis_s += (max(self.steps, DIAGNOSIS_MIN_STEPS) + WARMUP_STEPS) * self.step_s
        return diagnosis_s + repeats * VARIANTS * run_s


def time_step_s(batch_size: int, num_samples: int | None = None) -> float:
    """Seconds of one training step of the example's model on its config's loader (per-sample transforms,
    no workers): the median of a few, after one that warms up."""
    from examples.resnet18_cifar10 import CIFAR10DataModule, ResNet18Classifier

    data = CIFAR10DataModule(batch_size=batch_size, num_samples=num_samples or batch_size * 8)
    data.setup("fit")
    model = ResNet18Classifier()
    model.log = lambda *args, **kwargs: None  # type: ignore[method-assign]  # no Trainer to log to
    optimizer = model.configure_optimizers()
    batches = iter(data.train_dataloader())
    times = []
    for i in range(CALIBRATION_STEPS + 1):
        start = time.perf_counter()
        batch = model.on_after_batch_transfer(next(batches), 0)
        loss = model.training_step(batch, i)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def size_study(
    batch_size: int, repeats: int, steps: int | None = None, fixed_batch: bool = False
) -> StudySize:
    """The batch (unless ``fixed_batch``, halved while a step takes over :data:`MAX_STEP_S`), the steps (``steps``, else about
    :data:`TIMED_S_PER_RUN` of timed work) and the budget the diagnosis and ``repeats`` rounds need."""
    step_s = time_step_s(batch_size)
    while not fixed_batch and step_s > MAX_STEP_S and batch_size // 2 >= MIN_BATCH_SIZE:
        batch_size //= 2
        step_s = time_step_s(batch_size)
    if steps is None:
        steps = min(max(math.ceil(TIMED_S_PER_RUN / step_s), MIN_STEPS), MAX_STEPS)
    size = StudySize(batch_size, steps, 0.0, step_s)
    budget_s = max(math.ceil(size.expected_s(repeats) * BUDGET_MARGIN), MIN_BUDGET_S)
    return StudySize(batch_size, steps, budget_s, step_s)


__all__ = ["StudySize", "size_study", "time_step_s"]
