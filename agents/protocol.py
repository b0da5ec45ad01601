"""The agent protocol: versioned JSON messages between a host agent and the control plane.

Shared by both sides, so it imports nothing but the standard library (no Django, no
pynvml). Every message is a frozen dataclass with ``to_dict()`` (JSON-ready) and
``from_dict()`` (validating: a wrong type, a missing field or an unknown enum value
raises ``ProtocolError`` naming the field).

Endpoints (both ``POST``, JSON bodies, ``Content-Type: application/json``)::

    /agent/v1/register   RegisterRequest  -> RegisterResponse   (no auth; bootstrap token in body)
    /agent/v1/heartbeat  Heartbeat        -> HeartbeatResponse  (Authorization: Bearer <host token>)
    /agent/v1/wait       WaitRequest      -> WaitResponse       (same auth; a long poll)

The wait: a heartbeat answer may carry ``desired_version`` (only where the control plane
holds long polls). The agent then sends it back in a ``WaitRequest``, which the control
plane answers as soon as the host's desired state has moved past that version (at once if
it already has), or after ``timeout_s`` with ``changed: false``. On ``changed`` the agent
heartbeats at once: placements reach it without waiting for its interval.

Versioning: every top-level message carries ``"protocol_version": 1``. A receiver refuses
another major version (``ProtocolError``); unknown keys are ignored so either side may add
optional fields without a version bump. GPUs are named by UUID everywhere, never by index
alone. Identifiers of hosts, tenants and instances are strings (the control plane sends
``str(pk)``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar, cast

PROTOCOL_VERSION: Final = 1

REGISTER_PATH: Final = "/agent/v1/register"
HEARTBEAT_PATH: Final = "/agent/v1/heartbeat"
WAIT_PATH: Final = "/agent/v1/wait"
# A volume move's data, relayed by the control plane (docs/volumes.md "Moving a volume"):
# PUT/GET {VOLUME_MOVES_PATH}/<move id>/chunks/<n>, POST …/<move id>/sent|received|failed.
VOLUME_MOVES_PATH: Final = "/agent/v1/volume-moves"
VOLUME_MOVE_ROLES: Final = ("send", "receive")
WAIT_MAX_S: Final = 60.0  # the longest wait a request may ask for
# A registration nonce (RegisterRequest.registration_nonce) is at least this long: the agent
# sends 43 characters (256 random bits, URL-safe base64).
REGISTRATION_NONCE_MIN_LEN: Final = 32

ContainerState = Literal["running", "exited", "created", "missing"]
CONTAINER_STATES: Final[frozenset[str]] = frozenset({"running", "exited", "created", "missing"})
WorkloadKind = Literal["instance", "job"]
WORKLOAD_KINDS: Final[frozenset[str]] = frozenset({"instance", "job"})

# Rules both sides of the protocol (the agent, the control plane's slow and fast paths, the
# scheduler's auto-stop) read from this one place.
# XIDs after which the GPU needs a reset or is gone, so new work must not land on it:
# 48 double-bit ECC, 62 internal micro-controller halt, 64 row-remap/page-retirement
# failure, 74 NVLink error, 79 fallen off the bus, 95 uncontained ECC error, 119/120 GSP
# timeout/error. (43, 13, 31... are application faults: the GPU itself is fine.)
FATAL_XIDS: Final[frozenset[int]] = frozenset({48, 62, 64, 74, 79, 95, 119, 120})
IDLE_BELOW: Final = 0.05  # utilisation under 5 % counts as idle (the reclaimer and auto-stop read idle_since)
# Heartbeats at most this many behind the newest applied one are late duplicates; a seq
# further back can only be an agent that restarted (seq counts from 1 per agent start).
# Read by the slow path (agents.services.seq_is_fresh) and the fast path's script alike.
SEQ_REORDER_WINDOW: Final = 16
WAKE_PREFIX: Final = "gateway:wake:"
# Checkpoint-aware preemption: the signals a job may ask for before it is stopped (the API
# refuses others; the agent sends nothing else), and the longest grace it may ask for.
CHECKPOINT_SIGNALS: Final[frozenset[str]] = frozenset(
    {"SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"}
)
CHECKPOINT_GRACE_MAX_S: Final = 3600


def utilisation_fraction(percent: float) -> float:
    """A GPU's utilisation as the control plane stores it and ``IDLE_BELOW`` reads it: a
    sample's percent (NVML's 0..100) as a fraction, clamped to 0..1 so that a reading out of
    range cannot mark a GPU idle or busier than full. The one home of the rule: the slow
    path (agents.services.gpus), the fast path's flush (agents.fastpath) and the simulated
    agent's load all convert through it."""
    return min(1.0, max(0.0, percent / 100))


def wake_channel(host_id: str) -> str:
    """The Redis pub/sub channel on which the control plane says "this host's desired state
    changed" (agents.fastpath.hosts_changed, after commit); the gateway replica holding the
    host's tunnel listens on it and sends the agent a WAKE frame, so it heartbeats at once."""
    return f"{WAKE_PREFIX}{host_id}"

# Names of the PCIe/NVLink distance between two GPUs, closest first. NVML's
# nvmlGpuTopologyLevel_t and AMD SMI link types both map onto these.
TOPOLOGY_LEVELS: Final[tuple[str, ...]] = (
    "nvlink",  # direct NVLink / NVSwitch / xGMI
    "board",  # same board (NVML_TOPOLOGY_INTERNAL)
    "pcie_switch",  # one PCIe switch (NVML_TOPOLOGY_SINGLE)
    "pcie_switches",  # several PCIe switches, no host bridge (NVML_TOPOLOGY_MULTIPLE)
    "host_bridge",  # same PCIe host bridge (NVML_TOPOLOGY_HOSTBRIDGE)
    "numa_node",  # same NUMA node / CPU socket (NVML_TOPOLOGY_NODE)
    "system",  # across sockets (NVML_TOPOLOGY_SYSTEM)
)

