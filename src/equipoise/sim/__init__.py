"""`equipoise simulate`: the job's own policies on a virtual clock, at any scale.

    import equipoise
    summary = equipoise.simulate({"protocol": "lbbsp", "workers": 1000, "worker_batch": 32})

engine.py simulates; cost.py holds the cost model, calibrate.py fits it to a real run;
run.py makes the run directory. docs/simulate.md describes all three.
"""

from .calibrate import calibrate
from .cost import CostModel
from .run import simulate

__all__ = ["CostModel", "calibrate", "simulate"]
