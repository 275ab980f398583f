"""The body of every server and worker actor of the Ray launcher (ray_cluster.py): where
it runs, the dataset it shares on its node, its main, and its log."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

from ..config import Config

SLOWDOWN_LABEL = "equipoise-slowdown"  # a node label: every worker placed there is stretched by it
TAIL_BYTES = 1 << 20  # most log bytes handed to the driver per call


def log_path(pid: int, name: str) -> Path:
    """Where the actor of process `pid` running `name` writes its log, on its node."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"equipoise-{pid}-{name}.log"


class _Role:
    """The body of every server and worker actor (`ray.remote` is applied in `actor_class`)."""

    def __init__(self, name: str):
        import ray

        self.name = name
        ctx = ray.get_runtime_context()
        labels = ctx.get_node_labels() or {}
        try:
            self.factor = max(1.0, float(labels.get(SLOWDOWN_LABEL, 1.0)))
        except ValueError:
            self.factor = 1.0
        self.where = {"node": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                      "hostname": socket.gethostname(), "pid": os.getpid(), "slowdown": self.factor,
                      "warm": "torch" in sys.modules}
        self._log_to(name)

    def _log_to(self, name: str) -> None:
        self.name = name
        self.log_path = log_path(os.getpid(), name)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)  # everything the role prints, Python or C, lands in its log
        os.dup2(fd, 2)
        os.close(fd)
        logging.basicConfig(level=logging.INFO, force=True,
                            format=f"%(asctime)s {name} %(levelname)s %(message)s")

    def locate(self) -> dict:
        return self.where

    def warm(self) -> dict:
        """A standby's start (launch/ray_standby.py): import what a role needs, so that a
        role handed to this process later starts without paying it."""
        from .warm import preload

        preload()
        self.where["warm"] = True
        return self.where

    def adopt(self, name: str) -> dict:
        """This standby becomes role `name`: its log is named for it from now on."""
        old = self.log_path
        self._log_to(name)
        old.unlink(missing_ok=True)
        return self.where

    def check_specs(self, specs: dict) -> str | None:
        """Import each of the user's specs (config key -> spec) here, where the role will
        run: None, or the one-line error of the first that fails."""
        from ..spec import first_failure

        error = first_failure(specs)
        return None if error is None else f"{error} (imported in the Ray actor {self.name} on {self.where['hostname']})"

    def share(self, cfg: dict) -> list:
        """Load the dataset from this node's disk into this node's object store; the
        reference is wrapped in a list so that Ray hands it over unresolved."""
        import ray

        from ..data import load_dataset

        c = Config.from_dict(cfg)
        return [ray.put(load_dataset(c.dataset, c.data_dir or None, seed=c.seed).to_arrays())]

    def run(self, role: str, rank: int, coordinator: str, job: dict, data: dict | None,
            adopted: dict | None = None) -> str | None:
        """The role's main; None when it ended well, else its one-line error. `adopted`
        (a standby's: what `adopt` returned, which Ray resolves first) orders the two
        on this threaded actor: the role starts once its log is its own."""
        from ..data import Dataset
        from .proc import host

        try:
            dataset = Dataset.from_arrays(data) if data is not None else None
            host(role, rank, coordinator, job, data=dataset, address=self.where["ip"],
                 machine_factor=self.factor if role == "worker" else 1.0)
        except Exception as exc:
            line = f"error: {role} {rank}: {type(exc).__name__}: {exc}"
            logging.getLogger("equipoise").debug("failure", exc_info=True)
            print(line, flush=True)
            return line
        return None

    def tail(self, offset: int, name: str | None = None) -> bytes:
        if name is not None and name != self.name:  # a standby not yet adopted: no line of the role's
            return b""
        with self.log_path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(TAIL_BYTES)

    def discard(self) -> None:
        """The driver has the whole log: remove it from this node."""
        self.log_path.unlink(missing_ok=True)


_ACTOR = None


def actor_class():
    global _ACTOR
    if _ACTOR is None:  # `run` and `tail` at once: a threaded actor
        import ray

        _ACTOR = ray.remote(max_concurrency=2, max_restarts=0)(_Role)
    return _ACTOR


def actor_options(resources: dict) -> dict:
    """Ray's actor options for a table of resources (CPU, GPU, memory, custom)."""
    r = {k: v for k, v in resources.items() if v > 0}
    opts = {"num_cpus": r.pop("CPU", 0), "num_gpus": r.pop("GPU", 0), "resources": r}
    if "memory" in r:
        opts["memory"] = r.pop("memory")
    return opts
