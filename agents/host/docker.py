"""The Docker Engine runtime (``docker`` SDK, docker-py 7.x).

Every container the agent creates is named ``gpucloud-<instance id>`` and labelled
``gpucloud.managed=1``, ``gpucloud.instance``, ``gpucloud.tenant`` and ``gpucloud.kind``;
``list()`` sees only those, so the agent never touches anything else on the host.

Isolation of one tenant's container (see docs/agent.md for the why of each line):

* GPUs: only the assigned UUIDs. NVIDIA through the NVIDIA Container Toolkit
  (``DeviceRequest(device_ids=[uuids], capabilities=[["gpu"]])``); AMD by passing
  ``/dev/kfd`` and the assigned GPUs' ``/dev/dri`` nodes. ``gpu_vendor="none"`` (simulated
  GPUs on a machine without any) sets the same environment variables but requests no
  device, so the engine does not refuse the start.
* Limits: ``nano_cpus``, ``mem_limit`` with no swap, ``pids_limit``.
* Privileges: ``privileged=False``, ``cap_drop=["ALL"]`` plus ``CAP_ADD``,
  ``no-new-privileges``, an init process to reap zombies.
* Limits: ``nofile`` ulimit; ``pids_limit`` capped by the agent's own setting; a size
  limit on the writable layer (``storage_opt={"size": ...}``) where the storage driver
  supports one (btrfs, zfs, devicemapper; overlay2 and vfs on xfs mounted with ``pquota``),
  else logged once, plainly, and reported in ``disk_quota``.
* Network: one bridge network per tenant (created on demand), so tenants cannot reach
  each other's containers; a container without one goes on ``gpucloud-tenants``, where
  inter-container traffic is off. Every such bridge is named ``gct<hash>`` so that the
  egress rules (``egress.py``: nothing to the host's own addresses or to 169.254.0.0/16)
  cover them all. Published ports bind to ``publish_address`` (loopback by default: the
  connect path reaches them through the agent, never other tenants over the network) on
  random host ports.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import random
import resource
import shlex
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from agents.host.egress import BRIDGE_PREFIX
from agents.host.pullerrors import start_error_reason
from agents.host.runtime import (
    LABEL_GPU_MILLI,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_TENANT,
    ContainerSpec,
    GpuLoad,
    RuntimeError_,
    container_name,
    declared_gpu_load,
)
from agents.protocol import CHECKPOINT_SIGNALS, ContainerState, ObservedContainer

logger = logging.getLogger(__name__)

# Docker's default set minus MKNOD (no device nodes), NET_RAW (no raw sockets: ARP/ICMP
# spoofing on the tenant bridge), SETPCAP and SETFCAP (no handing capabilities on).
# What remains is what ordinary images need: package managers and entrypoints that
# chown/su (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, SETUID, SETGID), signalling own
# processes (KILL), binding ports < 1024 (NET_BIND_SERVICE), and sshd's privilege
# separation (SYS_CHROOT, AUDIT_WRITE).
CAP_ADD: Final[tuple[str, ...]] = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "SETUID",
    "SETGID",
    "KILL",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "AUDIT_WRITE",
)
SECURITY_OPT: Final[tuple[str, ...]] = ("no-new-privileges:true",)
STOP_TIMEOUT_S: Final = 10
_NEVER: Final = "0001-01-01T00:00:00Z"  # Docker's zero time for "not yet"

DOCKER_GPU_VENDORS: Final = ("nvidia", "amd", "none")
LABEL_AGENT: Final = "gpucloud.agent"
LABEL_VOLUME: Final = "gpucloud.volume"  # on the named volumes the agent creates
# Where a container without a tenant network goes: inter-container traffic off.
FALLBACK_NETWORK: Final = "gpucloud-tenants"
_BRIDGE_NAME_OPT: Final = "com.docker.network.bridge.name"
_ICC_OPT: Final = "com.docker.network.bridge.enable_icc"
# Drivers that take a writable-layer size; overlay2 and vfs only on xfs with pquota (the
# engine refuses the option otherwise, and then the agent runs without it).
_QUOTA_DRIVERS: Final = frozenset({"btrfs", "zfs", "devicemapper", "windowsfilter"})
_QUOTA_ON_XFS: Final = frozenset({"overlay2", "vfs"})


def nofile_within_host(wanted: int) -> int:
    """``wanted``, lowered to this machine's hard open-files limit (the agent's own, which
    on one host is dockerd's too): the runtime cannot raise a container above the engine's
    limit without CAP_SYS_RESOURCE, and every start would fail ("error setting rlimit")."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or wanted <= hard:
        return wanted
    logger.warning(
        "nofile lowered to this machine's limit", extra={"wanted": wanted, "limit": hard}
    )
    return int(hard)