T = TypeVar("T")


class ProtocolError(ValueError):
    """A message does not follow the protocol. ``field`` is a dotted path to the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# --- host names ---------------------------------------------------------------------

# A host's name is what operators read in the admin, the fleet pages and the logs, so two
# hosts must never read alike: "sec3-h1 " (a trailing space) once registered a second host
# that showed as "sec3-h1" everywhere. One rule, here where both sides can use it (the
# agent at start, the control plane on every way a name comes in): strip, drop one final
# dot (a fully qualified "h1.example."), lower-case, then RFC 1123 labels of ASCII letters,
# digits and '-' joined by '.'. Anything else (other scripts' lookalike letters, NUL and
# control characters, inner spaces, '_') is refused rather than guessed at.
HOST_NAME_MAX_LEN: Final = 200  # the column (RFC 1123 allows 253)
_HOST_LABEL: Final = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME_RE: Final = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*")
HOST_NAME_RULE: Final = (
    "must be a host name: ASCII letters, digits and '-', in dot-separated labels of at most "
    f"63 characters that neither start nor end with '-', {HOST_NAME_MAX_LEN} characters in all"
)


def host_name_normalise(raw: str) -> str:
    """The one form of a host name (pure): stripped, without a final dot, lower case.

    Raises ValueError with HOST_NAME_RULE for a name outside the character set. Checked on
    ASCII before folding, so no other script's letter (the Kelvin sign folds to 'k') turns
    into a lookalike of an ASCII one."""
    name = raw.strip()
    if name.endswith("."):
        name = name[:-1]
    if not name.isascii():
        raise ValueError(HOST_NAME_RULE)
    name = name.lower()
    if len(name) > HOST_NAME_MAX_LEN or not _HOST_NAME_RE.fullmatch(name):
        raise ValueError(HOST_NAME_RULE)
    return name


# --- validation helpers -------------------------------------------------------------


INT16_MAX: Final = 2**15 - 1
INT32_MAX: Final = 2**31 - 1
INT64_MAX: Final = 2**63 - 1


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _encodable(v: str) -> bool:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Reader:
    """Typed access to one JSON object; every error names the full field path."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ProtocolError(path or "$", "must be an object")
        self.data: Mapping[str, Any] = data
        self.path = path

    def _p(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str, default: object, required: bool) -> object:
        if key not in self.data or self.data[key] is None:
            if required:
                raise ProtocolError(self._p(key), "is required")
            return default
        return self.data[key]

    def _nul(self, key: str, v: str, text: bool) -> str:
        """NUL cannot be stored in PostgreSQL text, nor a lone UTF-16 surrogate (valid in JSON
        as "\\ud800", not Unicode). In free text that a container wrote (its log, the runtime's
        error) each becomes U+FFFD, so one process's output cannot make its host's heartbeats
        fail; in names and ids they are refused."""
        surrogates = not v.isascii() and not _encodable(v)
        if "\x00" not in v and not surrogates:
            return v
        if text:
            v = v.replace("\x00", "\ufffd")
            return _SURROGATE.sub("\ufffd", v) if surrogates else v
        if surrogates:
            raise ProtocolError(self._p(key), "must not contain lone surrogates (not Unicode text)")
        raise ProtocolError(self._p(key), "must not contain NUL characters")

    def _len(self, key: str, v: str, max_len: int | None) -> str:
        if max_len is not None and len(v) > max_len:
            raise ProtocolError(self._p(key), f"must be at most {max_len} characters")
        return v

    def str_(
        self, key: str, *, required: bool = True, default: str = "", empty: bool = False,
        text: bool = False, max_len: int | None = None,
    ) -> str:
        v = self._get(key, default, required)
        if not isinstance(v, str):
            raise ProtocolError(self._p(key), "must be a string")
        if required and not empty and not v:
            raise ProtocolError(self._p(key), "must not be empty")
        return self._len(key, self._nul(key, v, text), max_len)

    def opt_str(self, key: str, *, text: bool = False, max_len: int | None = None) -> str | None:
        v = self._get(key, None, False)
        if v is not None and not isinstance(v, str):
            raise ProtocolError(self._p(key), "must be a string or null")
        return None if v is None else self._len(key, self._nul(key, v, text), max_len)

    def int_(
        self, key: str, *, required: bool = True, default: int = 0, minimum: int | None = 0,
        maximum: int = INT32_MAX,
    ) -> int:
        v = self._get(key, default, required)
        # bool is an int subclass in Python; a JSON true is not a count.
        if not isinstance(v, int) or isinstance(v, bool):
            raise ProtocolError(self._p(key), "must be an integer")
        if minimum is not None and v < minimum:
            raise ProtocolError(self._p(key), f"must be >= {minimum}")
        if v > maximum:  # the column it goes to; past it PostgreSQL would refuse the whole heartbeat
            raise ProtocolError(self._p(key), f"must be <= {maximum}")
        return v

    def opt_int(self, key: str, *, minimum: int | None = None, maximum: int = INT32_MAX) -> int | None:
        if self._get(key, None, False) is None:
            return None
        return self.int_(key, minimum=minimum, maximum=maximum)

    def float_(
        self, key: str, *, required: bool = True, default: float = 0.0, minimum: float | None = 0.0
    ) -> float:
        v = self._get(key, default, required)
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise ProtocolError(self._p(key), "must be a number")
        if minimum is not None and v < minimum:
            raise ProtocolError(self._p(key), f"must be >= {minimum}")
        return float(v)

    def opt_float(self, key: str) -> float | None:
        if self._get(key, None, False) is None:
            return None
        return self.float_(key, minimum=None)

    def bool_(self, key: str, *, required: bool = True, default: bool = False) -> bool:
        v = self._get(key, default, required)
        if not isinstance(v, bool):
            raise ProtocolError(self._p(key), "must be a boolean")
        return v

    def opt_bool(self, key: str) -> bool | None:
        if self._get(key, None, False) is None:
            return None
        return self.bool_(key)

    def choice(self, key: str, choices: frozenset[str]) -> str:
        v = self.str_(key)
        if v not in choices:
            raise ProtocolError(self._p(key), f"must be one of {sorted(choices)}")
        return v

    def list_(
        self, key: str, item: Callable[[object, str], T], *, required: bool = False
    ) -> list[T]:
        v = self._get(key, [], required)
        if not isinstance(v, list):
            raise ProtocolError(self._p(key), "must be a list")
        return [item(x, f"{self._p(key)}[{i}]") for i, x in enumerate(v)]

    def opt_list(self, key: str, item: Callable[[object, str], T]) -> list[T] | None:
        if self._get(key, None, False) is None:
            return None
        return self.list_(key, item)

    def str_map(self, key: str) -> dict[str, str]:
        v = self._get(key, {}, False)
        if not isinstance(v, Mapping) or not all(
            isinstance(k, str) and isinstance(x, str) for k, x in v.items()
        ):
            raise ProtocolError(self._p(key), "must be an object of strings")
        for k, x in v.items():
            self._nul(key, k + x, False)
        return dict(v)

    def int_map(self, key: str) -> dict[str, int]:
        v = self._get(key, {}, False)
        if not isinstance(v, Mapping) or not all(
            isinstance(k, str) and isinstance(x, int) and not isinstance(x, bool)
            for k, x in v.items()
        ):
            raise ProtocolError(self._p(key), "must be an object of integers")
        return dict(v)

    def version(self) -> None:
        v = self.int_("protocol_version", required=False, default=PROTOCOL_VERSION)
        if v != PROTOCOL_VERSION:
            raise ProtocolError(
                self._p("protocol_version"), f"unsupported version {v} (speaks {PROTOCOL_VERSION})"
            )


