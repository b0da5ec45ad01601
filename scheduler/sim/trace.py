"""Trace and cluster parsers for the simulator: three trace formats in, plain
``Job`` and ``Node`` records out. Pure Python, no Django.

Formats (see docs/simulator.md):

* ``generic`` CSV: ``job_id, submit_time, duration, num_gpus, gpu_milli, nodes,
  gpu_model, tenant, priority, billing`` (only the first four are required);
* ``philly``: the Pollux/Sia reduction of the Philly trace
  (``timestamp, duration, num_gpus, gpu_time, cluster``), the VC as tenant;
* ``alibaba-openb``: the Alibaba 2023 GPU-sharing pod list
  (``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, ...``).

Clusters: ``NxG:MODEL[,NxG:MODEL...]``, a CSV of nodes
(``node_id, gpu_model, num_gpus, nvlink_groups[, vcpus, memory_mib, region]``),
or the openb node list (``sn, cpu_milli, memory_mib, gpu, model``).
"""

from __future__ import annotations

import csv
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

WHOLE = 1000
PRIORITIES = ("critical", "standard", "low")
BILLINGS = ("on_demand", "spot")
#: openb qos label -> our class. Guaranteed and latency-sensitive pods are
#: critical, Burstable standard, best-effort low (and spot).
QOS_CLASS = {"Guaranteed": "critical", "LS": "critical", "Burstable": "standard", "BE": "low"}


class TraceError(ValueError):
    """A trace or cluster file we cannot read; the message names the line."""


@dataclass(slots=True)
class Job:
    job_id: str
    submit: float
    duration: float  # seconds of run time on the requested GPUs (inf = never ends)
    gpus_per_node: int  # 0 = a fractional share of one GPU
    gpu_milli: int = WHOLE
    nodes: int = 1
    gpu_model: str = ""  # "" = the cluster's default model
    tenant: str = "default"
    priority: str = "standard"
    billing: str = "on_demand"
    vcpus: int = 0
    memory_mib: int = 0
    region: str | None = None  # a partition; None = anywhere

    @property
    def gpus(self) -> float:
        """GPUs the job holds, a share counting as its fraction."""
        per = self.gpu_milli / WHOLE if self.gpus_per_node == 0 else self.gpus_per_node
        return per * self.nodes


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    gpu_model: str
    num_gpus: int
    nvlink_groups: int = 1
    vcpus: int = 0
    memory_mib: int = 0
    region: str = "r1"
    # shares of several tenants may mix on its GPUs (MIG, or the operator's choice per
    # GPU model); otherwise a GPU's shares go to one tenant at a time, as in the live loop
    cross_tenant: bool = False


