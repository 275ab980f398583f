"""A job of equipoise's built-in models as one plain PyTorch process: what a user would
write without a framework, for bench_startup to compare time to result and samples/s.

The default job's settings (``config.DEFAULT_JOB``, as ``equipoise train`` with no
config), the same model (built from equipoise's registry after
``torch.manual_seed(seed)``), the same dataset and sample order (``SliceSampler``),
torch's own SGD on the whole batch's mean loss, ``threads`` intra-op threads, and an evaluation over the whole evaluation set
every ``eval_every`` iterations and after the last, as a job's are. It prints one JSON
line: ``train_s`` (the steps), ``eval_s`` (the evaluations), the samples/s after
``warmup`` iterations and the final metrics. The caller times the command: its start-up is
the rest.

    python -m benchmarks.plain_loop --batch 128 --threads 2 [--iterations N] [--eval-every 100]
"""

from __future__ import annotations

import argparse
import json
import time


def run(batch: int, threads: int, iterations: int, eval_every: int, warmup: int, seed: int,
        **config) -> dict:
    """The loop; its figures, and the trained model under ``"model"``. `config`: other
    config keys (the dataset, the model)."""
    import torch

    from equipoise.config import DEFAULT_JOB, Config
    from equipoise.data import SliceSampler
    from equipoise.models import build_model
    from equipoise.workload import as_workload

    torch.set_num_threads(threads)
    cfg = Config.from_dict({**DEFAULT_JOB, **config, "global_batch": batch, "seed": seed})  # as `equipoise train`
    data = as_workload(cfg)
    total = iterations or cfg.total_iterations(len(data))
    torch.manual_seed(seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.model_args)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    sampler = SliceSampler(len(data), batch, seed)
    train_s = eval_s = 0.0
    steady_from = None
    evaluations = 0
    for t in range(total):
        t0 = time.perf_counter()
        b = data.fetch(data.train, sampler.batch(t))
        opt.zero_grad(set_to_none=True)
        data.loss_of(model, b, batch).objective.backward()
        opt.step()
        t1 = time.perf_counter()
        train_s += t1 - t0
        if t + 1 == warmup:
            steady_from = (t1, train_s)
        if eval_every and (t + 1) % eval_every == 0 and t + 1 < total:
            data.evaluate(model, batch_size=cfg.eval_batch)
            model.train()
            evaluations += 1
            eval_s += time.perf_counter() - t1
    t1 = time.perf_counter()
    final = data.evaluate(model, batch_size=cfg.eval_batch)
    eval_s += time.perf_counter() - t1
    steady = (total - warmup) * batch / (train_s - steady_from[1]) if steady_from and total > warmup else None
    return {"iterations": total, "batch": batch, "threads": threads, "train_s": train_s, "eval_s": eval_s, "evaluations": evaluations + 1,
            "steady_samples_per_s": steady, "final_metrics": final, "model": model}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=0, help="0: one epoch")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    result = run(a.batch, a.threads, a.iterations, a.eval_every, a.warmup, a.seed)
    del result["model"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
