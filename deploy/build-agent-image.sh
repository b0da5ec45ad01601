#!/usr/bin/env bash
# Build the agent's image (deploy/agent.Dockerfile) from Debian's packages, with no registry:
#   1. the base, once: debootstrap Debian trixie (minbase + the agent's few packages) into a
#      cached root and `docker import` it as $BASE (skipped while that image exists);
#   2. the image: the agent's code and pynvml.py (from this project's pinned nvidia-ml-py)
#      in a small build context, on top of $BASE.
# Needs root, docker and debootstrap (apt-get install debootstrap), and the Debian mirror
# for step 1 only. Usage: deploy/build-agent-image.sh [IMAGE]   (default gpucloud/agent:dev)
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${1:-gpucloud/agent:dev}
BASE=${BASE:-gpucloud/agent-base:trixie}
SUITE=${SUITE:-trixie}  # websockets >= 13 (the tunnel's asyncio client) and docker 7 are in trixie
MIRROR=${MIRROR:-http://deb.debian.org/debian}
ROOTFS=${ROOTFS:-/var/cache/gpucloud/agent-rootfs-$SUITE}
PACKAGES=python3,python3-docker,python3-websockets,iptables,ca-certificates
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
        rm -rf "$ROOTFS.partial"
        debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS.partial" "$MIRROR"
        rm -rf "$ROOTFS.partial"/var/cache/apt/archives/*.deb "$ROOTFS.partial"/var/lib/apt/lists/*
        mv "$ROOTFS.partial" "$ROOTFS"
    fi
    # Device nodes, /proc and /sys are the runtime's to provide.
    tar -C "$ROOTFS" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . \
        | docker import - "$BASE"
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/agents"
cp agents/__init__.py agents/protocol.py "$ctx/agents/"
tar -C agents --exclude=__pycache__ -c host | tar -C "$ctx/agents" -x
cp "$("$PY" -c 'import pynvml; print(pynvml.__file__)')" "$ctx/pynvml.py"
docker build -q -f deploy/agent.Dockerfile --build-arg BASE="$BASE" -t "$IMAGE" "$ctx"