def _str_item(x: object, path: str) -> str:
    if not isinstance(x, str):
        raise ProtocolError(path, "must be a string")
    return x


def _int_item(x: object, path: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool):
        raise ProtocolError(path, "must be an integer")
    return x


def _port_item(x: object, path: str) -> int:
    port = _int_item(x, path)
    if not 1 <= port <= 65535:
        raise ProtocolError(path, "must be a TCP port 1..65535")
    return port


# --- GPU inventory and samples --------------------------------------------------------


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a GPU instance with its compute instance) of an NVIDIA GPU.

    ``uuid`` is the ``MIG-...`` UUID a container is pinned to; ``profile`` NVML's
    profile name (e.g. ``"1g.10gb"``), ``slices`` its share of the GPU's compute slices.
    """

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    slices: int
    memory_mib: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "gpu_instance_id": self.gpu_instance_id,
            "compute_instance_id": self.compute_instance_id,
            "profile": self.profile,
            "slices": self.slices,
            "memory_mib": self.memory_mib,
        }

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> MigDevice:
        r = _Reader(data, path)
        uuid = r.str_("uuid", max_len=64)
        if not uuid.startswith("MIG-"):
            raise ProtocolError(r._p("uuid"), "must be a MIG device UUID (MIG-...)")
        return cls(
            uuid=uuid,
            gpu_instance_id=r.int_("gpu_instance_id"),
            compute_instance_id=r.int_("compute_instance_id"),
            profile=r.str_("profile", required=False, max_len=64),
            slices=r.int_("slices", minimum=1, maximum=64),
            memory_mib=r.int_("memory_mib"),
        )


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as discovered at registration (static facts)."""

    uuid: str
    index: int
    model: str  # e.g. "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X"
    vendor: str  # "nvidia" | "amd" | "sim"
    memory_mib: int
    pci_bus_id: str | None = None  # sysfs form, lower case: "0000:3b:00.0"
    numa_node: int | None = None
    # GPUs with the same island id share a direct NVLink / NVSwitch / xGMI fabric.
    nvlink_island: int | None = None
    nvlink_peers: list[str] = field(default_factory=list)  # peer UUIDs with a direct link
    topology: dict[str, str] = field(default_factory=dict)  # peer UUID -> TOPOLOGY_LEVELS item
    mig_mode: bool | None = None  # None: not supported / unknown
    # The MIG devices of a GPU in MIG mode (optional key: an older agent sends none).
    mig_devices: list[MigDevice] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "model": self.model,
            "vendor": self.vendor,
            "memory_mib": self.memory_mib,
            "pci_bus_id": self.pci_bus_id,
            "numa_node": self.numa_node,
            "nvlink_island": self.nvlink_island,
            "nvlink_peers": list(self.nvlink_peers),
            "topology": dict(self.topology),
            "mig_mode": self.mig_mode,
            "mig_devices": [m.to_dict() for m in self.mig_devices],
        }

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> GpuInfo:
        r = _Reader(data, path)
        topology = r.str_map("topology")
        for peer, level in topology.items():
            if level not in TOPOLOGY_LEVELS:
                raise ProtocolError(
                    r._p(f"topology.{peer}"), f"must be one of {list(TOPOLOGY_LEVELS)}"
                )
        mig_devices = r.list_("mig_devices", MigDevice.from_dict)
        if len({m.uuid for m in mig_devices}) != len(mig_devices):
            raise ProtocolError(r._p("mig_devices"), "MIG device UUIDs must be unique")
        if mig_devices and r.opt_bool("mig_mode") is not True:
            raise ProtocolError(r._p("mig_devices"), "only a GPU in MIG mode has MIG devices")
        return cls(
            uuid=r.str_("uuid", max_len=64),
            index=r.int_("index", maximum=INT16_MAX),
            model=r.str_("model", max_len=200),
            vendor=r.str_("vendor", max_len=16),
            memory_mib=r.int_("memory_mib"),
            pci_bus_id=r.opt_str("pci_bus_id", max_len=32),
            numa_node=r.opt_int("numa_node", minimum=-INT16_MAX, maximum=INT16_MAX),
            nvlink_island=r.opt_int("nvlink_island", minimum=-INT16_MAX, maximum=INT16_MAX),
            nvlink_peers=r.list_("nvlink_peers", _str_item),
            topology=topology,
            mig_mode=r.opt_bool("mig_mode"),
            mig_devices=mig_devices,
        )


