"""Tiny models, datasets and trace readers shared by the tests (real Lightning, real torch)."""

from __future__ import annotations

import glob
import gzip
import json
import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from lightning_perf.traces.exports import SPEEDSCOPE_SCHEMA

FEATURES = 8


class SleepyDataset(Dataset):
    """``n`` random samples; each ``__getitem__`` sleeps ``delay_s`` (a DataLoader with a known cost)."""

    def __init__(self, n: int = 64, delay_s: float = 0.0, features: int = FEATURES) -> None:
        self.n = n
        self.delay_s = delay_s
        self.data = torch.randn(n, features)
        self.target = torch.randn(n, 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.data[index], self.target[index]


class SleepyIterable(IterableDataset):
    """An iterable (no ``len``) version: Lightning prefetches one batch ahead for these."""

    def __init__(self, n: int = 64, delay_s: float = 0.0) -> None:
        self.n = n
        self.delay_s = delay_s
        self.sample_s: list[float] = []  # what each sample took to make, as the machine's load let it

    def __iter__(self):
        for _ in range(self.n):
            started = time.perf_counter()
            if self.delay_s:
                time.sleep(self.delay_s)
            sample = torch.randn(FEATURES), torch.randn(1)
            self.sample_s.append(time.perf_counter() - started)
            yield sample


class TinyModelSteps:
    """TinyModel's body, mixed into a LightningModule of either namespace (``lightning.pytorch`` or
    ``pytorch_lightning``)."""

    def __init__(self, step_delay_s: float = 0.0, fail_at_batch: int | None = None, interrupt: bool = False):
        super().__init__()
        self.layer = torch.nn.Linear(FEATURES, 1)
        self.step_delay_s = step_delay_s
        self.fail_at_batch = fail_at_batch
        self.interrupt = interrupt
        self.seen_batches = 0

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        self.seen_batches += 1
        if self.fail_at_batch is not None and self.seen_batches > self.fail_at_batch:
            raise KeyboardInterrupt if self.interrupt else RuntimeError("injected failure")
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class TinyModel(TinyModelSteps, L.LightningModule):
    pass


class TwoOptimizerModel(TinyModel):
    """Manual optimization with two optimizers stepped in every training_step."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.other = torch.nn.Linear(FEATURES, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt_a, opt_b = self.optimizers()
        for opt, layer in ((opt_a, self.layer), (opt_b, self.other)):
            loss = torch.nn.functional.mse_loss(layer(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.layer.parameters(), lr=0.01), torch.optim.Adam(self.other.parameters())


def loader(
    n: int = 64, batch_size: int = 4, delay_s: float = 0.0, num_workers: int = 0, **kwargs
) -> DataLoader:
    return DataLoader(SleepyDataset(n, delay_s), batch_size=batch_size, num_workers=num_workers, **kwargs)


def trainer(tmp_path, callbacks, pl=L, **kwargs) -> L.Trainer:
    """A quiet one-epoch Trainer of the namespace ``pl`` (``lightning``, or ``pytorch_lightning``)."""
    options = dict(
        default_root_dir=str(tmp_path),
        max_epochs=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=True,
        log_every_n_steps=5,
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **options)


def trace_files(directory) -> list[str]:
    return sorted(glob.glob(os.path.join(str(directory), "**", "*.pt.trace.json*"), recursive=True))


def load_trace(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def complete_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def step_spans(trace: dict) -> list[dict]:
    spans = [e for e in complete_events(trace) if str(e.get("name", "")).startswith("ProfilerStep#")]
    return sorted(spans, key=lambda e: e["ts"])


def events_inside(trace: dict, span: dict) -> list[dict]:
    start, end = span["ts"], span["ts"] + span["dur"]
    return [
        e
        for e in complete_events(trace)
        if e is not span
        and e.get("pid") == span.get("pid")
        and start <= e["ts"]
        and e["ts"] + e["dur"] <= end
    ]


class TinyDataModule(L.LightningDataModule):
    """Typed arguments so the Lightning CLI can configure it from YAML."""

    def __init__(self, n: int = 64, batch_size: int = 4, delay_s: float = 0.0, num_workers: int = 0) -> None:
        super().__init__()
        self.n = n
        self.batch_size = batch_size
        self.delay_s = delay_s
        self.num_workers = num_workers

    def train_dataloader(self) -> DataLoader:
        return loader(self.n, self.batch_size, self.delay_s, self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return loader(max(self.batch_size, self.n // 4), self.batch_size, 0.0, 0)


def profile_tiny_loop(out_dir: str, *, cycles: int = 1, batches: int = 8, on_ready=None, **profiler_kwargs):
    """Real training steps of a plain torch loop under torch.profiler (wait=1, warmup=1, active=3, ``cycles``
    cycles), one trace file per cycle; ``on_ready(prof, base)`` runs after each export. Returns the trace paths."""
    import warnings

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    samples = max(batches, 5 * cycles) * 8
    data = DataLoader(
        torch.utils.data.TensorDataset(torch.randn(samples, 16), torch.randint(0, 4, (samples,))), 8
    )
    paths: list[str] = []

    def ready(prof) -> None:
        base = os.path.join(out_dir, f"host_rank0.{prof.step_num:04d}")
        paths.append(base + ".pt.trace.json.gz")
        prof.export_chrome_trace(paths[-1])
        if on_ready is not None:
            on_ready(prof, base)

    schedule = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=cycles)
    with (
        warnings.catch_warnings(),
        torch.profiler.profile(schedule=schedule, on_trace_ready=ready, **profiler_kwargs) as prof,
    ):
        # torch notes that each cycle's trace holds only that cycle's events: what we want here
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle")
        for x, y in data:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    return paths


DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def plugin_profile(path: str, tmp_path):
    from torch_tb_profiler.profiler.data import RunProfileData

    return RunProfileData.parse("worker", None, path, str(tmp_path))


def assert_valid_speedscope(doc: dict) -> int:
    """Check a Speedscope document against the file format; returns the number of opened events."""
    assert doc["$schema"] == SPEEDSCOPE_SCHEMA
    frames = doc["shared"]["frames"]
    assert all(isinstance(f["name"], str) for f in frames)
    assert doc["profiles"]
    opened = 0
    for profile in doc["profiles"]:
        assert profile["type"] == "evented" and profile["unit"] == "microseconds"
        assert isinstance(profile["name"], str)
        stack: list[int] = []
        last = profile["startValue"]
        for event in profile["events"]:
            assert event["type"] in ("O", "C")
            assert 0 <= event["frame"] < len(frames)
            assert event["at"] >= last, "times must not go back"
            last = event["at"]
            if event["type"] == "O":
                stack.append(event["frame"])
                opened += 1
            else:
                assert stack and stack.pop() == event["frame"], "close must match the innermost open frame"
        assert not stack, "every opened frame is closed"
        assert last <= profile["endValue"]
    return opened


def lightning_before(major: int, minor: int) -> bool:
    """Whether the installed Lightning is older than ``major.minor`` (the suite runs on several)."""
    return tuple(int(part) for part in L.__version__.split(".")[:2]) < (major, minor)


def window_points(events, tag: str) -> list:
    """The points of ``tag`` the logging windows wrote during the fit, read with an EventAccumulator: the
    end-of-fit step series (output.windows.write_step_series) follows them, starting again from an early step."""
    points = events.Scalars(tag)
    for i in range(1, len(points)):
        if points[i].step <= points[i - 1].step:
            return points[:i]
    return points