def bridge_name(network: str) -> str:
    """The Linux bridge of a tenant network: ``gct`` + 12 hex (15 characters, the kernel's
    limit), so the egress rules match every tenant bridge with ``-i gct+``."""
    return BRIDGE_PREFIX + hashlib.sha256(network.encode()).hexdigest()[:12]


def disk_quota_support(info: dict[str, Any]) -> str | None:
    """None if the engine's storage driver can limit a writable layer, else why not (pure)."""
    driver = str(info.get("Driver", ""))
    status = {str(k): str(v) for k, v in (info.get("DriverStatus") or []) if k}
    backing = status.get("Backing Filesystem", "")
    if driver in _QUOTA_DRIVERS or (driver in _QUOTA_ON_XFS and backing == "xfs"):
        return None
    on = f" on {backing}" if backing else ""
    return f"storage driver {driver or 'unknown'}{on} cannot limit a container's writable layer"

_STATES: Final[dict[str, ContainerState]] = {
    "created": "created",
    "running": "running",
    "paused": "running",
    "restarting": "running",
    "removing": "exited",
    "exited": "exited",
    "dead": "exited",
}


def amd_device_nodes(bus_id: str | None, sysfs_root: Path = Path("/sys")) -> list[str]:
    """/dev/dri nodes (card*, renderD*) of the AMD GPU at ``bus_id``, from sysfs."""
    if not bus_id:
        return []
    drm = sysfs_root / "bus/pci/devices" / bus_id / "drm"
    try:
        names = sorted(p.name for p in drm.iterdir())
    except OSError:
        return []
    return [f"/dev/dri/{n}" for n in names if n.startswith(("card", "renderD"))]


