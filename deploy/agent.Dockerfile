# The host agent's image (issue 32). Debian's packages only, built offline: the base is a
# debootstrap of Debian trixie (python3, python3-docker, python3-websockets, iptables,
# ca-certificates) imported with `docker import`, made and cached by
# deploy/build-agent-image.sh, which also assembles this build's small context (the agent's
# code and pynvml.py, the one pure-Python module Debian does not package). No registry, no pip.
#
# Run it on a GPU host (docs/agent.md, "The agent as a container"):
#
#   docker run -d --name gpucloud-agent --restart unless-stopped --network host \
#     --cap-drop ALL --cap-add NET_ADMIN --cap-add NET_RAW --security-opt no-new-privileges \
#     -v /var/run/docker.sock:/var/run/docker.sock \
#     -v /var/lib/gpucloud-agent:/var/lib/gpucloud-agent \
#     -v /run/xtables.lock:/run/xtables.lock \
#     --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=all -e NVIDIA_DRIVER_CAPABILITIES=utility \
#     -e GPUCLOUD_SERVER=https://cp.example.com -e GPUCLOUD_BOOTSTRAP_TOKEN=... \
#     gpucloud/agent:dev
#
# The mounts and options:
#   --network host        published ports bind the host's loopback, where the connect path
#                         reaches them; the egress rules go into the host's netfilter
#   NET_ADMIN, NET_RAW    iptables for the egress rules, and no other capability
#   docker.sock           the engine it runs tenants' containers on (root-equivalent: the
#                         agent itself gives containers no privileges)
#   /var/lib/gpucloud-agent  the state dir: the host's identity (its host token)
#   /run/xtables.lock     iptables' lock, shared with dockerd (legacy iptables backend)
#   --runtime nvidia ...  NVML inside (libnvidia-ml from the NVIDIA runtime; utility only,
#                         no CUDA); leave it out with --gpu-backend sim
#
# Every flag is also an environment variable (GPUCLOUD_<FLAG>); `doctor` runs the same way:
#   docker run --rm ... gpucloud/agent:dev doctor --server https://cp.example.com
ARG BASE=gpucloud/agent-base:trixie
FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/opt/gpucloud \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    GPUCLOUD_STATE_DIR=/var/lib/gpucloud-agent
# pynvml.py beside the agent's package: on PYTHONPATH, outside Debian's own directories.
COPY pynvml.py /opt/gpucloud/pynvml.py
COPY agents /opt/gpucloud/agents
RUN python3 -c 'import agents.host.__main__, docker, websockets.asyncio.client, pynvml' \
    && mkdir -p /var/lib/gpucloud-agent && chmod 0700 /var/lib/gpucloud-agent
WORKDIR /opt/gpucloud
VOLUME /var/lib/gpucloud-agent
ENTRYPOINT ["python3", "-m", "agents.host"]
