"""What every test shares. Tests that run real jobs or start processes carry the `slow`
marker themselves (each integration file's `pytestmark`, the few unit tests that do),
so `pytest -m "not slow"` is the fast subset."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

# Every temporary file of the session — the tests' own, the jobs' run and socket folders,
# Ray's session folders, the logs a Ray actor killed by a test leaves on its node — goes
# to one folder, removed at the end: TMPDIR is read by the tests' processes, the jobs'
# children, Ray (its temp folder) and the testbed's hosts alike. Set at import, before
# anything asks tempfile for its folder.
# Under pytest-xdist each worker process has its own, beside the controller's (not inside
# it: a nested folder made Ray's socket paths too long).
_BASE_TMP = os.environ.setdefault("EQUIPOISE_TEST_BASE_TMP", tempfile.gettempdir())
_SESSION_TMP = tempfile.mkdtemp(prefix="eqt-", dir=_BASE_TMP)  # short: Ray's socket paths are made in it
os.environ["TMPDIR"] = _SESSION_TMP
tempfile.tempdir = None
os.environ["EQUIPOISE_CACHE"] = os.path.join(_SESSION_TMP, "cache")  # decompressed data sets (data/idx.py)

# What a test might leave behind that later runs would trip over: Ray's pointer to "the
# current cluster" (a later ray.init() without an address joins whatever it names), the
# token a local Ray instance writes (the testbed's `ray start` nodes then refuse it) and
# the testbed's network namespaces. Recorded at the start; anything new at the end fails
# the session, named.
_RAY_STATES = (Path("/tmp/ray/ray_current_cluster"), Path(_SESSION_TMP, "ray", "ray_current_cluster"))
_XDIST_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))


def _leftovers() -> dict[str, object]:
    """Under xdist a worker checks its own Ray state file (in its TMPDIR); the controller
    checks what the machine shares, once both workers are done."""
    if _XDIST_WORKER:
        own = _RAY_STATES[1]
        return {"ray state file": [own.read_text()] if own.exists() else None}
    try:
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        netns = ""
    token = Path.home() / ".ray" / "auth_token"  # a local instance writes it: the user's machine changed
    return {"ray state file": [f.read_text() for f in _RAY_STATES if f.exists()] or None,
            "ray auth token": str(token) if token.exists() else None,
            "testbed namespaces": sorted(line.split()[0] for line in netns.splitlines()
                                         if line.startswith("eqtb"))}


# The suite runs in two processes (pytest-xdist, `-n 2 --dist loadgroup`): a test file's
# tests stay together in one (its module fixtures' jobs are shared), and the files that
# start Ray clusters run one after another in one process.
_ONE_AFTER_ANOTHER = {"test_ray.py": "ray", "test_testbed.py": "ray"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group(_ONE_AFTER_ANOTHER.get(name, str(item.path.relative_to(config.rootpath)))))


_FROM_WORKERS: list[dict] = []  # the controller's: what each xdist worker found left


@pytest.hookimpl(optionalhook=True)  # an xdist hook: none without it
def pytest_testnodedown(node, error):
    left = getattr(node, "workeroutput", {}).get("leftovers")
    if left:
        _FROM_WORKERS.append(left)


def pytest_sessionstart(session):
    session.config._leftovers_before = _leftovers()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_leftovers_before", None)
    after = _leftovers() if before is not None else None
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)
    if after is None:
        return
    changed = {k: v for k, v in after.items() if v != before[k] and v not in (None, [])}
    if _XDIST_WORKER:  # its exit status does not reach the controller: its findings do
        if changed:
            session.config.workeroutput["leftovers"] = changed
        return
    for left in _FROM_WORKERS:
        changed.update({f"{k} (an xdist worker's)": v for k, v in left.items()})
    if changed:
        print(f"\nthe suite left behind: {changed}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