@dataclass(frozen=True)
class GpuSample:
    """One GPU's health and load at heartbeat time. ``None`` means "not supported here".

    ``healthy`` is False when the GPU is lost (fell off the bus) or reported a fatal XID;
    ``error`` then says why. Probe failures that do not make the GPU unusable leave
    ``healthy`` True and are listed in ``error``.
    """

    uuid: str
    healthy: bool = True
    error: str | None = None
    gpu_util: float | None = None  # percent 0..100
    mem_util: float | None = None  # percent 0..100 (memory controller busy, NVML semantics)
    mem_used_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_corrected: int | None = None  # volatile counts since driver load
    ecc_uncorrected: int | None = None
    xid_events: list[int] = field(default_factory=list)  # XID codes seen since the last sample

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "healthy": self.healthy,
            "error": self.error,
            "gpu_util": self.gpu_util,
            "mem_util": self.mem_util,
            "mem_used_mib": self.mem_used_mib,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "ecc_corrected": self.ecc_corrected,
            "ecc_uncorrected": self.ecc_uncorrected,
            "xid_events": list(self.xid_events),
        }

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> GpuSample:
        if type(data) is dict and cls is GpuSample:
            plain = _sample_plain(data)
            if plain is not None:
                return plain
        r = _Reader(data, path)
        return cls(
            uuid=r.str_("uuid"),
            healthy=r.bool_("healthy", required=False, default=True),
            error=r.opt_str("error", text=True),
            gpu_util=r.opt_float("gpu_util"),
            mem_util=r.opt_float("mem_util"),
            mem_used_mib=r.opt_int("mem_used_mib"),
            temperature_c=r.opt_float("temperature_c"),
            power_w=r.opt_float("power_w"),
            ecc_corrected=r.opt_int("ecc_corrected", maximum=INT64_MAX),
            ecc_uncorrected=r.opt_int("ecc_uncorrected", maximum=INT64_MAX),
            xid_events=r.list_("xid_events", _int_item),
        )


class _NotPlain(Exception):
    """A sample value the plain reading leaves to the generic reader."""


def _number(v: object) -> float | None:
    """A plain sample number, as `_Reader.opt_float` reads it."""
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    if v is None:
        return None
    raise _NotPlain


def _count(v: object, maximum: int) -> int | None:
    """A plain count, as `_Reader.opt_int` (no minimum) reads it."""
    if v is None:
        return None
    if type(v) is int and v <= maximum:
        return v
    raise _NotPlain


def _sample_plain(d: dict[str, Any]) -> GpuSample | None:
    """The common sample (an ASCII uuid, no error text, no XID events, plain numbers), read
    without the generic reader: every heartbeat carries one per GPU. None for anything else,
    which `GpuSample.from_dict` reads (and refuses) as it always did: the same values."""
    uuid, healthy, xids = d.get("uuid"), d.get("healthy"), d.get("xid_events")
    if (type(uuid) is not str or not uuid or not uuid.isascii() or "\x00" in uuid
            or not (healthy is None or type(healthy) is bool) or d.get("error") is not None
            or not (xids is None or (type(xids) is list and not xids))):
        return None
    try:
        return GpuSample(
            uuid=uuid, healthy=True if healthy is None else healthy, error=None,
            gpu_util=_number(d.get("gpu_util")), mem_util=_number(d.get("mem_util")),
            mem_used_mib=_count(d.get("mem_used_mib"), INT32_MAX),
            temperature_c=_number(d.get("temperature_c")), power_w=_number(d.get("power_w")),
            ecc_corrected=_count(d.get("ecc_corrected"), INT64_MAX),
            ecc_uncorrected=_count(d.get("ecc_uncorrected"), INT64_MAX),
            xid_events=[],
        )
    except _NotPlain:
        return None


# --- containers ------------------------------------------------------------------------


_VOLUME_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def _volume_name(x: object, path: str) -> str:
    v = _str_item(x, path)
    if not _VOLUME_NAME.match(v):
        raise ProtocolError(path, "must be a volume name (letters, digits, _ . -)")
    return v


@dataclass(frozen=True)
class Mount:
    """A persistent volume the container gets at ``path``: a Docker named volume (or the
    runtime's equivalent) called ``volume``, created on first use and kept after the
    container is gone. Added in protocol 1 as an optional field (an older agent ignores it
    and runs the container without the volume, so a control plane with volumes needs agents
    that know ``mounts``)."""

    volume: str
    path: str
    read_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"volume": self.volume, "path": self.path, "read_only": self.read_only}

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> Mount:
        r = _Reader(data, path)
        volume = _volume_name(r.str_("volume", max_len=128), r._p("volume"))
        where = r.str_("path", max_len=200)
        if not where.startswith("/") or where == "/" or ".." in where.split("/"):
            raise ProtocolError(r._p("path"), "must be an absolute path below /")
        return cls(volume=volume, path=where, read_only=r.bool_("read_only", required=False))


