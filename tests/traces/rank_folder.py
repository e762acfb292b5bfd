"""A folder of many ranks' traces built from one real trace, one rank made a straggler (tests only).

Every rank gets a copy of the source trace with ``distributedInfo`` rewritten and torch's file name
(``<host>_rank<N>.<ns>.pt.trace.json.gz``). Each profiled step is made ``delay_ms`` longer by moving every later
event: on the slow rank the gap is a DataLoader span at the start of the step (its input is late), on every other
rank it is an NCCL kernel at the same place (they wait in the collective for it), as ranks in lockstep show.
"""

from __future__ import annotations

import bisect
import copy
import gzip
import json
from pathlib import Path
from typing import Any

DATALOADER_SPAN = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _is_step(event: dict[str, Any]) -> bool:
    return event.get("ph") == "X" and str(event.get("name", "")).startswith("ProfilerStep#")


def _stretched(trace: dict[str, Any], delay_us: float, slow: bool, keep_steps: int) -> list[dict[str, Any]]:
    events = trace["traceEvents"]
    steps = sorted((e for e in events if _is_step(e)), key=lambda e: e["ts"])
    cut = steps[keep_steps]["ts"] if keep_steps < len(steps) else float("inf")
    steps = steps[:keep_steps]
    starts = [s["ts"] for s in steps]
    template = next(e for e in events if e.get("cat") == "kernel" and "ncclKernel" in str(e.get("name")))
    out = []
    for event in events:
        ts = event.get("ts")
        if not isinstance(ts, (int, float)) or event.get("ph") == "M":
            out.append(event)
            continue
        if ts >= cut:
            continue
        moved = dict(event)
        if _is_step(event):
            index = starts.index(ts)
            moved["ts"] = ts + index * delay_us
            moved["dur"] = event["dur"] + delay_us
        else:
            moved["ts"] = ts + bisect.bisect_right(starts, ts) * delay_us
        out.append(moved)
    for index, step in enumerate(steps):
        at = step["ts"] + index * delay_us
        if slow:
            out.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": DATALOADER_SPAN,
                    "pid": step["pid"],
                    "tid": step["tid"],
                    "ts": at + 1,
                    "dur": delay_us - 2,
                    "args": {},
                }
            )
        else:
            kernel = copy.deepcopy(template)
            kernel["name"] = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
            kernel["ts"], kernel["dur"] = at + 1, delay_us - 2
            kernel["args"]["correlation"] = kernel["args"]["External id"] = 10**9 + index
            out.append(kernel)
    return out


def build_rank_folder(
    source: Path,
    folder: Path,
    world: int = 16,
    slow_rank: int = 9,
    delay_ms: float = 40.0,
    keep_steps: int = 4,
) -> list[Path]:
    """``world`` traces in ``folder`` from ``source``; rank ``slow_rank``'s DataLoader is ``delay_ms`` late a
    step. ``keep_steps``: the first profiled steps kept (fewer steps read faster)."""
    with gzip.open(source, "rt", encoding="utf-8") as fh:
        trace = json.load(fh)
    folder.mkdir(parents=True, exist_ok=True)
    # the events are serialised once a variant; only the small header differs between ranks
    fast = json.dumps(_stretched(trace, delay_ms * 1000.0, slow=False, keep_steps=keep_steps))
    slow = json.dumps(_stretched(trace, delay_ms * 1000.0, slow=True, keep_steps=keep_steps))
    paths = []
    for rank in range(world):
        header = {k: v for k, v in trace.items() if k != "traceEvents"}
        header["distributedInfo"] = {**trace.get("distributedInfo", {}), "rank": rank, "world_size": world}
        events = slow if rank == slow_rank else fast
        path = folder / f"node{rank // 8}_rank{rank}.1700000000000000000.pt.trace.json.gz"
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as fh:
            fh.write(json.dumps(header)[:-1] + ', "traceEvents": ' + events + "}")
        paths.append(path)
    return paths
