"""`equipoise` command line: thin, it parses arguments and calls the API.

Exit status: 0 success; 2 a user mistake (bad config, missing or corrupt data, bad
checkpoint, an address or cgroup that cannot be set up), printed as one line; 1 the job
failed (a process died, a peer timed out); 130 interrupted (Ctrl-C); 143 terminated.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from . import interrupt
from .config import ConfigError, parse_override


def _job_arguments(p: argparse.ArgumentParser, config_help: str, default_out: str) -> None:
    """What `train` and `simulate` both take: a config file, --set overrides, --out."""
    p.add_argument("config", nargs="?", help=config_help)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key; may be repeated")
    p.add_argument("--out", help=f"run directory to write (default {default_out})")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="equipoise", description="Parameter-server training for PyTorch "
                                "on unequal and shared clusters.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run a training job (on this machine, or on a Ray cluster)")
    _job_arguments(t, "TOML file of config keys (docs/configuration.md)", "runs/<time>-<protocol>")
    t.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its checkpoint")
    t.add_argument("--quiet", action="store_true", help="no progress bar or summary table")
    t.add_argument("--launcher", choices=["local", "ray"], help="where servers and workers run "
                   "(config key launcher; default local: processes on this machine)")
    t.add_argument("--ray-address", metavar="ADDR", help="with --launcher ray: \"auto\" or HOST:PORT joins a "
                   "running Ray cluster; empty starts Ray on this machine (config key ray_address)")
    c = sub.add_parser("ctl", help="change the servers of a running job (at its next barrier)")
    c.add_argument("run_dir", help="the run directory of a running job")
    c.add_argument("action", choices=["add-server", "remove-server", "move"])
    c.add_argument("args", nargs="*", type=int, metavar="N",
                   help="remove-server: RANK; move: BLOCK RANK")
    s = sub.add_parser("simulate", help="simulate a job on a virtual clock (any number of machines)")
    _job_arguments(s, "TOML file of config keys, sim_* included (docs/simulate.md)", "runs/<time>-sim-<protocol>")
    s.add_argument("--calibrate", metavar="RUN_DIR", help="fit the sim_* cost model to a real run directory first")
    s.add_argument("--quiet", action="store_true", help="no summary table")
    r = sub.add_parser("report", help="plots and report.html of one or several run directories")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by `equipoise train`")
    r.add_argument("--out", help="folder for report.html and the PNG files (default: RUN_DIR/report for one "
                                 "run, report/ beside the runs for several)")
    tb = sub.add_parser("testbed", help="emulated hosts on this machine: network namespaces with shaped links "
                        "and CPU quotas (root; docs/testbed.md)")
    tb.add_argument("action", choices=["up", "down", "status", "exec"])
    tb.add_argument("--hosts", type=int, default=3, help="up: how many hosts (default 3)")
    tb.add_argument("--rate", type=float, default=0.0, metavar="MBIT",
                    help="up: every host's link rate each way in Mbit/s (0: unshaped)")
    tb.add_argument("--rates", default="", metavar="R,R,...", help="up: one link rate per host instead")
    tb.add_argument("--cpus", default="", metavar="C,C,...", help="up: CPUs per host (a cgroup quota; 0: none)")
    tb.add_argument("--memory", default="", metavar="MIB,MIB,...", help="up: memory limit per host in MiB (0: none)")
    tb.add_argument("--prefix", default="eqtb", help="the names' prefix (default eqtb)")
    tb.add_argument("host", nargs="?", type=int, help="exec: the host's index")
    tb.add_argument("argv", nargs="*", help="exec: the command (after --)")
    w = sub.add_parser("watch", help="the live per-worker and per-server view of a running or finished job")
    w.add_argument("run_dir", help="the run directory of the job")
    w.add_argument("--idle", type=float, default=120.0, metavar="S",
                   help="give up when metrics.jsonl has not grown for S seconds (default 120)")
    return p


def _watch(args: argparse.Namespace) -> int:
    from .telemetry.live import WatchError, watch

    try:
        return watch(args.run_dir, idle=args.idle)
    except WatchError as exc:
        print(f"equipoise: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _report(args: argparse.Namespace) -> int:
    from .report import ReportError, html_report

    try:
        for path in html_report(args.run_dirs, args.out):
            print(path)
    except ReportError as exc:
        print(f"equipoise: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from .data import DataError
    from .models import ModelError
    from .sim import simulate

    try:
        overrides = dict(parse_override(item) for item in args.overrides)
        summary = simulate(args.config, out=args.out, calibrate=args.calibrate, **overrides)
    except (ConfigError, DataError, ModelError, OSError) as exc:
        print(f"equipoise: error: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        from .telemetry.progress import print_summary
        print_summary(summary)
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    from .config import EquipoiseWarning

    if issubclass(category, EquipoiseWarning):
        print(f"equipoise: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _ctl(args: argparse.Namespace) -> int:
    from . import api
    from .config import ConfigError

    want = {"add-server": 0, "remove-server": 1, "move": 2}[args.action]
    if len(args.args) != want:
        print(f"equipoise: error: ctl {args.action} takes {want} number(s), got {len(args.args)}", file=sys.stderr)
        return 2
    fields = ({} if want == 0 else {"server": args.args[0]} if want == 1
              else {"block": args.args[0], "to": args.args[1]})
    try:
        api.control(args.run_dir, args.action.replace("-", "_"), **fields)
    except ConfigError as exc:
        print(f"equipoise: error: {exc}", file=sys.stderr)
        return 2
    print(f"requested {args.action} {' '.join(map(str, args.args))}".rstrip() +
          f"; the outcome will be an event in {args.run_dir}/metrics.jsonl")
    return 0


def _per_host(text: str, n: int, what: str, default: float = 0.0) -> list[float]:
    if not text:
        return [default] * n
    values = [float(x) for x in text.split(",")]
    if len(values) != n:
        raise ValueError(f"--{what} has {len(values)} values for {n} hosts")
    return values


def _testbed(args: argparse.Namespace) -> int:
    import json
    import subprocess

    from .testbed import Host, Testbed, TestbedError, down, status

    try:
        if args.action == "down":
            print("\n".join(down(args.prefix)) or "nothing to remove")
            return 0
        if args.action == "status":
            print(json.dumps(status(args.prefix), indent=2))
            return 0
        if args.action == "exec":
            if args.host is None or not args.argv:
                raise ValueError("exec needs a host index and a command: equipoise testbed exec 1 -- CMD ...")
            tb = Testbed([Host()] * (args.host + 1), prefix=args.prefix)
            if tb.ns(args.host) not in status(args.prefix):
                raise ValueError(f"host {args.host} ({tb.ns(args.host)}) is not up: equipoise testbed up first")
            return subprocess.call(tb.command(args.host, args.argv), preexec_fn=tb._joiner(args.host))
        n = args.hosts
        rates = _per_host(args.rates, n, "rates", args.rate)
        cpus, memory = _per_host(args.cpus, n, "cpus"), _per_host(args.memory, n, "memory")
        tb = Testbed([Host(rate_mbit=r, cpus=c, memory_mib=int(m)) for r, c, m in zip(rates, cpus, memory)],
                     prefix=args.prefix)
        tb.up()
        for i in range(n):
            print(f"{tb.ns(i)}  {tb.address(i)}  rate {rates[i] or 'unshaped'} Mbit/s  cpus {cpus[i] or '-'}  "
                  f"memory {int(memory[i]) or '-'} MiB")
        return 0
    except (TestbedError, ValueError, OSError) as exc:
        print(f"equipoise: error: testbed: {exc}", file=sys.stderr)
        return 2


def _process_started() -> float | None:
    """When this process started (time.time()'s clock), so that a job's startup_s counts
    the interpreter's own start and imports; None where /proc does not say (the API's
    call then counts)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _prestart(args) -> None:
    """Start the job's template (launch/warm.py) from the config as given, if it reads
    without the API (torch-free); anything unusual is left to `train`, which reports it."""
    if args.resume:
        return
    try:
        from .config import Config

        cfg = Config.load(args.config, dict(parse_override(item) for item in args.overrides))
        if (args.launcher or cfg.launcher) == "ray":
            return
    except Exception:  # noqa: BLE001 -- a mistake here is reported by train, with its proper message
        return
    from .launch.warm import prestart

    prestart(cfg.threads, min(cfg.timeout, 120.0))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "report":
        return _report(args)
    if args.command == "ctl":
        return _ctl(args)
    if args.command == "watch":
        return _watch(args)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "testbed":
        return _testbed(args)
    _prestart(args)  # before this process imports torch (below): the two run side by side
    from . import api
    from .data import DataError
    from .workload import StepError
    from .models import ModelError
    from .protocol.checkpoint import CheckpointError
    from .coordinator.rpc import JobError
    from .launch.cgroup import CgroupError

    # Like `python -m`: modules in the current folder can be named as models, and the
    # server and worker processes (started with -m) see the same folder first.
    sys.path.insert(0, os.getcwd())
    interrupt.install()  # Ctrl-C and SIGTERM raise where the coordinator waits
    warnings.showwarning = _show_warning

    try:
        overrides = dict(parse_override(item) for item in args.overrides)
        if args.quiet:
            overrides["progress"] = False
        if args.launcher is not None:
            overrides["launcher"] = args.launcher
        if args.ray_address is not None:
            overrides["ray_address"] = args.ray_address
        if args.resume:
            summary = api.train(args.config, resume=args.resume, started_at=_process_started(), **overrides)
        else:
            summary = api.train(args.config, out=args.out, started_at=_process_started(), **overrides)
    except (ConfigError, DataError, ModelError, StepError, CheckpointError, CgroupError, OSError) as exc:
        print(f"equipoise: error: {exc}", file=sys.stderr)
        return 2
    except JobError as exc:
        print(f"equipoise: job failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("equipoise: interrupted; all processes stopped (the last checkpoint is kept)", file=sys.stderr)
        return 130
    except interrupt.Terminated:
        print("equipoise: terminated; all processes stopped (the last checkpoint is kept)", file=sys.stderr)
        return 143
    finally:
        interrupt.uninstall()  # main() may be called again in this process (tests do)
    if not args.quiet:
        from .telemetry.progress import print_summary
        print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