@dataclass(frozen=True)
class VolumeUsage:
    """A gpucloud volume on the host and the bytes it holds, as the runtime measured them."""

    volume: str
    used_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"volume": self.volume, "used_bytes": self.used_bytes}

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> VolumeUsage:
        r = _Reader(data, path)
        volume = _volume_name(r.str_("volume", max_len=128), r._p("volume"))
        return cls(volume=volume, used_bytes=r.int_("used_bytes", maximum=INT64_MAX))


@dataclass(frozen=True)
class VolumeMoveOrder:
    """Part of a volume's move between hosts: the source ``send``s a tar of ``volume`` in
    chunks to the control plane; once all arrived the target ``receive``s them, checks the
    size and SHA-256 and unpacks them into its own ``volume`` (docs/volumes.md)."""

    move_id: str
    volume: str
    role: str
    tenant_id: str = ""  # the label the target's copy gets
    # receive: what the source sent, checked before anything is unpacked
    size_bytes: int = 0
    sha256: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"move_id": self.move_id, "volume": self.volume, "role": self.role, "tenant_id": self.tenant_id,
                "size_bytes": self.size_bytes, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> VolumeMoveOrder:
        r = _Reader(data, path)
        move_id = r.str_("move_id", max_len=64)
        if not move_id.replace("-", "").isalnum():
            raise ProtocolError(r._p("move_id"), "must be an id (letters, digits, -)")
        volume = _volume_name(r.str_("volume", max_len=128), r._p("volume"))
        role = r.str_("role", max_len=16)
        if role not in VOLUME_MOVE_ROLES:
            raise ProtocolError(r._p("role"), f"must be one of {', '.join(VOLUME_MOVE_ROLES)}")
        tenant = r.opt_str("tenant_id", max_len=64) or ""
        size = r.int_("size_bytes", maximum=INT64_MAX, required=False)
        return cls(move_id=move_id, volume=volume, role=role, tenant_id=tenant, size_bytes=size,
                   sha256=r.opt_str("sha256", max_len=64) or "")


@dataclass(frozen=True)
class DesiredContainer:
    """One container the control plane wants on this host (an instance or a batch job).

    ``gpu_milli`` is the share of *each* GPU in ``gpu_uuids``: 1000 is a whole GPU, less
    is a fraction of a shared GPU. ``network`` is the tenant's bridge network name.

    Checkpoint-aware preemption (optional fields, sent only when set): a job that declared
    ``checkpoint_signal`` (one of ``CHECKPOINT_SIGNALS``) and ``checkpoint_grace_s`` gets,
    once it is under a preemption notice (``stop_by``, ISO 8601 UTC, its end), that signal
    from the agent at once, and is stopped ``checkpoint_grace_s`` later (or at ``stop_by``,
    whichever comes first) while it is still desired.
    """

    instance_id: str
    tenant_id: str
    kind: WorkloadKind
    image: str
    gpu_uuids: list[str] = field(default_factory=list)
    gpu_milli: int = 1000
    vcpus: float = 1.0
    memory_mib: int = 1024
    pids_limit: int = 4096
    network: str = ""
    command: list[str] = field(default_factory=list)  # empty: the image's default
    env: dict[str, str] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)  # container TCP ports to publish
    labels: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)  # persistent volumes (optional field)
    checkpoint_signal: str | None = None
    checkpoint_grace_s: int = 0
    stop_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "instance_id": self.instance_id,
            "tenant_id": self.tenant_id,
            "kind": self.kind,
            "image": self.image,
            "command": list(self.command),
            "env": dict(self.env),
            "ports": list(self.ports),
            "gpu_uuids": list(self.gpu_uuids),
            "gpu_milli": self.gpu_milli,
            "vcpus": self.vcpus,
            "memory_mib": self.memory_mib,
            "pids_limit": self.pids_limit,
            "network": self.network,
            "labels": dict(self.labels),
            "mounts": [m.to_dict() for m in self.mounts],
        }
        if self.checkpoint_signal is not None:
            out["checkpoint_signal"] = self.checkpoint_signal
            out["checkpoint_grace_s"] = self.checkpoint_grace_s
        if self.stop_by is not None:
            out["stop_by"] = self.stop_by
        return out

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> DesiredContainer:
        r = _Reader(data, path)
        gpu_milli = r.int_("gpu_milli", required=False, default=1000)
        if not 0 <= gpu_milli <= 1000:
            raise ProtocolError(r._p("gpu_milli"), "must be 0..1000")
        vcpus = r.float_("vcpus", required=False, default=1.0)
        if vcpus <= 0:
            raise ProtocolError(r._p("vcpus"), "must be > 0")
        signal = r.opt_str("checkpoint_signal")
        if signal is not None and signal not in CHECKPOINT_SIGNALS:
            raise ProtocolError(r._p("checkpoint_signal"), f"must be one of {sorted(CHECKPOINT_SIGNALS)}")
        return cls(
            instance_id=r.str_("instance_id"),
            tenant_id=r.str_("tenant_id"),
            kind=cast(WorkloadKind, r.choice("kind", WORKLOAD_KINDS)),
            image=r.str_("image"),
            command=r.list_("command", _str_item),
            env=r.str_map("env"),
            ports=r.list_("ports", _port_item),
            gpu_uuids=r.list_("gpu_uuids", _str_item),
            gpu_milli=gpu_milli,
            vcpus=vcpus,
            memory_mib=r.int_("memory_mib", required=False, default=1024, minimum=4),
            pids_limit=r.int_("pids_limit", required=False, default=4096, minimum=1),
            network=r.str_("network", required=False, default=""),
            labels=r.str_map("labels"),
            mounts=r.list_("mounts", Mount.from_dict),
            checkpoint_signal=signal,
            checkpoint_grace_s=r.int_("checkpoint_grace_s", required=False, default=0,
                                      maximum=CHECKPOINT_GRACE_MAX_S),
            stop_by=r.opt_str("stop_by", max_len=64),
        )


