"""`equipoise` command line: thin, it parses arguments and calls the API.

Exit status: 0 success; 2 a user mistake (bad config, missing or corrupt data, bad
checkpoint), printed as one line; 1 the job failed (a process died, a peer timed out);
130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from .config import ConfigError, parse_override


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="equipoise", description="Parameter-server training for PyTorch "
                                "on unequal and shared clusters.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run a training job on this machine")
    t.add_argument("config", nargs="?", help="TOML file of config keys (docs/configuration.md)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key; may be repeated")
    t.add_argument("--out", help="run directory to write (default runs/<time>-<protocol>)")
    t.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its checkpoint")
    t.add_argument("--quiet", action="store_true", help="no progress bar or summary table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from . import api
    from .data import DataError
    from .models import ModelError
    from .runtime.checkpoint import CheckpointError
    from .runtime.coordinator import JobError

    try:
        overrides = dict(parse_override(item) for item in args.overrides)
        if args.quiet:
            overrides["progress"] = False
        if args.resume:
            summary = api.train(args.config, resume=args.resume, **overrides)
        else:
            summary = api.train(args.config, out=args.out, **overrides)
    except (ConfigError, DataError, ModelError, CheckpointError) as exc:
        print(f"equipoise: error: {exc}", file=sys.stderr)
        return 2
    except JobError as exc:
        print(f"equipoise: job failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("equipoise: interrupted; all processes stopped (the last checkpoint is kept)", file=sys.stderr)
        return 130
    if not args.quiet:
        from .telemetry.progress import print_summary
        print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