class DockerRuntime:
    name = "docker"

    def __init__(
        self,
        client: Any = None,
        *,
        gpu_vendor: str = "nvidia",
        amd_devices: dict[str, list[str]] | None = None,
        stop_timeout_s: int = STOP_TIMEOUT_S,
        scope: str = "",
        publish_address: str = "127.0.0.1",
        pids_limit: int = 4096,
        nofile: int = 65536,
        disk_gib: int = 0,
        image_fallback: str = "",
    ) -> None:
        """``gpu_vendor``: ``nvidia``, ``amd`` or ``none`` (env variables only, no devices).
        ``amd_devices``: GPU UUID -> its /dev/dri nodes (from ``amd_device_nodes``).
        ``scope``: when set, containers also carry ``gpucloud.agent=<scope>`` and ``list()``
        sees only those, so several agents can share one engine (tests, simulations).
        ``publish_address``: the host address published ports bind to ("" = all).
        ``pids_limit``: the most processes a container may have, whatever the spec asks.
        ``nofile``: the open-files ulimit (soft = hard). ``disk_gib``: writable-layer size
        limit where the storage driver supports one (0: none). ``image_fallback``: an image
        on this host to run instead of a requested image the engine does not have (the demo,
        where no registry is reachable: docs/connect.md); the container then says so first
        thing in its log. Empty (the default): the engine pulls the image as usual."""
        if gpu_vendor not in DOCKER_GPU_VENDORS:
            raise ValueError(f"gpu_vendor must be one of {DOCKER_GPU_VENDORS}")
        self._publish_address = publish_address
        self._pids_limit = pids_limit
        self._nofile = nofile
        self._disk_gib = disk_gib
        # "applied", "off", or why not (filled at the first start: it asks the engine).
        self.disk_quota: str | None = None if disk_gib > 0 else "off"
        self._docker: Any = importlib.import_module("docker")
        self._scope = scope
        self._client = client if client is not None else self._docker.from_env()
        self._vendor = gpu_vendor
        self._amd_devices = amd_devices or {}
        self._stop_timeout_s = stop_timeout_s
        self._image_fallback = image_fallback
        # The engine's CPU count (asked at the first start): it refuses a container more.
        self._cpus: float | None = None
        # Networks this process made or checked: a start does not ask for them again (one
        # the engine lost since is made again when a create says it is missing).
        self._networks: set[str] = set()
        # Instance id -> what its owner should read of how it runs: the stand-in image run in
        # place of the one asked for (the agent reports it; the control plane puts it in the
        # workload's reason, so the instance page and the API say so, not only the log).
        self.notes: dict[str, str] = {}

    def _get(self, instance_id: str) -> Any:
        try:
            return self._client.containers.get(container_name(instance_id))
        except self._docker.errors.NotFound:
            return None

    def _network(self, name: str, tenant_id: str) -> str:
        bridge = bridge_name(name)
        for net in self._client.networks.list(names=[name]):
            if net.name != name:  # the names filter matches substrings
                continue
            if (net.attrs.get("Options") or {}).get(_BRIDGE_NAME_OPT) == bridge:
                return name
            # Made by an agent before the egress rules: its bridge escapes them. Recreate it
            # once nothing uses it; until then say so.
            try:
                net.remove()
                logger.info("tenant network recreated for the egress rules",
                            extra={"network": name})
            except self._docker.errors.APIError as e:
                logger.warning(
                    "tenant network predates the egress rules and is in use; its containers "
                    "can reach the host until it is recreated",
                    extra={"network": name, "error": str(e)},
                )
                return name
        options = {_BRIDGE_NAME_OPT: bridge}
        if name == FALLBACK_NETWORK:
            options[_ICC_OPT] = "false"  # shared by tenants: containers cannot talk at all
        try:
            self._client.networks.create(
                name,
                driver="bridge",
                options=options,
                labels={LABEL_MANAGED: "1", LABEL_TENANT: tenant_id if name != FALLBACK_NETWORK
                        else ""},
            )
        except self._docker.errors.APIError as e:
            if e.status_code != 409:  # 409: another create won the race; fine
                raise
        return name

    def engine_volume(self, name: str) -> str:
        """The engine's name of gpucloud volume ``name``: itself, or with ``.<scope>`` when
        agents share an engine (tests, simulations), so that each has its own copy."""
        return f"{name}.{self._scope}" if self._scope else name

    def _volume(self, name: str, tenant_id: str) -> None:
        """Create the named volume (local driver) once, labelled as gpucloud's; an existing one
        is kept with its data. The local driver has no size limit for a named volume (only a
        tmpfs or a block device behind it would have one): the size is measured, not enforced
        (docs/volumes.md)."""
        try:
            self._client.volumes.get(self.engine_volume(name))
            return
        except self._docker.errors.NotFound:
            pass
        labels = {LABEL_MANAGED: "1", LABEL_TENANT: tenant_id, LABEL_VOLUME: name}
        if self._scope:
            labels[LABEL_AGENT] = self._scope
        self._client.volumes.create(name=self.engine_volume(name), driver="local", labels=labels)

    def volume_names(self) -> list[str]:
        """The gpucloud volumes on this host (of this agent's scope)."""
        selector = [f"{LABEL_MANAGED}=1", LABEL_VOLUME]
        if self._scope:
            selector.append(f"{LABEL_AGENT}={self._scope}")
        return sorted((v.attrs.get("Labels") or {}).get(LABEL_VOLUME) or v.name
                      for v in self._client.volumes.list(filters={"label": selector}))

    def volume_usage(self) -> dict[str, int]:
        """Bytes used by each gpucloud volume of this scope (``docker system df``: it walks
        the volumes' files, so the agent asks every few minutes, not every heartbeat)."""
        out: dict[str, int] = {}
        for v in self._client.df().get("Volumes") or []:
            labels = v.get("Labels") or {}
            if labels.get(LABEL_MANAGED) != "1" or LABEL_VOLUME not in labels:
                continue
            if self._scope and labels.get(LABEL_AGENT) != self._scope:
                continue
            size = (v.get("UsageData") or {}).get("Size", -1)
            out[str(labels.get(LABEL_VOLUME) or v["Name"])] = max(0, int(size))
        return out

    def remove_volume(self, name: str) -> bool:
        """Remove a gpucloud volume and its data. Docker refuses while a container uses it
        (then False: asked again later); an unknown volume is already gone (True)."""
        try:
            v = self._client.volumes.get(self.engine_volume(name))
        except self._docker.errors.NotFound:
            return True
        if (v.attrs.get("Labels") or {}).get(LABEL_MANAGED) != "1":
            return False  # never anything the agent did not create
        try:
            v.remove()
        except self._docker.errors.APIError:
            return False
        return True

    def _helper(self, name: str, mode: str) -> Any:
        """A created (never started) container of the stand-in image with volume ``name`` at
        /v: the engine's archive API reads and writes a volume through it, no shell needed."""
        if not self._image_fallback:
            raise RuntimeError_("moving a volume needs a local helper image (--docker-image-fallback)")
        labels = {"gpucloud.volume-move": "1"}
        if self._scope:
            labels[LABEL_AGENT] = self._scope
        return self._client.containers.create(
            self._image_fallback, command=["true"], labels=labels, network_mode="none",
            volumes={self.engine_volume(name): {"bind": "/v", "mode": mode}},
        )

    def volume_export(self, name: str) -> Iterator[bytes]:
        """A tar of volume ``name``'s files (entries under ``v/``), in pieces as the engine
        streams it. Raises RuntimeError_ for a volume this host does not have."""
        try:
            self._client.volumes.get(self.engine_volume(name))
        except self._docker.errors.NotFound:
            raise RuntimeError_(f"no volume {name} on this host") from None
        helper = self._helper(name, "ro")
        try:
            stream, _stat = helper.get_archive("/v")
            yield from stream
        finally:
            helper.remove(force=True)

    def volume_import(self, name: str, tenant_id: str, data: Any) -> None:
        """Create volume ``name`` and unpack ``data`` (a tar from ``volume_export``: bytes or a
        binary file, streamed to the engine) into it."""
        self._volume(name, tenant_id)
        helper = self._helper(name, "rw")
        try:
            if not helper.put_archive("/", data):
                raise RuntimeError_(f"the engine did not unpack the data into {name}")
        finally:
            helper.remove(force=True)

    def _check_disk_quota(self) -> None:
        """Ask the engine once whether its storage driver can limit the writable layer."""
        if self.disk_quota is not None:
            return
        try:
            why = disk_quota_support(self._client.info())
        except self._docker.errors.DockerException as e:
            logger.warning("docker info failed; disk quota unknown", extra={"error": str(e)})
            return  # asked again at the next start
        self.disk_quota = "applied" if why is None else f"not applied: {why}"
        log = logger.info if why is None else logger.warning
        log(
            "container disk quota " + self.disk_quota,
            extra={"disk_gib": self._disk_gib},
        )

    def run_kwargs(self, spec: ContainerSpec) -> dict[str, Any]:
        """The ``containers.run`` arguments for ``spec`` (pure; separate for review and tests)."""
        types = self._docker.types
        env = dict(spec.env)
        kwargs: dict[str, Any] = {}
        if spec.gpu_uuids and self._vendor in ("nvidia", "none"):
            if self._vendor == "nvidia":
                kwargs["device_requests"] = [
                    types.DeviceRequest(device_ids=list(spec.gpu_uuids), capabilities=[["gpu"]])
                ]
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(spec.gpu_uuids)
            # CUDA accepts UUIDs here; they name the same GPUs whatever order they appear in.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.gpu_uuids)
            if spec.gpu_milli < 1000:
                # A share of a GPU: a hint honoured under an MPS daemon, not a hard limit.
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, spec.gpu_milli // 10))
        elif spec.gpu_uuids and self._vendor == "amd":
            nodes = ["/dev/kfd"]
            for u in spec.gpu_uuids:
                if u not in self._amd_devices:
                    raise RuntimeError_(f"no /dev/dri nodes known for GPU {u}")
                nodes += self._amd_devices[u]
            kwargs["devices"] = [f"{n}:{n}:rwm" for n in nodes]
            kwargs["group_add"] = ["video"]
        else:
            # No GPU assigned: make sure the toolkit does not expose all of them by default.
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        labels = dict(spec.labels)
        labels.update(
            {
                LABEL_MANAGED: "1",
                LABEL_INSTANCE: spec.instance_id,
                LABEL_TENANT: spec.tenant_id,
                LABEL_KIND: spec.kind,
                LABEL_GPU_MILLI: str(spec.gpu_milli),
            }
        )
        if self._scope:
            labels[LABEL_AGENT] = self._scope
        kwargs.update(
            image=spec.image,
            command=list(spec.command) or None,
            name=container_name(spec.instance_id),
            detach=True,
            labels=labels,
            environment=env,
            # Loopback by default: the connect path reaches them through the agent; nobody
            # else on the network (other tenants' containers included) can.
            ports={
                f"{p}/tcp": (self._publish_address,) if self._publish_address else None
                for p in spec.ports
            },
            # At most the engine's CPUs (a simulated host advertises more than the machine has).
            nano_cpus=int((min(spec.vcpus, self._cpus) if self._cpus else spec.vcpus) * 1e9),
            mem_limit=f"{spec.memory_mib}m",
            memswap_limit=f"{spec.memory_mib}m",  # equal to mem_limit: no swap
            # PyTorch data loaders live in /dev/shm; Docker's 64 MiB default breaks them.
            shm_size=f"{max(64, spec.memory_mib // 4)}m",
            # The spec's limit, never above the host's own cap (0 in a spec: the cap).
            pids_limit=min(spec.pids_limit, self._pids_limit)
            if spec.pids_limit > 0
            else self._pids_limit,
            ulimits=[types.Ulimit(name="nofile", soft=self._nofile, hard=self._nofile)],
            cap_drop=["ALL"],
            cap_add=list(CAP_ADD),
            security_opt=list(SECURITY_OPT),
            privileged=False,
            init=True,
            restart_policy={"Name": "no"},  # restarts are the control plane's decision
        )
        kwargs["network"] = spec.network or FALLBACK_NETWORK
        if spec.mounts:
            kwargs["volumes"] = {
                self.engine_volume(m.volume): {"bind": m.path, "mode": "ro" if m.read_only else "rw"}
                for m in spec.mounts
            }
        if self.disk_quota == "applied":
            kwargs["storage_opt"] = {"size": f"{self._disk_gib}G"}
        return kwargs

    def run(self, spec: ContainerSpec) -> str:
        """Create and start the container of ``spec``: its id. What a user waits for between
        placement and RUNNING, so the engine is asked little: no look-up first (a create
        whose name is taken says so; a running container of that name is the answer, any
        other is replaced) and the network once per process (a start that finds it gone
        makes it again)."""
        self._check_disk_quota()
        try:
            if self._cpus is None:
                self._cpus = float(self._client.info().get("NCPU") or 0) or None
            spec = self._stand_in(spec)
        except self._docker.errors.DockerException as e:
            raise RuntimeError_(str(e)) from e
        kwargs = self.run_kwargs(spec)
        try:
            for m in spec.mounts:
                self._volume(m.volume, spec.tenant_id)
            known = kwargs["network"] in self._networks
            try:
                container, running = self._create(spec, kwargs)
            except self._docker.errors.APIError as e:
                # overlay2 on xfs without pquota: the driver looked right, the engine says no.
                if "storage_opt" not in kwargs or "storage" not in str(e).lower():
                    raise
                self.disk_quota = f"not applied: the engine refused it ({e.explanation or e})"
                logger.warning("container disk quota " + self.disk_quota)
                self.remove(spec.instance_id)  # in case the create got that far
                container, running = self._create(spec, self.run_kwargs(spec))
            if not running:
                try:
                    container.start()
                except self._docker.errors.NotFound as e:
                    if not known or "network" not in str(e).lower():
                        raise
                    # the network was removed behind our back: made again, and a new create
                    self._networks.discard(kwargs["network"])
                    container.remove(force=True)
                    container, running = self._create(spec, kwargs)
                    if not running:
                        container.start()
        except self._docker.errors.DockerException as e:
            # the cause in words (not found, credentials, registry unreachable, disk full)
            raise RuntimeError_(start_error_reason(spec.image, str(e))) from e
        return str(container.id)

    def _create(self, spec: ContainerSpec, kwargs: dict[str, Any], replace: bool = False) -> tuple[Any, bool]:
        """(the container, whether it runs already): created, not started, unless one of its
        name runs. One of its name that does not run is removed first. The image is pulled
        if the engine lacks it, as ``containers.run`` does."""
        network = kwargs["network"]
        if network not in self._networks:
            self._network(network, spec.tenant_id)
            self._networks.add(network)
        if replace:
            self.remove(spec.instance_id)
        args = {k: v for k, v in kwargs.items() if k != "detach"}
        errors = self._docker.errors
        try:
            try:
                return self._client.containers.create(**args), False
            except errors.ImageNotFound:
                self._client.images.pull(args["image"])
                return self._client.containers.create(**args), False
        except errors.APIError as e:
            if e.status_code == 409 and not replace:  # the name is taken
                existing = self._get(spec.instance_id)
                if existing is not None and existing.status == "running":
                    return existing, True
                return self._create(spec, kwargs, replace=True)
            raise

    def _stand_in(self, spec: ContainerSpec) -> ContainerSpec:
        """``spec``, or with an ``image_fallback`` and an image this engine lacks, the same
        container on the fallback image, saying so: the first line of its log names both
        images. With a command, the command then runs as given (a tool the fallback lacks
        fails as it would); without one, busybox ``httpd`` answers on each published port
        with a page saying the same, and the container sleeps until stopped. Nothing is
        pulled in this mode: a catalogue image is gigabytes, and the demo needs no registry."""
        self.notes.pop(spec.instance_id, None)
        if not self._image_fallback or spec.image == self._image_fallback:
            return spec
        try:
            self._client.images.get(spec.image)
            return spec
        except self._docker.errors.ImageNotFound:
            pass
        notice = (
            f"gpucloud: image {spec.image} is not on this host and is not pulled here; "
            f"running the stand-in image {self._image_fallback} (busybox) in its place"
        )
        logger.warning(notice, extra={"instance": spec.instance_id})
        self.notes[spec.instance_id] = (f"image {spec.image} is not on this host (a demo pulls nothing): the "
                                        f"busybox stand-in runs in its place; check the image name")
        # On stdout, the stream the command writes to first: docker orders lines within a
        # stream, not across stdout and stderr.
        script = ["echo " + shlex.quote(notice)]
        if spec.command:
            script.append('exec "$@"')
        else:
            page = f"<!doctype html><title>stand-in</title><p>{notice}</p>"
            script.append("mkdir -p /tmp/www && echo " + shlex.quote(page) + " > /tmp/www/index.html")
            # The page at / and, as the 404 page, at every other path (the Jupyter port
            # keeps the gateway's prefix).
            script.append("echo E404:/tmp/www/index.html > /tmp/httpd.conf")
            script += [f"httpd -p {p} -h /tmp/www -c /tmp/httpd.conf" for p in spec.ports]
            script.append("exec sleep infinity")
        command = ["sh", "-c", "\n".join(script), "sh", *spec.command]
        return replace(spec, image=self._image_fallback, command=command)

    def stop(self, instance_id: str) -> None:
        c = self._get(instance_id)
        if c is None:
            return
        try:
            c.stop(timeout=self._stop_timeout_s)
        except self._docker.errors.NotFound:
            pass

    def signal(self, instance_id: str, signal: str) -> None:
        """`docker kill --signal`: the container keeps running if its process handles it."""
        if signal not in CHECKPOINT_SIGNALS:
            raise RuntimeError_(f"refusing to send {signal!r}: not a checkpoint signal")
        c = self._get(instance_id)
        if c is None:
            return
        try:
            c.kill(signal=signal)
        except self._docker.errors.NotFound:
            pass
        except self._docker.errors.APIError as e:  # not running (any more): nothing to signal
            raise RuntimeError_(f"signal {signal} not sent: {e}") from e

    def remove(self, instance_id: str) -> None:
        self.notes.pop(instance_id, None)
        c = self._get(instance_id)
        if c is None:
            return
        try:
            c.remove(force=True)
        except self._docker.errors.NotFound:
            pass

    def list(self) -> list[ObservedContainer]:
        out = []
        selector = [f"{LABEL_MANAGED}=1"]
        if self._scope:
            selector.append(f"{LABEL_AGENT}={self._scope}")
        for c in self._client.containers.list(all=True, filters={"label": selector}):
            iid = c.labels.get(LABEL_INSTANCE)
            if not iid:
                continue
            st = c.attrs.get("State", {})
            state = _STATES.get(st.get("Status", ""), "exited")
            ports: dict[str, int] = {}
            for key, binds in (c.attrs.get("NetworkSettings", {}).get("Ports") or {}).items():
                if binds:
                    ports[key.split("/")[0]] = int(binds[0]["HostPort"])
            started, finished = st.get("StartedAt"), st.get("FinishedAt")
            out.append(
                ObservedContainer(
                    instance_id=iid,
                    container_id=str(c.id),
                    state=state,
                    exit_code=st.get("ExitCode") if state == "exited" else None,
                    started_at=started if started and started != _NEVER else None,
                    finished_at=finished if finished and finished != _NEVER else None,
                    error=st.get("Error") or None,
                    host_ports=ports,
                )
            )
        return sorted(out, key=lambda o: o.instance_id)

    def gpu_load(self) -> GpuLoad:
        """GPU UUID -> [(milli, load)] of this scope's running containers, from their labels and
        env (the GPUs in NVIDIA_VISIBLE_DEVICES, the share in LABEL_GPU_MILLI, the load declared by
        GPUCLOUD_SIM_GPU_UTIL or drawn once per container). Only the simulated GPU backend asks:
        a real GPU measures its own load."""
        selector = [f"{LABEL_MANAGED}=1"]
        if self._scope:
            selector.append(f"{LABEL_AGENT}={self._scope}")
        out: GpuLoad = {}
        for c in self._client.containers.list(filters={"label": selector, "status": "running"}):
            env = dict(e.split("=", 1) for e in (c.attrs.get("Config", {}).get("Env") or []) if "=" in e)
            gpus = [u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u and u not in ("void", "all")]
            if not gpus:
                continue
            milli = int(c.labels.get(LABEL_GPU_MILLI) or 1000)
            # Seeded by the container's id: the same container drives its GPUs the same way
            # from one sample to the next, as the simulated runtime's containers do.
            load = declared_gpu_load(env, random.Random(str(c.id)))
            for u in gpus:
                out.setdefault(u, []).append((milli, load))
        return out

    def logs(self, instance_id: str, tail: int = 100) -> str:
        c = self._get(instance_id)
        if c is None:
            return ""
        data = c.logs(tail=tail)
        return data.decode(errors="replace") if isinstance(data, bytes) else str(data)