# Failed starts in a row of one container before the agent gives up (the control plane's
# WORKLOAD_START_ATTEMPTS, sent in every answer; this is the default of an answer without it).
DEFAULT_START_ATTEMPTS: Final = 3


@dataclass(frozen=True)
class ObservedContainer:
    """A gpucloud container as the runtime sees it (or, for ``missing``, as it failed to).

    ``missing``: desired but not present on the host; ``error`` says why (e.g. the image
    could not be pulled). Times are ISO 8601 UTC strings. ``host_ports`` maps a published
    container port (as a string, JSON keys are strings) to its port on the host.

    Optional (sent only when set; an older agent sends none): ``start_attempts``, the failed
    starts in a row of a desired container, with ``error`` the last one's message (the agent
    gives up at ``HeartbeatResponse.start_attempts``); ``restarts``, how many times the agent
    saw the container start again without its order (``docker restart`` behind its back);
    ``note``, what the agent saw that the owner should read: a container gone or restarted
    without its order, or a stand-in image run in place of the one asked for.
    """

    instance_id: str
    state: ContainerState
    container_id: str | None = None
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None
    host_ports: dict[str, int] = field(default_factory=dict)
    start_attempts: int = 0
    restarts: int = 0
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "instance_id": self.instance_id,
            "container_id": self.container_id,
            "state": self.state,
            "exit_code": self.exit_code,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "error": self.error,
            "host_ports": dict(self.host_ports),
        }
        if self.start_attempts:
            out["start_attempts"] = self.start_attempts
        if self.restarts:
            out["restarts"] = self.restarts
        if self.note is not None:
            out["note"] = self.note
        return out

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> ObservedContainer:
        if type(data) is dict and cls is ObservedContainer:
            plain = _container_plain(data)
            if plain is not None:
                return plain
        r = _Reader(data, path)
        return cls(
            instance_id=r.str_("instance_id"),
            container_id=r.opt_str("container_id"),
            state=cast(ContainerState, r.choice("state", CONTAINER_STATES)),
            exit_code=r.opt_int("exit_code"),
            started_at=r.opt_str("started_at"),
            finished_at=r.opt_str("finished_at"),
            error=r.opt_str("error", text=True),
            host_ports=r.int_map("host_ports"),
            start_attempts=r.int_("start_attempts", required=False, default=0, maximum=1_000_000),
            restarts=r.int_("restarts", required=False, default=0, maximum=1_000_000),
            note=r.opt_str("note", text=True, max_len=NOTE_MAX_CHARS),
        )


def _id_text(v: object) -> str | None:
    """A plain optional id or time (ASCII, no NUL), as `_Reader.opt_str` reads it."""
    if v is None:
        return None
    if type(v) is str and v.isascii() and "\x00" not in v:
        return v
    raise _NotPlain


# The keys of a container report without the optional fields (`ObservedContainer.to_dict`).
_PLAIN_KEYS: Final = 8
# The most of an agent's note the control plane reads (a workload's reason holds 500).
NOTE_MAX_CHARS: Final = 400


def _container_plain(d: dict[str, Any]) -> ObservedContainer | None:
    """The common container report (ASCII ids and times, a known state, no error text, no
    published ports), read without the generic reader, as `_sample_plain`. None for anything
    else, which `ObservedContainer.from_dict` reads (and refuses) as it always did."""
    iid, state, ports = d.get("instance_id"), d.get("state"), d.get("host_ports")
    if (type(iid) is not str or not iid or type(state) is not str or state not in CONTAINER_STATES
            or d.get("error") is not None or not (ports is None or (type(ports) is dict and not ports))
            or len(d) > _PLAIN_KEYS):  # the optional fields: the generic reader
        return None
    try:
        return ObservedContainer(
            instance_id=cast(str, _id_text(iid)), state=cast(ContainerState, state),
            container_id=_id_text(d.get("container_id")), exit_code=_count(d.get("exit_code"), INT32_MAX),
            started_at=_id_text(d.get("started_at")), finished_at=_id_text(d.get("finished_at")),
            error=None, host_ports={},
        )
    except _NotPlain:
        return None


# --- logs ------------------------------------------------------------------------------

# The most of one container's log tail a heartbeat carries (the newest part is kept).
LOG_TAIL_MAX_LINES: Final = 10_000
LOG_TAIL_MAX_CHARS: Final = 256 * 1024
# The most all log tails of one heartbeat may take as JSON. Non-ASCII text is escaped
# (a tqdm bar's "\u2588" is 6 bytes a character), so 256 Ki characters can be 1.5 MB;
# a heartbeat must stay well under the control plane's request limit (MAX_REQUEST_BODY_BYTES,
# 4 MiB by default; it was Django's 2.5 MB when this budget was set), or it would
# be refused again and again and the host go DOWN. Tails past the budget go in the next
# heartbeats (the control plane keeps asking until they arrive).
HEARTBEAT_LOGS_MAX_BYTES: Final = 1024 * 1024
# The tail an agent sends unasked when a container exits, so a finished job's last
# output stays readable after its container is removed.
FINAL_TAIL_LINES: Final = 200


@dataclass(frozen=True)
class LogsRequest:
    """The control plane wants the last ``tail`` lines of a container's log (it cannot call
    the agent, so it asks in a heartbeat answer and gets them in the next heartbeat)."""

    instance_id: str
    tail: int = 100

    def to_dict(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "tail": self.tail}

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> LogsRequest:
        r = _Reader(data, path)
        tail = r.int_("tail", required=False, default=100, minimum=1)
        if tail > LOG_TAIL_MAX_LINES:
            raise ProtocolError(r._p("tail"), f"must be <= {LOG_TAIL_MAX_LINES}")
        return cls(instance_id=r.str_("instance_id"), tail=tail)


