#!/usr/bin/env bash
# What benchmarks/gpu_check.py needs on a GPU machine that has torch (2.11, Python 3.12)
# and no package registry: wheels of equipoise's other dependencies for CPython 3.12 on
# x86-64 Linux (.gpu-wheels/) and the fortunes text for the GPT workload (.gpu-data/).
# Both folders are ignored by git; the device run carries them. Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-wheels .gpu-data
mkdir -p .gpu-wheels .gpu-data
pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d .gpu-wheels "pyzmq>=25,<28" "msgpack>=1.0,<2" "psutil>=5.9,<8" "rich>=13,<16" "numpy>=1.26,<3"
cp -r /usr/share/games/fortunes .gpu-data/fortunes
du -sh .gpu-wheels .gpu-data
