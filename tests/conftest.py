"""What every test shares. Tests that run real jobs or start processes carry the `slow`
marker themselves (each integration file's `pytestmark`, the few unit tests that do),
so `pytest -m "not slow"` is the fast subset."""

import os
import subprocess
from pathlib import Path

import pytest

# What a test might leave behind that later runs would trip over: Ray's pointer to "the
# current cluster" (a later ray.init() without an address joins whatever it names), the
# token a local Ray instance writes (the testbed's `ray start` nodes then refuse it) and
# the testbed's network namespaces. Recorded at the start; anything new at the end fails
# the session, named.
_RAY_STATE = Path("/tmp/ray/ray_current_cluster")


def _leftovers() -> dict[str, object]:
    try:
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        netns = ""
    token = Path.home() / ".ray" / "auth_token"  # a local instance writes it: the user's machine changed
    return {"ray state file": _RAY_STATE.read_text() if _RAY_STATE.exists() else None,
            "ray auth token": str(token) if token.exists() else None,
            "testbed namespaces": sorted(line.split()[0] for line in netns.splitlines()
                                         if line.startswith("eqtb"))}


def pytest_sessionstart(session):
    session.config._leftovers_before = _leftovers()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_leftovers_before", None)
    if before is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    after = _leftovers()
    changed = {k: v for k, v in after.items() if v != before[k] and v not in (None, [])}
    if changed:
        print(f"\nthe suite left behind: {changed}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