@dataclass(frozen=True)
class ContainerLogTail:
    """The answer to a ``LogsRequest``: the log's last lines (empty if no such container),
    at most ``LOG_TAIL_MAX_CHARS`` (``truncated`` then says the start was cut)."""

    instance_id: str
    text: str = ""
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "text": self.text, "truncated": self.truncated}

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> ContainerLogTail:
        r = _Reader(data, path)
        text = r.str_("text", required=False, default="", text=True)
        if len(text) > LOG_TAIL_MAX_CHARS:
            raise ProtocolError(r._p("text"), f"must be at most {LOG_TAIL_MAX_CHARS} characters")
        return cls(
            instance_id=r.str_("instance_id"),
            text=text,
            truncated=r.bool_("truncated", required=False, default=False),
        )


def json_size(text: str) -> int:
    """Bytes ``text`` takes in a JSON body as the agent's client writes it (ASCII-escaped)."""
    return len(json.dumps(text))


def clip_log(
    text: str, max_chars: int = LOG_TAIL_MAX_CHARS, max_bytes: int | None = None
) -> tuple[str, bool]:
    """The newest part of ``text`` of at most ``max_chars`` characters and, when given,
    ``max_bytes`` bytes of JSON; and whether anything was cut."""
    cut = len(text) > max_chars
    if cut:
        text = text[-max_chars:]
    if max_bytes is None or json_size(text) <= max_bytes:
        return text, cut
    lo, hi = 0, len(text)  # the longest suffix that fits: escaping varies per character
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if json_size(text[-mid:]) <= max_bytes:
            lo = mid
        else:
            hi = mid - 1
    return text[len(text) - lo :], True


# --- messages ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisterRequest:
    """First contact: a one-time bootstrap token plus what this host has."""

    bootstrap_token: str
    hostname: str
    agent_version: str
    gpu_backend: str  # "nvml" | "amdsmi" | "sim"
    runtime: str  # "docker" | "sim"
    cpu_count: int
    memory_mib: int
    gpus: list[GpuInfo] = field(default_factory=list)
    # The host token this machine held before (optional): its proof that it is the host
    # already registered under ``hostname``. Without it (or an operator's "replace host")
    # a registration naming an existing host is refused, whatever the bootstrap token.
    previous_host_token: str | None = None
    # A random secret the agent picks once for a sequence of attempts with one bootstrap
    # token (kept on disk until it holds its host credentials). An attempt whose answer
    # was lost after the control plane consumed the token is repeated with the same nonce
    # and gets the same host again (a fresh host token) within REGISTER_RETRY_WINDOW_S.
    registration_nonce: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "protocol_version": PROTOCOL_VERSION,
            "bootstrap_token": self.bootstrap_token,
            "hostname": self.hostname,
            "agent_version": self.agent_version,
            "gpu_backend": self.gpu_backend,
            "runtime": self.runtime,
            "cpu_count": self.cpu_count,
            "memory_mib": self.memory_mib,
            "gpus": [g.to_dict() for g in self.gpus],
        }
        if self.previous_host_token:
            out["previous_host_token"] = self.previous_host_token
        if self.registration_nonce:
            out["registration_nonce"] = self.registration_nonce
        return out

    @classmethod
    def from_dict(cls, data: object) -> RegisterRequest:
        r = _Reader(data, "")
        r.version()
        gpus = r.list_("gpus", GpuInfo.from_dict)
        if len({g.uuid for g in gpus}) != len(gpus):
            raise ProtocolError("gpus", "GPU UUIDs must be unique")
        return cls(
            bootstrap_token=r.str_("bootstrap_token"),
            hostname=_host_name(r.str_("hostname", max_len=HOST_NAME_MAX_LEN + 64)),  # + room to strip
            agent_version=r.str_("agent_version", max_len=50),
            gpu_backend=r.str_("gpu_backend"),
            runtime=r.str_("runtime"),
            cpu_count=r.int_("cpu_count", minimum=1),
            memory_mib=r.int_("memory_mib", minimum=1, maximum=INT64_MAX),
            gpus=gpus,
            previous_host_token=r.opt_str("previous_host_token", max_len=200) or None,
            registration_nonce=_nonce(r.opt_str("registration_nonce", max_len=200)),
        )


def _host_name(v: str) -> str:
    try:
        return host_name_normalise(v)
    except ValueError as e:
        raise ProtocolError("hostname", str(e)) from None


def _nonce(v: str | None) -> str | None:
    """A registration nonce: absent, or a secret long enough not to be guessed."""
    if v and len(v) < REGISTRATION_NONCE_MIN_LEN:
        raise ProtocolError(
            "registration_nonce", f"must be at least {REGISTRATION_NONCE_MIN_LEN} characters"
        )
    return v or None


@dataclass(frozen=True)
class RegisterResponse:
    host_id: str
    host_token: str
    heartbeat_interval_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol_version": PROTOCOL_VERSION,
            "host_id": self.host_id,
            "host_token": self.host_token,
            "heartbeat_interval_s": self.heartbeat_interval_s,
        }

    @classmethod
    def from_dict(cls, data: object) -> RegisterResponse:
        r = _Reader(data, "")
        r.version()
        interval = r.float_("heartbeat_interval_s")
        if interval <= 0:
            raise ProtocolError("heartbeat_interval_s", "must be > 0")
        return cls(
            host_id=r.str_("host_id"),
            host_token=r.str_("host_token"),
            heartbeat_interval_s=interval,
        )


