"""`equipoise` command line: thin, it parses arguments and calls the API.

Exit status: 0 success; 2 a user mistake (bad config, missing or corrupt data, bad
checkpoint, an address or cgroup that cannot be set up), printed as one line; 1 the job
failed (a process died, a peer timed out); 130 interrupted (Ctrl-C); 143 terminated.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings

from .config import ConfigError, parse_override


class _Terminated(Exception):
    """SIGTERM, turned into an exception so the launcher's clean-up runs."""


def _terminated(signum, frame) -> None:
    raise _Terminated()


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
    from .workload import StepError
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
    from . import api
    from .data import DataError
    from .workload import StepError
    from .models import ModelError
    from .runtime.checkpoint import CheckpointError
    from .runtime.rpc import JobError
    from .runtime.launch.cgroup import CgroupError

    # Like `python -m`: modules in the current folder can be named as models, and the
    # server and worker processes (started with -m) see the same folder first.
    sys.path.insert(0, os.getcwd())
    signal.signal(signal.SIGTERM, _terminated)
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
            summary = api.train(args.config, resume=args.resume, **overrides)
        else:
            summary = api.train(args.config, out=args.out, **overrides)
    except (ConfigError, DataError, ModelError, StepError, CheckpointError, CgroupError, OSError) as exc:
        print(f"equipoise: error: {exc}", file=sys.stderr)
        return 2
    except JobError as exc:
        print(f"equipoise: job failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("equipoise: interrupted; all processes stopped (the last checkpoint is kept)", file=sys.stderr)
        return 130
    except _Terminated:
        print("equipoise: terminated; all processes stopped (the last checkpoint is kept)", file=sys.stderr)
        return 143
    if not args.quiet:
        from .telemetry.progress import print_summary
        print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
