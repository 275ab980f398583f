"""Push+pull through a real equipoise server vs a raw pyzmq echo, side by side.

For each payload (float32 tensors of 1M and 10M elements, i.e. 4 MB and 40 MB):

* raw: a ZeroMQ ROUTER echo server in its own process; a DEALER client sends the bytes
  (zero-copy) and receives the echo. One round trip moves the payload there and back.
* equipoise: a real `equipoise.server.core.Server` in its own process, initialised by
  this process (playing the coordinator) with one block of that size under ASP; the
  client does what a worker does each iteration: push a gradient and wait for the ack,
  then pull and receive the parameters. That also moves the payload there and back.
* streamed: the same bytes in `parts` blocks, sent as a worker with backward_push,
  forward_pull and eager_update sends them (BSP, one worker): the next version's pull,
  each block's gradient but the last as a fragment, the push with the last; the server
  updates each block as its gradient comes and sends it down at once. What each extra
  part costs shows against the one-block path (a worker streams to overlap its backward
  and forward, which this exchange alone cannot show); its own baseline is the raw echo
  of the same bytes in as many messages sent back to back ("raw streamed").

Repetitions are interleaved (raw, equipoise, raw, equipoise, ...) after a warm-up; the
report is the median (min–max) of each, the ratio equipoise/raw of the medians (target
≤ 1.3), and the median (min–max) of the ratios of each round's back-to-back pair.
When equipoise is over target (or with --profile), the report shows where the time
goes: the steps of a real server process, timed by wrapping its methods inside that
process (no file is changed), and the same steps in this process next to baselines (a
copy into fresh vs reused memory) and cheaper alternatives.

With ``--auth`` it measures instead what authentication costs (config key ``auth``,
wire/auth.py): the same push+pull against three real servers, with auth "off", "curve"
and "plain", repetitions interleaved (off, curve, plain, off, ...), written to
benchmarks/results/bench_wire_auth.json.

Run from the repository root::

    python -m benchmarks.bench_wire --preset ci
    python -m benchmarks.bench_wire --preset full
    python -m benchmarks.bench_wire --preset full --auth
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    fmt_range,
    git_state,
    interleave,
    load_average,
    markdown_table,
    median,
    ratio,
    summary,
    write_results,
)
from benchmarks.harness import EquipoiseClient, RawEcho
from benchmarks.wire_profile import profile_server, profile_server_process, small_round_trip_ms

NAME = "bench_wire"
AUTH_MODES = ("off", "curve", "plain")
TARGET_RATIO = 1.3
MB = 1_000_000
DEFAULT_NUMELS = (1_000_000, 10_000_000)  # float32: 4 MB and 40 MB


@dataclass(frozen=True)
class WirePreset:
    numels: tuple[int, ...]
    reps: int
    warmup: int
    profile_reps: int
    parts: int = 4  # the streamed system's blocks


PRESETS: dict[str, WirePreset] = {
    "ci": WirePreset(DEFAULT_NUMELS, reps=5, warmup=2, profile_reps=5),
    "full": WirePreset(DEFAULT_NUMELS, reps=100, warmup=3, profile_reps=20),
}


@dataclass
class WireResult:
    """The timings of one payload size, in milliseconds per push+pull (or round trip)."""

    numel: int
    nbytes: int
    raw_ms: list[float] = field(default_factory=list)
    equipoise_ms: list[float] = field(default_factory=list)
    push_ms: list[float] = field(default_factory=list)   # push + ack
    pull_ms: list[float] = field(default_factory=list)   # pull + params
    parts: int = 0  # the streamed system's blocks (0: not run)
    streamed_ms: list[float] = field(default_factory=list)
    raw_streamed_ms: list[float] = field(default_factory=list)  # the raw echo in as many messages

    @property
    def raw_median(self) -> float:
        return median(self.raw_ms)

    @property
    def equipoise_median(self) -> float:
        return median(self.equipoise_ms)

    @property
    def ratio(self) -> float:
        return ratio(self.equipoise_median, self.raw_median)

    @property
    def round_ratios(self) -> list[float]:
        """equipoise/raw of each round (the two ran back to back)."""
        return [ratio(e, r) for e, r in zip(self.equipoise_ms, self.raw_ms)]

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "raw_median_ms": self.raw_median,
                "equipoise_median_ms": self.equipoise_median,
                "push_median_ms": median(self.push_ms), "pull_median_ms": median(self.pull_ms),
                "raw": summary(self.raw_ms), "equipoise": summary(self.equipoise_ms),
                "round_ratio": summary(self.round_ratios),
                **({"streamed": summary(self.streamed_ms), "raw_streamed": summary(self.raw_streamed_ms),
                    "streamed_ratio": ratio(median(self.streamed_ms), self.raw_median),
                    "streamed_to_raw_streamed": ratio(median(self.streamed_ms), median(self.raw_streamed_ms)),
                    "streamed_round_ratio": summary([ratio(e, r) for e, r in
                                                     zip(self.streamed_ms, self.raw_streamed_ms)])}
                   if self.streamed_ms else {}),
                "ratio": self.ratio, "target": TARGET_RATIO,
                "meets_target": bool(self.ratio <= TARGET_RATIO)}


# -- the measurement -------------------------------------------------------------------------

def measure_wire(numels: Sequence[int] = DEFAULT_NUMELS, reps: int = 5, warmup: int = 2,
                 parts: int = 0) -> list[WireResult]:
    """Interleaved raw / equipoise (/ streamed in `parts` blocks, if > 1) repetitions for
    each payload size (float32 elements)."""
    results = []
    for numel in numels:
        grad = torch.randn(numel) * 1e-3
        payload = memoryview(grad.numpy()).cast("B")
        result = WireResult(numel, payload.nbytes, parts=parts if parts > 1 else 0)
        clients: list[EquipoiseClient] = []
        raw = RawEcho()
        try:
            eq = EquipoiseClient(numel)
            clients.append(eq)
            systems: dict[str, Any] = {
                "raw": lambda: raw.round_trip(payload) * 1e3,
                "equipoise": lambda: tuple(x * 1e3 for x in eq.push_pull(grad))}
            if parts > 1:
                streamed = EquipoiseClient(numel, parts=parts)
                clients.append(streamed)
                systems["raw streamed"] = lambda: raw.round_trip_parts(payload, parts) * 1e3
                systems["streamed"] = lambda: sum(streamed.push_pull_streamed(grad)) * 1e3
            runs: dict[str, list[Any]] = interleave(systems, reps, warmup=warmup)
        finally:
            for c in clients:
                c.close()
            raw.close()
        result.raw_ms = runs["raw"]
        result.streamed_ms = runs.get("streamed", [])
        result.raw_streamed_ms = runs.get("raw streamed", [])
        result.push_ms = [push for push, _ in runs["equipoise"]]
        result.pull_ms = [pull for _, pull in runs["equipoise"]]
        result.equipoise_ms = [push + pull for push, pull in runs["equipoise"]]
        results.append(result)
    return results


def measure_auth(numels: Sequence[int] = DEFAULT_NUMELS, reps: int = 5, warmup: int = 2,
                 modes: Sequence[str] = AUTH_MODES) -> list[dict[str, Any]]:
    """Push+pull milliseconds per auth mode for each payload size, one server per mode,
    repetitions interleaved across the modes."""
    out = []
    for numel in numels:
        grad = torch.randn(numel) * 1e-3
        clients: dict[str, EquipoiseClient] = {}
        try:
            for mode in modes:
                clients[mode] = EquipoiseClient(numel, auth=mode)
            runs = interleave({m: (lambda c=c: sum(c.push_pull(grad)) * 1e3) for m, c in clients.items()},
                              reps, warmup=warmup)
        finally:
            for c in clients.values():
                c.close()
        base = median(runs[modes[0]])
        out.append({"numel": numel, "nbytes": numel * 4, "ms": runs,
                    "median_ms": {m: median(v) for m, v in runs.items()},
                    "min_ms": {m: min(v) for m, v in runs.items()},
                    "max_ms": {m: max(v) for m, v in runs.items()},
                    f"ratio_to_{modes[0]}": {m: ratio(median(v), base) for m, v in runs.items()}})
    return out


def auth_table(results: Sequence[dict[str, Any]]) -> str:
    modes = list(results[0]["median_ms"])
    rows = [[f"{r['nbytes'] / MB:g} MB", len(r["ms"][modes[0]]),
             *(f"{r['median_ms'][m]:.1f} ({r['min_ms'][m]:.1f}–{r['max_ms'][m]:.1f})" for m in modes),
             *(r[f"ratio_to_{modes[0]}"][m] for m in modes[1:])] for r in results]
    return markdown_table(["payload", "reps", *(f"{m} ms median (min–max)" for m in modes),
                           *(f"{m}/{modes[0]}" for m in modes[1:])], rows)


def run_auth(preset: str, results_path: str | Path | None = None) -> dict[str, Any]:
    """The auth comparison with a preset's sizes and repetitions; prints and writes it."""
    p = PRESETS[preset]
    load_at_start, git_at_start = load_average(), git_state()
    results = measure_auth(p.numels, reps=p.reps, warmup=p.warmup)
    print(f"## push+pull by auth mode (preset {preset}, {p.reps} interleaved reps)\n")
    print(auth_table(results))
    payload = {"preset": preset, "modes": list(AUTH_MODES), "loadavg_at_start": load_at_start,
               "loadavg_at_end": load_average(), "git_at_start": git_at_start, "results": results}
    path = write_results(f"{NAME}_auth", payload, results_path)
    print(f"\nwrote {path}")
    return payload


