"""Benchmarks of equipoise against the systems it competes with (run as modules, e.g.
``python -m benchmarks.bench_ddp --preset ci`` from the repository root)."""