@dataclass(frozen=True)
class Heartbeat:
    """Periodic report. ``containers`` is None when the runtime could not be listed this
    time: the control plane must then infer nothing about containers (an empty list, by
    contrast, means "none are running")."""

    host_id: str
    seq: int  # increments per heartbeat since agent start; lets the server drop reordered ones
    gpus: list[GpuSample] = field(default_factory=list)
    containers: list[ObservedContainer] | None = field(default_factory=list)
    agent_version: str = ""
    # Answers to the previous answer's ``logs_requests`` (optional; absent = none).
    logs: list[ContainerLogTail] = field(default_factory=list)
    # The host's gpucloud volumes and their usage, when measured this time (optional; None =
    # not measured: every few minutes, measuring walks the volumes' files).
    volumes: list[VolumeUsage] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol_version": PROTOCOL_VERSION,
            "host_id": self.host_id,
            "seq": self.seq,
            "agent_version": self.agent_version,
            "gpus": [g.to_dict() for g in self.gpus],
            "containers": None
            if self.containers is None
            else [c.to_dict() for c in self.containers],
            "logs": [t.to_dict() for t in self.logs],
            "volumes": None if self.volumes is None else [v.to_dict() for v in self.volumes],
        }

    @classmethod
    def from_dict(cls, data: object) -> Heartbeat:
        r = _Reader(data, "")
        r.version()
        return cls(
            host_id=r.str_("host_id"),
            seq=r.int_("seq", maximum=INT64_MAX),
            agent_version=r.str_("agent_version", required=False),
            gpus=r.list_("gpus", GpuSample.from_dict),
            containers=r.opt_list("containers", ObservedContainer.from_dict),
            logs=r.list_("logs", ContainerLogTail.from_dict),
            volumes=r.opt_list("volumes", VolumeUsage.from_dict),
        )


@dataclass(frozen=True)
class HeartbeatResponse:
    """The whole desired set for this host (not a delta: the agent converges to it).

    ``host_token``, when set, replaces the agent's token from the next request on.
    """

    desired: list[DesiredContainer]
    heartbeat_interval_s: float
    host_token: str | None = None
    # Log tails wanted in the next heartbeat (optional; an older agent ignores them).
    logs_requests: list[LogsRequest] = field(default_factory=list)
    # The version of the host's desired state this answer was read at, where the control
    # plane holds long polls (``WaitRequest``); None: it does not, wait out the interval.
    desired_version: str | None = None
    # Volumes to delete with their data (deleted by their owner, past the purge grace; optional):
    # the agent removes each that no container uses and stops reporting it.
    remove_volumes: list[str] = field(default_factory=list)
    # Volume moves this host takes part in (optional; an older agent ignores them and the
    # move waits until an operator cancels it).
    volume_moves: list[VolumeMoveOrder] = field(default_factory=list)
    # The failed starts in a row after which the agent stops trying a desired container
    # (optional; the control plane fails the workload at the same count).
    start_attempts: int = DEFAULT_START_ATTEMPTS

    def to_dict(self) -> dict[str, Any]:
        out = {
            "protocol_version": PROTOCOL_VERSION,
            "start_attempts": self.start_attempts,
            "desired": [d.to_dict() for d in self.desired],
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "host_token": self.host_token,
            "logs_requests": [q.to_dict() for q in self.logs_requests],
            "remove_volumes": list(self.remove_volumes),
            "volume_moves": [m.to_dict() for m in self.volume_moves],
        }
        if self.desired_version is not None:
            out["desired_version"] = self.desired_version
        return out

    @classmethod
    def from_dict(cls, data: object) -> HeartbeatResponse:
        r = _Reader(data, "")
        r.version()
        desired = r.list_("desired", DesiredContainer.from_dict, required=True)
        if len({d.instance_id for d in desired}) != len(desired):
            raise ProtocolError("desired", "instance ids must be unique")
        interval = r.float_("heartbeat_interval_s")
        if interval <= 0:
            raise ProtocolError("heartbeat_interval_s", "must be > 0")
        token = r.opt_str("host_token")
        return cls(
            desired=desired,
            heartbeat_interval_s=interval,
            host_token=token or None,
            logs_requests=r.list_("logs_requests", LogsRequest.from_dict),
            desired_version=r.opt_str("desired_version", max_len=64),
            remove_volumes=r.list_("remove_volumes", _volume_name),
            volume_moves=r.list_("volume_moves", VolumeMoveOrder.from_dict),
            start_attempts=r.int_("start_attempts", required=False, default=DEFAULT_START_ATTEMPTS,
                                  minimum=1, maximum=100),
        )


@dataclass(frozen=True)
class WaitRequest:
    """Answer when the desired state of ``host_id`` is past ``version``, or after ``timeout_s``."""

    host_id: str
    version: str
    timeout_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol_version": PROTOCOL_VERSION,
            "host_id": self.host_id,
            "version": self.version,
            "timeout_s": self.timeout_s,
        }

    @classmethod
    def from_dict(cls, data: object) -> WaitRequest:
        r = _Reader(data, "")
        r.version()
        timeout = r.float_("timeout_s")
        if timeout > WAIT_MAX_S:
            raise ProtocolError("timeout_s", f"must be <= {WAIT_MAX_S:g}")
        return cls(
            host_id=r.str_("host_id"),
            version=r.str_("version", empty=True, max_len=64),
            timeout_s=timeout,
        )


@dataclass(frozen=True)
class WaitResponse:
    """``changed``: the desired state moved (heartbeat now); false: the wait timed out."""

    changed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"protocol_version": PROTOCOL_VERSION, "changed": self.changed}

    @classmethod
    def from_dict(cls, data: object) -> WaitResponse:
        r = _Reader(data, "")
        r.version()
        return cls(changed=r.bool_("changed"))
