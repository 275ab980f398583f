"""What every test shares. Tests that run real jobs or start processes carry the `slow`
marker themselves (each integration file's `pytestmark`, the few unit tests that do),
so `pytest -m "not slow"` is the fast subset."""
