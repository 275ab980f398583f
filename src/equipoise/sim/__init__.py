"""`equipoise simulate`: the job's own policies on a virtual clock, at any scale.

    import equipoise
    summary = equipoise.simulate({"protocol": "lbbsp", "workers": 1000, "worker_batch": 32})

engine.py simulates; cost.py holds the cost model and its calibration from a real run;
run.py makes the run directory. docs/simulate.md describes all three.
"""

from .cost import CostModel, calibrate
from .run import simulate

__all__ = ["CostModel", "calibrate", "simulate"]