# -- report ----------------------------------------------------------------------------------

def results_table(results: Sequence[WireResult]) -> str:
    rows = [[f"{r.nbytes / MB:g} MB", len(r.raw_ms), fmt_range(summary(r.raw_ms)),
             fmt_range(summary(r.equipoise_ms)), median(r.push_ms), median(r.pull_ms), r.ratio,
             fmt_range(summary(r.round_ratios)), "yes" if r.ratio <= TARGET_RATIO else "NO"]
            + ([fmt_range(summary(r.raw_streamed_ms)), fmt_range(summary(r.streamed_ms)),
                ratio(median(r.streamed_ms), r.raw_median),
                ratio(median(r.streamed_ms), median(r.raw_streamed_ms))] if r.streamed_ms else [])
            for r in results]
    parts = max((r.parts for r in results), default=0)
    streamed = [f"raw in {parts} messages ms", f"equipoise streamed in {parts} blocks ms", "streamed / raw",
                "streamed / raw in as many"] if parts else []
    return markdown_table(["payload", "reps", "raw ms median (min–max)", "equipoise ms median (min–max)",
                           "eq to ack ms", "eq then to params ms", "ratio of medians",
                           "ratio per round median (min–max)", f"≤ {TARGET_RATIO}?", *streamed], rows)


