"""Command line for the simulator, shared by ``python -m scheduler.sim`` and
``manage.py simulate`` (a thin wrapper)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from scheduler.core import PLACEMENTS, POLICIES, get_policy

from .engine import Simulator
from .report import plot, summarize, write_jobs_csv
from .trace import (
    Node,
    TraceError,
    fgd_node_order,
    read_cluster,
    read_partitions,
    read_trace,
)

#: the simulator's default per-cycle depth cap (docs/simulator.md measures it)
DEFAULT_DEPTH = 16


def scale_partitions(parts: dict[str, int], total: int) -> dict[str, int]:
    """Node counts scaled to ``total`` nodes, proportionally (largest remainder,
    ties by tenant), each partition keeping at least one node."""
    if total < len(parts):
        raise TraceError(f"--scale-partitions {total} is fewer nodes than {len(parts)} partitions")
    have = sum(parts.values())
    exact = {t: n * total / have for t, n in parts.items()}
    out = {t: max(1, int(x)) for t, x in exact.items()}
    left = total - sum(out.values())
    for t in sorted(parts, key=lambda t: (-(exact[t] - int(exact[t])), t)):
        if left <= 0:
            break
        out[t] += 1
        left -= 1
    while left < 0:  # the at-least-one rule overshot: take from the largest
        t = max(out, key=lambda t: (out[t], t))
        out[t] -= 1
        left += 1
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="trace file")
    p.add_argument("--format", default="generic", choices=("generic", "philly", "alibaba-openb"))
    p.add_argument(
        "--cluster", default="", help="NxG:MODEL[,...] or a node CSV (openb node lists too)"
    )
    p.add_argument("--policy", default="gpucloud", choices=sorted(POLICIES))
    p.add_argument("--placement", default=None, choices=sorted(PLACEMENTS))
    p.add_argument("--mode", default=None, choices=("static", "dynamic", "hybrid"))
    p.add_argument("--partitions", default=None, help="CSV tenant,nodes: one partition per tenant")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per partition node (8)")
    p.add_argument("--model", default="V100", help="GPU model of partition nodes")
    p.add_argument(
        "--lend",
        action="store_true",
        help="with --partitions: one shared pool, partitions become guaranteed "
        "quotas that lend idle capacity (reclaimed by preemption with notice)",
    )
    p.add_argument(
        "--scale-partitions",
        type=int,
        default=0,
        metavar="NODES",
        help="with --partitions: scale the node counts to this total (largest remainder, "
        "at least 1 node each), e.g. 80 for the 80x8 contention scenario",
    )
    p.add_argument("--notice", type=float, default=None, help="preemption notice seconds")
    p.add_argument(
        "--checkpoint-fraction",
        type=float,
        default=1.0,
        help="fraction of jobs (chosen by a hash of the job id) that checkpoint: a "
        "preempted one resumes, the others restart from scratch (1.0)",
    )
    p.add_argument(
        "--depth",
        type=int,
        default=DEFAULT_DEPTH,
        help="per-cycle depth cap: requests that may fail to start in one plan before the "
        f"rest of the queue waits unexamined ({DEFAULT_DEPTH}; 0 = no cap, the slow path)",
    )
    p.add_argument("--start", default=None, help="philly: first submit date (ISO)")
    p.add_argument("--end", default=None, help="philly: submit before this date (ISO)")
    p.add_argument(
        "--oracle",
        action="store_true",
        help="tell every policy the durations (sjf and srtf always know them)",
    )
    p.add_argument(
        "--inflate",
        type=float,
        default=0.0,
        help="alibaba-openb: append sampled pods until demand is this x capacity",
    )
    p.add_argument(
        "--demand-marks",
        default="",
        help="allocation ratio when arrived GPU demand reaches these fractions, e.g. 1.0,1.3",
    )
    p.add_argument(
        "--cross-tenant",
        action="store_true",
        help="let shares of several tenants mix on one GPU (MIG / operator-allowed models); "
        "by default a GPU's shares go to one tenant at a time, as in the live loop",
    )
    p.add_argument(
        "--setup",
        default="trace",
        choices=("trace", "fgd"),
        help="alibaba-openb: 'fgd' replays FGD's own experiment (all pods, GPU-less too, "
        "shuffled by --seed, one tenant, nodes tie-broken in a seeded random order)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--jobs-out", default=None, help="CSV, one row per job run")
    p.add_argument("--plot", default=None, help="PNG of queue, allocation and shares over time")


def run(args: argparse.Namespace, out: TextIO | None = None) -> dict[str, Any]:
    out = out or sys.stdout
    policy = get_policy(args.policy)
    if args.placement:
        policy = policy.with_(placement=args.placement)
    if args.mode:
        policy = policy.with_(mode=args.mode)
        if args.mode == "hybrid" and not policy.mode_per_class:
            policy = policy.with_(
                mode_per_class=(("critical", "static"), ("standard", "dynamic"), ("low", "dynamic"))
            )
    if args.notice is not None:
        policy = policy.with_(notice_s=args.notice)
    if args.depth < 0:
        raise TraceError("--depth must be 0 (no cap) or more")
    policy = policy.with_(max_waits=args.depth or None)
    if not 0.0 <= args.checkpoint_fraction <= 1.0:
        raise TraceError("--checkpoint-fraction must be between 0 and 1")
    guarantees: dict[str, float] | None = None
    nodes: list[Node] = []
    parts: dict[str, int] = {}
    if args.partitions:
        parts = read_partitions(args.partitions)
        if args.scale_partitions:
            parts = scale_partitions(parts, args.scale_partitions)
        g = args.gpus_per_node
        for tenant in sorted(parts):
            for i in range(parts[tenant]):
                region = "shared" if args.lend else tenant
                nodes.append(Node(f"{tenant}-{i:04d}", args.model, g, 1, region=region))
        if args.lend:
            guarantees = {t: n * g for t, n in parts.items()}
            # lending needs preemption of borrowed (low) work by owners (standard)
            if not policy.preemption or policy.mode == "static":
                policy = policy.with_(
                    preemption=True,
                    mode="hybrid",
                    mode_per_class=(
                        ("critical", "static"),
                        ("standard", "dynamic"),
                        ("low", "dynamic"),
                    ),
                )
    elif args.cluster:
        single = "openb" if args.format == "alibaba-openb" else None
        nodes = (
            read_cluster(args.cluster, single_model=single)
            if Path(args.cluster).is_file()
            else read_cluster(args.cluster)
        )
    else:
        raise TraceError("give --cluster or --partitions")
    setup = getattr(args, "setup", "trace")
    if args.format == "alibaba-openb" and setup == "fgd":
        nodes = fgd_node_order(nodes, args.seed)
    if getattr(args, "cross_tenant", False):
        nodes = [replace(n, cross_tenant=True) for n in nodes]
    kw: dict[str, Any] = {}
    if args.format == "philly":
        kw = {
            "gpus_per_node": args.gpus_per_node if parts else max(n.num_gpus for n in nodes),
            "start": args.start,
            "end": args.end,
            "tenants": list(parts) if parts else None,
        }
    elif args.format == "alibaba-openb":
        kw = {
            "inflate": args.inflate,
            "capacity_gpus": sum(n.num_gpus for n in nodes),
            "seed": args.seed,
            "setup": setup,
        }
    jobs = read_trace(args.trace, args.format, **kw)
    if args.format == "alibaba-openb":
        for j in jobs:
            j.gpu_model = "openb" if not j.gpu_model else j.gpu_model
    if parts and not args.lend:
        for j in jobs:
            j.region = j.tenant
    marks = [float(x) for x in args.demand_marks.split(",") if x.strip()]
    sim = Simulator(
        nodes,
        jobs,
        policy,
        oracle=True if args.oracle else None,
        guarantees=guarantees,
        series_points=2000 if args.plot else 0,
        demand_marks=marks,
        checkpoint_fraction=args.checkpoint_fraction,
    )
    res = sim.run()
    summary = summarize(res, policy=policy.name, placement=policy.placement)
    summary["mode"] = policy.mode
    summary["lend"] = bool(args.lend)
    summary["depth"] = args.depth
    summary["checkpoint_fraction"] = args.checkpoint_fraction
    if args.jobs_out:
        write_jobs_csv(res, args.jobs_out)
    if args.plot:
        plot(res, args.plot, title=f"{args.policy} / {policy.placement}")
    if args.json:
        out.write(json.dumps(summary) + "\n")
    else:
        for k, v in summary.items():
            if k != "per_tenant":
                out.write(f"{k:>22}: {v}\n")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduler.sim", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(args)
    except TraceError as e:
        parser.error(str(e))
    return 0
