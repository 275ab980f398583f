"""Marks multi-process and whole-job tests `slow`, so `pytest -m "not slow"` is the fast
subset (see README: Running the tests). Marked here, by file and test name, rather than
in each file."""

from __future__ import annotations

from pathlib import Path

import pytest

# Unit test files that run real jobs or spawn worker processes (seconds each).
SLOW_FILES = {"test_threads_job.py", "test_benchmarks_smoke.py"}
# Unit tests elsewhere that start processes (CPU burners next to a child process).
SLOW_PREFIXES = ("test_burner_",)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.path))
        if ("integration" in path.parts or path.name in SLOW_FILES
                or item.name.startswith(SLOW_PREFIXES)):
            item.add_marker(pytest.mark.slow)