def profile_table(profiles: dict[int, dict[str, float]]) -> str:
    numels = sorted(profiles)
    names = list(dict.fromkeys(k for n in numels for k in profiles[n]))
    rows = [[name, *(profiles[n].get(name) for n in numels)] for name in names]
    return markdown_table(["step (median ms)", *(f"{n * 4 / MB:g} MB" for n in numels)], rows)


def run(preset: str, *, profile: bool | None = None, results_path: str | Path | None = None,
        numels: Sequence[int] | None = None) -> dict[str, Any]:
    """Run the benchmark with a preset, print the Markdown tables, write the JSON."""
    p = PRESETS[preset]
    sizes = tuple(numels) if numels else p.numels
    load_at_start, git_at_start = load_average(), git_state()
    results = measure_wire(sizes, reps=p.reps, warmup=p.warmup, parts=p.parts)
    print(f"## push+pull: equipoise server vs raw pyzmq echo (preset {preset}, "
          f"medians of {p.reps} interleaved reps)\n")
    print(results_table(results))
    over = any(not r.ratio <= TARGET_RATIO for r in results)
    payload: dict[str, Any] = {"preset": preset, "target_ratio": TARGET_RATIO,
                               "loadavg_at_start": load_at_start, "loadavg_at_end": load_average(),
                               "git_at_start": git_at_start, "results": [r.summary() for r in results]}
    if profile or (profile is None and over):
        real = {n: profile_server_process(n, p.profile_reps) for n in sizes}
        local = {n: profile_server(n, p.profile_reps) for n in sizes}
        small = small_round_trip_ms()
        print(f"\n## where equipoise spends the time: a real server process, instrumented "
              f"(medians of {p.profile_reps} push+pulls)\n")
        print(profile_table(real))
        print(f"\n## the same steps in this process, with baselines and alternatives "
              f"(1 torch thread, medians of {p.profile_reps})\n")
        print(profile_table(local))
        print(f"\nraw 8-byte ZeroMQ round trip (floor of one extra request/reply): {small:.3f} ms")
        if p.parts > 1:
            streamed = {n: profile_server_process(n, p.profile_reps, parts=p.parts) for n in sizes}
            print(f"\n## the same, streamed in {p.parts} blocks (eager_update; per-fragment steps: "
                  f"medians over every fragment)\n")
            print(profile_table(streamed))
            payload["profile_streamed_server_process_ms"] = {str(n): v for n, v in streamed.items()}
        payload["profile_server_process_ms"] = {str(n): v for n, v in real.items()}
        payload["profile_in_process_ms"] = {str(n): v for n, v in local.items()}
        payload["small_round_trip_ms"] = small
    path = write_results(NAME, payload, results_path)
    print(f"\nwrote {path}")
    return payload


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="ci")
    parser.add_argument("--profile", action="store_true", default=None,
                        help="always profile the server side (default: only when over target)")
    parser.add_argument("--auth", action="store_true",
                        help="compare the auth modes instead (off, curve, plain)")
    parser.add_argument("--results", default=None, help=f"JSON path (default benchmarks/results/{NAME}.json, "
                        f"or {NAME}_auth.json with --auth)")
    args = parser.parse_args()
    if args.auth:
        run_auth(args.preset, results_path=args.results)
    else:
        run(args.preset, profile=args.profile, results_path=args.results)