def _rows(path: str | Path) -> Iterable[tuple[int, dict[str, str]]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise TraceError(f"{path}: empty file")
        reader.fieldnames = [f.strip() for f in reader.fieldnames]
        for n, row in enumerate(reader, start=2):
            if not any((v or "").strip() for v in row.values()):
                continue  # trailing empty line
            yield n, {k: (v or "").strip() for k, v in row.items() if k is not None}


def _need(path: str | Path, n: int, row: dict[str, str], col: str) -> str:
    v = row.get(col, "")
    if v == "":
        raise TraceError(f"{path}:{n}: missing {col}")
    return v


def shape(num_gpus: int, gpu_milli: int, gpus_per_node: int) -> tuple[int, int, int]:
    """(gpus_per_node, gpu_milli, nodes) for ``num_gpus`` GPUs on hosts of
    ``gpus_per_node``: a share below 1000 milli is fractional; larger jobs are a
    gang of the fewest hosts, GPUs spread evenly (12 on 8-GPU hosts: 2 x 6)."""
    if gpu_milli < WHOLE:
        return 0, gpu_milli, 1
    if num_gpus <= gpus_per_node:
        return num_gpus, WHOLE, 1
    nodes = math.ceil(num_gpus / gpus_per_node)
    return math.ceil(num_gpus / nodes), WHOLE, nodes


# ---------------------------------------------------------------------------- traces


def read_generic(path: str | Path) -> list[Job]:
    jobs = []
    for n, row in _rows(path):
        try:
            g = int(_need(path, n, row, "num_gpus"))
            milli = int(row.get("gpu_milli") or WHOLE)
            nodes = int(row.get("nodes") or 1)
            prio = row.get("priority") or "standard"
            billing = row.get("billing") or "on_demand"
            if prio not in PRIORITIES:
                raise TraceError(f"{path}:{n}: priority must be one of {', '.join(PRIORITIES)}")
            if billing not in BILLINGS:
                raise TraceError(f"{path}:{n}: billing must be one of {', '.join(BILLINGS)}")
            if milli < WHOLE and (g != 1 or nodes != 1):
                raise TraceError(f"{path}:{n}: a fractional share needs num_gpus=1 and nodes=1")
            jobs.append(
                Job(
                    job_id=_need(path, n, row, "job_id"),
                    submit=float(_need(path, n, row, "submit_time")),
                    duration=float(_need(path, n, row, "duration")),
                    gpus_per_node=0 if milli < WHOLE else g,
                    gpu_milli=milli,
                    nodes=nodes,
                    gpu_model=row.get("gpu_model", ""),
                    tenant=row.get("tenant") or "default",
                    priority=prio,
                    billing=billing,
                )
            )
        except ValueError as e:
            if isinstance(e, TraceError):
                raise
            raise TraceError(f"{path}:{n}: {e}") from None
    return jobs


def read_philly(
    path: str | Path,
    *,
    gpus_per_node: int = 8,
    start: str | None = None,
    end: str | None = None,
    tenants: Iterable[str] | None = None,
) -> list[Job]:
    """Philly jobs submitted in [start, end) (ISO dates), optionally only some VCs.
    Submit times become seconds since the first kept job; job ids are the row
    numbers (the file has none)."""
    lo = datetime.fromisoformat(start) if start else None
    hi = datetime.fromisoformat(end) if end else None
    keep = set(tenants) if tenants is not None else None
    raw: list[tuple[datetime, int, float, int, str]] = []
    for n, row in _rows(path):
        try:
            ts = datetime.fromisoformat(_need(path, n, row, "timestamp"))
            dur = float(_need(path, n, row, "duration"))
            g = int(float(_need(path, n, row, "num_gpus")))
        except ValueError as e:
            raise TraceError(f"{path}:{n}: {e}") from None
        vc = row.get("cluster") or "default"
        if (lo and ts < lo) or (hi and ts >= hi) or (keep is not None and vc not in keep):
            continue
        raw.append((ts, n, dur, g, vc))
    raw.sort()  # the file is not sorted
    if not raw:
        return []
    t0 = raw[0][0]
    jobs = []
    for ts, n, dur, g, vc in raw:
        per, milli, nodes = shape(g, WHOLE, gpus_per_node)
        jobs.append(
            Job(
                job_id=f"p{n}",
                submit=(ts - t0).total_seconds(),
                duration=dur,
                gpus_per_node=per,
                gpu_milli=milli,
                nodes=nodes,
                tenant=vc,
            )
        )
    return jobs


def read_openb(
    path: str | Path,
    *,
    inflate: float = 0.0,
    capacity_gpus: float = 0.0,
    seed: int = 0,
    departures: bool = False,
    setup: str = "trace",
) -> list[Job]:
    """The openb pod list. The file's lifetimes are not job lengths (a snapshot of
    the last window), so by default pods never end, as in the FGD experiments.

    ``setup="trace"``: GPU pods only, in creation order, the qos label as tenant
    and class; ``inflate`` (e.g. 1.3) appends GPU pods sampled with replacement
    (seeded) until the requested GPUs reach ``inflate x capacity_gpus``.

    ``setup="fgd"``: FGD's own experiment (Weng et al.'s simulator,
    ``--shuffle-pod=true -tune 1.3 -tuneseed SEED``): every pod, the GPU-less ones
    too (vCPUs and memory only), one tenant and one class, the file shuffled
    (seeded) and arriving one a second; ``inflate`` then appends pods sampled
    from the whole file until the next one would take the demand past
    ``inflate x capacity_gpus`` (FGD compares the sample's per-GPU milli)."""
    if setup not in ("trace", "fgd"):
        raise TraceError(f"unknown openb setup {setup!r} (trace, fgd)")
    fgd = setup == "fgd"
    pods: list[Job] = []
    for n, row in _rows(path):
        try:
            g = int(_need(path, n, row, "num_gpu"))
            milli = int(row.get("gpu_milli") or WHOLE)
            created = float(_need(path, n, row, "creation_time"))
            deleted = float(row.get("deletion_time") or "inf")
            cpu = int(float(row.get("cpu_milli") or 0))
            mem = int(float(row.get("memory_mib") or 0))
        except ValueError as e:
            raise TraceError(f"{path}:{n}: {e}") from None
        if g == 0 and not fgd:
            continue
        qos = "default" if fgd else row.get("qos", "")
        prio = "standard" if fgd else QOS_CLASS.get(qos, "standard")
        if g == 0:
            per, m, nodes = 0, 0, 1  # no GPU: vCPUs and memory only
        elif g == 1 and milli < WHOLE:
            per, m, nodes = 0, milli, 1
        else:
            per, m, nodes = g, WHOLE, 1
        pods.append(
            Job(
                job_id=_need(path, n, row, "name"),
                submit=created,
                duration=(deleted - created) if departures else math.inf,
                gpus_per_node=per,
                gpu_milli=m,
                nodes=nodes,
                gpu_model=row.get("gpu_spec", ""),
                tenant=qos or "default",
                priority=prio,
                billing="spot" if prio == "low" else "on_demand",
                vcpus=cpu,
                memory_mib=mem,
            )
        )
    if fgd:
        return _fgd_order(pods, inflate, capacity_gpus, seed)
    pods.sort(key=lambda j: (j.submit, j.job_id))
    if inflate > 0 and capacity_gpus > 0 and pods:
        rng = random.Random(seed)
        demand = sum(j.gpus for j in pods)
        t = pods[-1].submit
        base = list(pods)
        i = 0
        while demand < inflate * capacity_gpus:
            src = rng.choice(base)
            t += 1.0
            i += 1
            pods.append(replace(src, job_id=f"{src.job_id}-x{i}", submit=t))
            demand += src.gpus
    return pods


def _fgd_order(pods: list[Job], inflate: float, capacity_gpus: float, seed: int) -> list[Job]:
    """FGD's arrival sequence: the pods by name, shuffled, then the tuning samples."""
    rng = random.Random(seed)
    base = sorted(pods, key=lambda j: j.job_id)
    seq = list(base)
    rng.shuffle(seq)
    if inflate > 0 and capacity_gpus > 0 and base:
        target = inflate * capacity_gpus * WHOLE
        demand = sum(round(j.gpus * WHOLE) for j in seq)
        i = 0
        while True:
            src = rng.choice(base)
            per = src.gpu_milli if src.gpus_per_node == 0 else WHOLE if src.gpus_per_node else 0
            if demand + per > target:
                break
            i += 1
            seq.append(replace(src, job_id=f"{src.job_id}-x{i}"))
            demand += round(src.gpus * WHOLE)
    return [replace(j, submit=float(n)) for n, j in enumerate(seq)]


def fgd_node_order(nodes: Sequence[Node], seed: int) -> list[Node]:
    """FGD's tie-break: its simulator prefixes every node name with a seeded random
    permutation index (``0042-openb-node-...``) and its scheduler gives equal scores
    to the smallest name. Our core gives them to the smallest host id, so the same
    renaming gives the same rule."""
    rng = random.Random(seed + 1_000_003)
    ordered = sorted(nodes, key=lambda n: n.node_id)
    perm = list(range(len(ordered)))
    rng.shuffle(perm)
    w = max(4, len(str(len(ordered))))
    return [replace(n, node_id=f"{perm[i]:0{w}d}-{n.node_id}") for i, n in enumerate(ordered)]


def read_trace(path: str | Path, fmt: str, **kw: object) -> list[Job]:
    if fmt == "generic":
        return read_generic(path)
    if fmt == "philly":
        return read_philly(path, **kw)  # type: ignore[arg-type]
    if fmt == "alibaba-openb":
        return read_openb(path, **kw)  # type: ignore[arg-type]
    raise TraceError(f"unknown trace format {fmt!r} (generic, philly, alibaba-openb)")


# --------------------------------------------------------------------------- clusters

_SPEC = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*:\s*([\w.+-]+)\s*$")


def parse_cluster_spec(spec: str, *, region: str = "r1", prefix: str = "h") -> list[Node]:
    """``NxG:MODEL[,NxG:MODEL...]``: N hosts of G GPUs of MODEL, one NVLink island each."""
    nodes: list[Node] = []
    parts = [p for p in spec.split(",") if p.strip()]
    if not parts:
        raise TraceError("empty cluster spec")
    for part in parts:
        m = _SPEC.match(part)
        if not m:
            raise TraceError(f"bad cluster spec {part!r}; expected NxG:MODEL, e.g. 64x8:H100")
        count, gpus, model = int(m.group(1)), int(m.group(2)), m.group(3)
        if count < 1 or gpus < 1:
            raise TraceError(f"bad cluster spec {part!r}: counts must be positive")
        base = len(nodes)
        nodes.extend(
            Node(f"{prefix}{base + i:05d}", model, gpus, 1, region=region) for i in range(count)
        )
    return nodes


def read_cluster_csv(path: str | Path, *, single_model: str | None = None) -> list[Node]:
    """A node CSV: ours (``node_id, gpu_model, num_gpus, nvlink_groups``, optional
    ``vcpus, memory_mib, region, cross_tenant``) or the openb node list (``sn, cpu_milli,
    memory_mib, gpu, model``; vCPUs are kept in milli-cores). GPU-less nodes are
    skipped. ``single_model`` names every GPU one model (openb pods ask for none)."""
    nodes = []
    for n, row in _rows(path):
        try:
            if "sn" in row:
                g = int(row.get("gpu") or 0)
                node = Node(
                    row["sn"],
                    single_model or row.get("model", ""),
                    g,
                    1,
                    int(float(row.get("cpu_milli") or 0)),
                    int(float(row.get("memory_mib") or 0)),
                )
            else:
                g = int(_need(path, n, row, "num_gpus"))
                node = Node(
                    _need(path, n, row, "node_id"),
                    single_model or _need(path, n, row, "gpu_model"),
                    g,
                    int(row.get("nvlink_groups") or 1),
                    int(row.get("vcpus") or 0),
                    int(row.get("memory_mib") or 0),
                    row.get("region") or "r1",
                    (row.get("cross_tenant") or "").strip().lower() in ("1", "true", "yes"),
                )
        except ValueError as e:
            raise TraceError(f"{path}:{n}: {e}") from None
        if g > 0:
            nodes.append(node)
    if not nodes:
        raise TraceError(f"{path}: no GPU nodes")
    return nodes


def read_cluster(spec: str, **kw: object) -> list[Node]:
    """A spec string, or a path to a node CSV."""
    if Path(spec).is_file():
        return read_cluster_csv(spec, **kw)  # type: ignore[arg-type]
    return parse_cluster_spec(spec)


def read_partitions(path: str | Path) -> dict[str, int]:
    """``tenant,nodes`` (the Helios ``vc,node num`` header is accepted too)."""
    out: dict[str, int] = {}
    for n, row in _rows(path):
        vals = list(row.values())
        tenant = row.get("tenant") or row.get("vc") or (vals[0] if vals else "")
        nodes = row.get("nodes") or row.get("node num") or (vals[1] if len(vals) > 1 else "")
        if not tenant or not nodes:
            raise TraceError(f"{path}:{n}: expected tenant,nodes")
        out[tenant] = int(nodes)
    return out
