"""`tensorboard = true`: the job's scalars written to RUN_DIR/tensorboard/ as it runs.

Fed the metrics records as the coordinator writes them (see `MetricsWriter`'s taps) and
written with PyTorch's `SummaryWriter` (needs the `tensorboard` package:
``pip install 'equipoise[tensorboard]'``). Steps are iterations; wall times are the
records' times. Tags:

* iteration records: ``train/loss``, ``train/samples_per_s``, ``train/staleness_mean``
  (when any σ arrived), and per worker ``worker<r>/batch``, ``worker<r>/compute_s``,
  ``worker<r>/data_s``, ``worker<r>/wait_s``, ``worker<r>/staleness``;
* eval records: ``test/<name>`` for every metric (``test/accuracy``, ``test/loss`` by
  default, the user's own names with ``metrics``);
* servers records: per server ``server<s>/busy_share``, ``server<s>/load_mb``,
  ``server<s>/link_mbps``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

FLUSH_S = 2  # seconds between flushes of the event file


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def scalars(rec: dict) -> list[tuple[str, float]]:
    """The (tag, value) pairs a metrics record gives."""
    kind, out = rec.get("type"), []
    if kind == "iteration":
        out += [("train/loss", rec.get("loss")), ("train/samples_per_s", rec.get("samples_per_s")),
                ("train/staleness_mean", rec.get("staleness_mean"))]
        for key, name in (("batch", "batch"), ("compute_s", "compute_s"), ("data_s", "data_s"),
                          ("wait_s", "wait_s"),
                          ("staleness", "staleness")):
            out += [(f"worker{w}/{name}", v) for w, v in zip(rec.get("workers") or (), rec.get(key) or ())]
    elif kind == "eval":
        out += [(f"test/{k[len('test_'):]}", v) for k, v in rec.items()
                if k.startswith("test_") and k != "test_samples"]
    elif kind == "servers":
        ranks = rec.get("servers") or ()
        out += [(f"server{s}/busy_share", v) for s, v in zip(ranks, rec.get("busy_share") or ())]
        out += [(f"server{s}/load_mb", v / 1e6) for s, v in zip(ranks, rec.get("load_bytes") or ()) if _scalar(v)]
        out += [(f"server{s}/link_mbps", v) for s, v in zip(ranks, rec.get("throughput_mbps") or ())]
    return [(tag, float(v)) for tag, v in out if _scalar(v)]


class TensorBoardLog:
    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(log_dir=str(folder), flush_secs=FLUSH_S)

    def record(self, rec: dict) -> None:
        step, walltime = rec.get("iteration"), rec.get("time")
        for tag, value in scalars(rec):
            self.writer.add_scalar(tag, value, global_step=step, walltime=walltime)

    def close(self) -> None:
        self.writer.close()
