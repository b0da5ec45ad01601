#!/usr/bin/env bash
# The real-GPU check (issue 32): NVML inventory and samples, MIG discovery (and with
# --mig-create one MIG instance created and destroyed), and a container pinned to one GPU
# that must see exactly it. Prints one JSON report; exit 0 all passed, 1 a step failed,
# 2 no NVIDIA GPU here. See agents/host/gpucheck.py and docs/agent.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec "$PY" -m agents.host doctor --gpu "$@"
