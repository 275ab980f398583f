"""The testbed's pieces that need no namespace (tests/integration/test_testbed.py runs hosts)."""

import stat
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)


def test_the_first_ray_node_a_testbed_starts_makes_its_token(tmp_path, monkeypatch):
    """start_ray_node alone (the chaos benchmark starts nodes one by one, not through
    start_ray) writes the testbed's Ray token, readable by its owner only, before the
    node's `ray start` is given its path; a second node reuses it. No namespace is made:
    the command is recorded, not run."""
    from equipoise import testbed as tbmod

    monkeypatch.setattr(tbmod.tempfile, "gettempdir", lambda: str(tmp_path))
    tb = tbmod.Testbed([tbmod.Host(), tbmod.Host()], prefix="eqtk")
    seen = []

    def run(i, cmd, timeout=None, env=None):
        token = Path(env["RAY_AUTH_TOKEN_PATH"])
        seen.append((i, token.read_text(), stat.S_IMODE(token.stat().st_mode)))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(tb, "run", run)
    tb.start_ray_node(0, 1, None)
    tb.start_ray_node(1, 1, None)
    assert [s[0] for s in seen] == [0, 1] and seen[0][1] == seen[1][1] and len(seen[0][1]) == 64
    assert seen[0][2] == 0o600
