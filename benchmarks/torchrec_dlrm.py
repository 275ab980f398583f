"""The DLRM-style job of examples/workloads/dlrm.py under TorchRec, for bench_sparse's
``torchrec`` preset: run by a Python that has TorchRec (a venv of its own, with the torch
its fbgemm-gpu-cpu was built for), never by equipoise's.

The same model (bottom MLP 13-64-dim, one sum-pooled bag of one id per table, the
pairwise dots of the bottom output and the bags, top MLP to one logit), the same data
(``Clicks`` of dlrm.py, imported by path), the same global batch split evenly over
``--world`` processes (gloo, CPU), Adagrad on both parts at the same rate. TorchRec shards
the tables with its planner (``EmbeddingShardingPlanner`` on a CPU topology) inside
``DistributedModelParallel``, steps them with the optimizer fused into its backward
(fbgemm's table-batched embedding kernel), and keeps the dense part data-parallel
(DDP: an all-reduce of its gradients in the backward). Rank 0 writes a JSON object to
``--out``: each iteration's end time, and the mean seconds of each phase (the batch
drawn, forward with the ids' all-to-all, backward with the fused table step and the
dense all-reduce, the dense optimizer's step).

    /path/to/torchrec-venv/bin/python benchmarks/torchrec_dlrm.py --out result.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "workloads" / "dlrm.py"


def _example():
    spec = importlib.util.spec_from_file_location("dlrm_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class TorchRecDLRM(nn.Module):
    """dlrm.py's DLRM with its bags as one TorchRec EmbeddingBagCollection."""

    def __init__(self, ex, rows: int, tables: int, dim: int):
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

        super().__init__()
        self.tables = tables
        self.bottom = ex._mlp([ex.DENSE, 64, dim], last_plain=False)
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=f"t{t}", embedding_dim=dim, num_embeddings=rows,
                                       feature_names=[f"f{t}"], pooling=PoolingType.SUM) for t in range(tables)],
            device=torch.device("meta"))
        n = tables + 1
        self.register_buffer("pairs", torch.triu_indices(n, n, offset=1), persistent=False)
        self.top = ex._mlp([dim + n * (n - 1) // 2, 64, 1], last_plain=True)

    def forward(self, dense: torch.Tensor, kjt) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = self.ebc(kjt).to_dict()
        z = torch.stack([x] + [pooled[f"f{t}"] for t in range(self.tables)], 1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], 1)).squeeze(1)


def _run(rank: int, args: argparse.Namespace, port: int) -> None:
    from torchrec import KeyedJaggedTensor
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    import datetime

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=args.timeout))
    torch.manual_seed(args.seed)
    ex = _example()
    data = ex.Clicks(ex.TRAIN, 0, args.rows, args.tables, args.seed)
    model = TorchRecDLRM(ex, args.rows, args.tables, args.dim)
    apply_optimizer_in_backward(torch.optim.Adagrad, model.ebc.parameters(), {"lr": args.lr})
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=args.world, compute_device="cpu"))
    plan = planner.collective_plan(model, pg=dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"), plan=plan,
                                   env=ShardingEnv.from_process_group(dist.GroupMember.WORLD))
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda params: torch.optim.Adagrad(params, lr=args.lr))
    local = args.global_batch // args.world
    keys = [f"f{t}" for t in range(args.tables)]
    phases = {"batch": 0.0, "forward": 0.0, "backward": 0.0, "dense_step": 0.0}
    ends, losses = [], []
    dist.barrier()
    start = time.perf_counter()
    cpu0 = time.process_time()
    for it in range(args.iterations):
        t0 = time.perf_counter()
        if it == args.warmup:  # this process's CPU seconds (its threads too) over the steady window
            cpu0 = time.process_time()
        first = (it * args.global_batch + rank * local) % ex.TRAIN
        dense, ids, click = data.get_batch(torch.arange(first, first + local))
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=ids.t().reshape(-1),
                                                  lengths=torch.ones(args.tables * local, dtype=torch.int32))
        t1 = time.perf_counter()
        loss = nn.functional.binary_cross_entropy_with_logits(dmp(dense, kjt), click)
        t2 = time.perf_counter()
        dense_opt.zero_grad()
        loss.backward()
        t3 = time.perf_counter()
        dense_opt.step()
        t4 = time.perf_counter()
        if it >= args.warmup:
            for k, a, b in (("batch", t0, t1), ("forward", t1, t2), ("backward", t2, t3), ("dense_step", t3, t4)):
                phases[k] += b - a
        ends.append(t4 - start)
        losses.append(float(loss.detach()))
    cpu = torch.tensor([time.process_time() - cpu0], dtype=torch.float64)
    dist.all_reduce(cpu)  # the processes' sum
    dist.barrier()
    if rank == 0:
        n = max(1, args.iterations - args.warmup)
        sharding = {name: str(p.sharding_type) for mod in plan.plan.values() for name, p in mod.items()}
        Path(args.out).write_text(json.dumps({
            "ends_s": ends, "phases_s": {k: v / n for k, v in phases.items()}, "sharding": sharding,
            "cpu_ms_per_iteration": 1e3 * float(cpu) / n,
            "final_train_loss": sum(losses[-10:]) / len(losses[-10:]),
            "torch": torch.__version__, "torchrec": __import__("torchrec").__version__,
            "fbgemm_gpu": __import__("fbgemm_gpu").__version__}))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--iterations", type=int, default=90)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with socket.socket() as s:  # a free port for the rendezvous (loopback only)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_run, args=(args, port), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
