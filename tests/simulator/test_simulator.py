"""The trace-replay simulator on tiny hand-made traces with hand-computed results."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.core import get_policy
from scheduler.sim.cli import main
from scheduler.sim.engine import Simulator
from scheduler.sim.report import summarize
from scheduler.sim.trace import (
    Job,
    Node,
    TraceError,
    parse_cluster_spec,
    read_cluster_csv,
    read_generic,
    read_openb,
    read_partitions,
    read_philly,
)

HEADER = "job_id,submit_time,duration,num_gpus,gpu_milli,nodes,gpu_model,tenant,priority,billing\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def sim(nodes, jobs, policy, **kw):  # type: ignore[no-untyped-def]
    pol = get_policy(policy) if isinstance(policy, str) else policy
    res = Simulator(nodes, jobs, pol, **kw).run()
    return res, {jid: js for jid, js in res.jobs.items()}


def starts(res) -> dict[str, float]:  # type: ignore[no-untyped-def]
    out: dict[str, float] = {}
    for r in res.runs:
        out.setdefault(r.job_id, r.start)
    return out


def one_host(gpus: int = 4) -> list[Node]:
    return parse_cluster_spec(f"1x{gpus}:H100")


# ---------------------------------------------------------------------- policies


def test_fifo_runs_jobs_in_submit_order_and_the_head_blocks():
    # one 4-GPU host; a (4 GPUs, 100 s) runs; b (4 GPUs) waits; c (1 GPU) is behind b
    jobs = [
        Job("a", 0, 100, 4),
        Job("b", 1, 50, 4),
        Job("c", 2, 10, 1),
    ]
    res, js = sim(one_host(), jobs, "fifo")
    st = starts(res)
    assert st == {"a": 0, "b": 100, "c": 150}
    assert js["c"].end == 160
    s = summarize(res, policy="fifo", placement="first-fit")
    # JCTs 100, 149, 158
    assert s["avg_jct_s"] == pytest.approx((100 + 149 + 158) / 3, abs=0.1)
    assert s["makespan_s"] == 160


def test_sjf_starts_the_shortest_waiting_job_first():
    jobs = [
        Job("a", 0, 100, 4),
        Job("long", 1, 500, 4),
        Job("short", 2, 10, 4),
    ]
    res, _ = sim(one_host(), jobs, "sjf")
    assert starts(res) == {"a": 0, "short": 100, "long": 110}


def test_critical_preempts_spot_after_the_notice_and_the_victim_resumes():
    jobs = [
        Job("spot", 0, 1000, 4, priority="low", billing="spot"),
        Job("crit", 10, 100, 4, priority="critical"),
    ]
    res, js = sim(one_host(), jobs, get_policy("priority").with_(notice_s=30))
    rows = sorted(res.runs, key=lambda r: r.start)
    assert [(r.job_id, r.start, r.end, r.preempted) for r in rows] == [
        ("spot", 0, 40, True),  # notice at 10, stops at 40
        ("crit", 40, 140, False),
        ("spot", 140, 1100, False),  # 960 s of work left, attained kept
    ]
    assert js["spot"].attained == pytest.approx(40 * 4)
    assert res.preemptions == 1


def test_backfill_uses_idle_gpus_without_delaying_the_head():
    # 4 GPUs: a holds 2 until 100; head needs 4 (reserved at 100);
    # small (2 GPUs, 50 s) ends by 100 so it backfills; late (2 GPUs, 500 s) may not
    jobs = [
        Job("a", 0, 100, 2),
        Job("head", 1, 10, 4),
        Job("small", 2, 50, 2),
        Job("late", 3, 500, 2),
    ]
    res, _ = sim(one_host(), jobs, "priority", oracle=True)
    st = starts(res)
    assert st["small"] == 2
    assert st["head"] == 100
    assert st["late"] >= 110


def test_gang_takes_two_hosts_at_once():
    nodes = parse_cluster_spec("2x8:H100")
    jobs = [Job("one", 0, 50, 8), Job("gang", 1, 100, 8, nodes=2)]
    res, _ = sim(nodes, jobs, "fifo")
    gang = [r for r in res.runs if r.job_id == "gang"]
    assert len(gang) == 1 and len(gang[0].hosts) == 2 and gang[0].start == 50


def test_fractional_shares_pack_onto_one_gpu():
    jobs = [Job(f"s{i}", 0, 100, 0, gpu_milli=250) for i in range(4)] + [Job("w", 1, 10, 1)]
    res, _ = sim(
        parse_cluster_spec("1x2:T4"), jobs, get_policy("gpucloud").with_(placement="best-fit")
    )
    st = starts(res)
    assert all(st[f"s{i}"] == 0 for i in range(4))
    assert st["w"] == 1  # the four quarters share one GPU, the other stays whole-free


@pytest.mark.parametrize("policy", ["fifo", "sjf", "srtf", "las", "drf", "priority", "gpucloud"])
def test_every_policy_finishes_a_small_mixed_trace(policy):
    jobs = [
        Job(f"j{i}", i * 5, 30 + 7 * i, (1, 2, 4, 8)[i % 4], tenant=f"t{i % 3}") for i in range(20)
    ]
    res, js = sim(parse_cluster_spec("2x8:H100"), jobs, policy)
    assert all(j.end is not None for j in js.values())
    s = summarize(res, policy=policy, placement="")
    assert 0 < s["gpu_allocation_ratio"] <= 1 and 0 < s["jain_fairness"] <= 1


def test_lending_owner_reclaims_borrowed_gpus():
    # shared pool of 8 GPUs, a and b guaranteed 4 each; a borrows all 8 first
    nodes = [Node("h0", "V100", 4, region="shared"), Node("h1", "V100", 4, region="shared")]
    jobs = [
        Job("a1", 0, 1000, 4, tenant="a"),
        Job("a2", 0, 1000, 4, tenant="a"),
        Job("b1", 100, 50, 4, tenant="b"),
    ]
    pol = get_policy("gpucloud").with_(notice_s=30)
    res, js = sim(nodes, jobs, pol, guarantees={"a": 4, "b": 4})
    st = starts(res)
    assert st["b1"] == 130
    assert res.preemptions == 1
    assert js["a2"].end == 1050  # 870 s left after 130 s, restarted at 180


# ------------------------------------------------------------- the jobs-out check


def test_jobs_out_never_over_capacity_and_gangs_start_together(tmp_path):
    lines = [HEADER]
    for i in range(40):
        g, n, m = [(1, 1, 1000), (2, 1, 1000), (8, 2, 1000), (1, 1, 500), (4, 1, 1000)][i % 5]
        lines.append(
            f"j{i},{i * 3},{20 + (i * 13) % 90},{g},{m},{n},,t{i % 4},"
            f"{['standard', 'low', 'critical'][i % 3]},{'spot' if i % 3 == 1 else 'on_demand'}\n"
        )
    trace = write(tmp_path, "t.csv", "".join(lines))
    out = tmp_path / "jobs.csv"
    main(
        [
            "--trace",
            str(trace),
            "--cluster",
            "3x8:H100",
            "--policy",
            "gpucloud",
            "--json",
            "--jobs-out",
            str(out),
        ]
    )
    rows = list(csv.DictReader(out.open()))
    assert {r["job_id"] for r in rows} == {f"j{i}" for i in range(40)}
    events: list[tuple[float, int, str, float]] = []
    for r in rows:
        hosts = r["hosts"].split(";")
        assert len(hosts) == len(set(hosts))
        per = int(r["gpus"]) * 1000 or int(r["milli"])
        for h in hosts:  # one start and one end for the whole gang
            events.append((float(r["start"]), 1, h, per))
            events.append((float(r["end"]), 0, h, -per))
    used: dict[str, float] = defaultdict(float)
    for _t, _k, h, d in sorted(events):  # ends (0) before starts (1) at one instant
        used[h] += d
        assert used[h] <= 8000, f"{h} over capacity"


# ---------------------------------------------------------------------- parsing


def test_generic_defaults_and_fractional(tmp_path):
    p = write(
        tmp_path,
        "g.csv",
        "job_id,submit_time,duration,num_gpus,gpu_milli\na,0,10,2,\nb,5,1,1,250\n",
    )
    a, b = read_generic(p)
    assert (a.gpus_per_node, a.gpu_milli, a.nodes, a.priority, a.billing, a.tenant) == (
        2,
        1000,
        1,
        "standard",
        "on_demand",
        "default",
    )
    assert (b.gpus_per_node, b.gpu_milli) == (0, 250)


def test_generic_rejects_a_bad_priority_with_the_line(tmp_path):
    p = write(tmp_path, "g.csv", HEADER + "a,0,10,1,,,,t,urgent,\n")
    with pytest.raises(TraceError, match="g.csv:2"):
        read_generic(p)


def test_philly_sorts_filters_and_splits_large_jobs(tmp_path):
    p = write(
        tmp_path,
        "philly.csv",
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,vc1\n"
        "2017-10-09 06:13:03,2951.0,16,47216.0,vc2\n"
        "2017-09-29 07:58:32,860662.0,1,860662.0,vc1\n"
        "2017-10-09 07:00:00,10.0,12,120.0,vc3\n\n",
    )
    jobs = read_philly(p, start="2017-10-01", end="2017-11-01", tenants=["vc1", "vc2"])
    assert [(j.tenant, j.submit, j.gpus_per_node, j.nodes) for j in jobs] == [
        ("vc2", 0.0, 8, 2),
        ("vc1", 2932.0, 1, 1),
    ]
    twelve = read_philly(p, tenants=["vc3"])[0]
    assert (twelve.gpus_per_node, twelve.nodes) == (6, 2)


def test_openb_pods_shares_classes_and_inflation(tmp_path):
    p = write(
        tmp_path,
        "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "pod-0,12000,16384,1,1000,,LS,Running,0,100,0\n"
        "pod-1,6000,12288,1,460,,BE,Running,5,100,5\n"
        "pod-2,4000,8192,0,0,,BE,Running,6,100,6\n"
        "pod-3,8000,8192,2,1000,,Burstable,Running,7,100,7\n",
    )
    pods = read_openb(p)
    assert [(j.job_id, j.gpus_per_node, j.gpu_milli, j.priority, j.vcpus) for j in pods] == [
        ("pod-0", 1, 1000, "critical", 12000),
        ("pod-1", 0, 460, "low", 6000),
        ("pod-3", 2, 1000, "standard", 8000),
    ]
    assert all(j.duration == float("inf") for j in pods)
    more = read_openb(p, inflate=2.0, capacity_gpus=4)
    assert sum(j.gpus for j in more) >= 8


def test_cluster_specs_and_node_csvs(tmp_path):
    nodes = parse_cluster_spec("2x8:H100, 1x4:A100")
    assert [(n.node_id, n.gpu_model, n.num_gpus) for n in nodes] == [
        ("h00000", "H100", 8),
        ("h00001", "H100", 8),
        ("h00002", "A100", 4),
    ]
    with pytest.raises(TraceError):
        parse_cluster_spec("8 H100")
    ours = write(
        tmp_path, "n.csv", "node_id,gpu_model,num_gpus,nvlink_groups\nn1,H100,8,2\nn2,T4,0,1\n"
    )
    assert read_cluster_csv(ours) == [Node("n1", "H100", 8, 2)]
    openb = write(tmp_path, "o.csv", "sn,cpu_milli,memory_mib,gpu,model\nx,64000,262144,2,P100\n")
    assert read_cluster_csv(openb, single_model="openb") == [
        Node("x", "openb", 2, 1, 64000, 262144)
    ]
    parts = write(tmp_path, "p.csv", "vc,node num\na,2\nb,3\n")
    assert read_partitions(parts) == {"a": 2, "b": 3}


# ---------------------------------------------------------------------- commands


def test_python_m_and_partitions_end_to_end(tmp_path, capsys):
    trace = write(
        tmp_path, "t.csv", HEADER + "a,0,100,8,,,,x,,\nb,0,100,8,,,,y,,\nc,1,10,8,,,,x,,\n"
    )
    parts = write(tmp_path, "p.csv", "tenant,nodes\nx,1\ny,1\n")
    main(["--trace", str(trace), "--partitions", str(parts), "--policy", "fifo", "--json"])
    out = json.loads(capsys.readouterr().out)
    # x's c waits for a on x's own partition (starts at 100, JCT 109)
    assert out["per_tenant"]["x"]["avg_jct_s"] == pytest.approx((100 + 109) / 2)
    assert out["jobs"] == 3


def test_manage_py_simulate_prints_json(tmp_path):
    from io import StringIO

    from django.core.management import call_command

    trace = write(tmp_path, "t.csv", HEADER + "a,0,10,1,,,,t1,,\nb,0,20,2,,,,t2,,\n")
    buf = StringIO()
    call_command("simulate", "--trace", str(trace), "--cluster", "1x4:H100", "--json", stdout=buf)
    out = json.loads(buf.getvalue())
    assert out["jobs"] == 2 and out["avg_jct_s"] == 15.0 and out["preemptions"] == 0
    assert set(out) >= {
        "p50_jct_s",
        "p99_jct_s",
        "avg_queue_s",
        "makespan_s",
        "gpu_allocation_ratio",
        "jain_fairness",
        "per_tenant",
        "wall_s",
    }


def _rows(res):  # type: ignore[no-untyped-def]
    runs = [(r.job_id, r.start, r.end, r.hosts, r.gpus, r.milli, r.preempted) for r in res.runs]
    return runs, sorted((j, s.first_start, s.rejected) for j, s in res.jobs.items())


@pytest.mark.parametrize(
    "policy,placement",
    [
        ("gpucloud", "best-fit"),
        ("gpucloud", "frag-aware"),
        ("drf", "first-fit"),
        ("fifo", None),
        ("las", "spread"),
    ],
)
@pytest.mark.parametrize("forever", [False, True])
def test_static_runs_without_allocations_plan_the_same(policy, placement, forever):
    """With no dynamic class and no known end times the engine hands the core no
    running allocations (they could only order tenants sharing a lane): the
    replay must equal the one that hands them all over."""
    import random

    rng = random.Random(7)
    nodes = [Node(f"n{i:02d}", "T4", (1, 2, 4, 8)[i % 4], 1, 32000, 65536) for i in range(12)]
    jobs = []
    for i in range(160):
        frac = rng.random() < 0.4
        jobs.append(
            Job(
                f"j{i:03d}",
                float(i // 3),  # three at a time: tenants meet in one lane
                math.inf if forever else float(rng.randint(5, 400)),
                0 if frac else rng.choice((1, 1, 2, 4, 8)),
                gpu_milli=rng.choice((100, 250, 500, 700)) if frac else 1000,
                tenant=rng.choice(("a", "b", "c")),
                priority=rng.choice(("critical", "standard", "low")),
                vcpus=rng.choice((0, 1000, 4000)),
                memory_mib=rng.choice((0, 2048, 16384)),
            )
        )
    pol = get_policy(policy).with_(mode="static")
    if placement:
        pol = pol.with_(placement=placement)
    fast = Simulator(nodes, [replace(j) for j in jobs], pol)
    assert fast.opaque
    full = Simulator(nodes, [replace(j) for j in jobs], pol)
    full.opaque = False
    a, b = fast.run(), full.run()
    assert _rows(a) == _rows(b)
    assert a.plan_calls == b.plan_calls


# --------------------------------------------------------------- tenant isolation


@pytest.mark.parametrize(("cross_tenant", "x_starts"), [(False, 100.0), (True, 0.0)])
def test_replay_keeps_tenants_off_each_others_shared_gpus(cross_tenant, x_starts):  # type: ignore[no-untyped-def]
    # one GPU; two tenants' quarter shares: the second waits for the first to end
    # unless the GPU is open to cross-tenant sharing (MIG / an operator's choice)
    nodes = [Node("n0", "H100", 1, cross_tenant=cross_tenant)]
    jobs = [
        Job("a", 0.0, 100.0, 0, 250, tenant="t1", gpu_model="H100"),
        Job("b", 0.0, 100.0, 0, 250, tenant="t1", gpu_model="H100"),
        Job("x", 0.0, 100.0, 0, 250, tenant="t2", gpu_model="H100"),
    ]
    res, _ = sim(nodes, jobs, "fifo")
    st = starts(res)
    assert st["a"] == 0.0 and st["b"] == 0.0  # the same tenant shares its GPU
    assert st["x"] == x_starts


# ------------------------------------------------------- the incremental queue


@pytest.mark.parametrize("policy", ["gpucloud", "las", "srtf", "sjf", "drf", "priority", "fifo"])
@pytest.mark.parametrize("lend", [False, True])
def test_incremental_queue_plans_the_same_as_the_whole_queue(policy, lend):
    """Under a depth cap the engine hands the core only each group's head (what
    the cap lets it look at): the replay must equal the one that hands it the
    whole queue, preemptions and restarts included."""
    import random

    rng = random.Random(11)
    nodes = [Node(f"n{i:02d}", "H100", 8, 2) for i in range(4)]
    jobs = [
        Job(
            f"j{i:03d}",
            float(rng.randint(0, 1500)),
            float(rng.randint(30, 4000)),
            rng.choice((1, 1, 1, 2, 4, 8)),
            tenant=rng.choice(("a", "b", "c")),
            priority=rng.choice(("standard", "standard", "low")),
        )
        for i in range(100)
    ]
    pol = get_policy(policy).with_(max_waits=3, min_run_s=60.0, las_thresholds=(900.0, 9000.0))
    guar = {"a": 16.0, "b": 8.0, "c": 8.0} if lend else None
    if lend:
        pol = pol.with_(preemption=True, mode="hybrid", mode_per_class=(
            ("critical", "static"), ("standard", "dynamic"), ("low", "dynamic"),
        ))
    kw = {"guarantees": guar, "checkpoint_fraction": 0.5}
    fast = Simulator(nodes, [replace(j) for j in jobs], pol, **kw)
    slow = Simulator(nodes, [replace(j) for j in jobs], pol, incremental=False, **kw)
    assert fast.incremental and not slow.incremental
    a, b = fast.run(), slow.run()
    assert _rows(a) == _rows(b)
    assert a.preemptions == b.preemptions and a.lost_gpu_s == b.lost_gpu_s
    assert a.preemptions > 0 or not fast.may_preempt


def test_max_min_fair_shares_give_what_one_cannot_use_to_the_others():
    from scheduler.sim.engine import _maxmin

    got = _maxmin({"a": 1000.0, "b": 9000.0, "c": 9000.0}, {}, 8000.0)
    assert got == {"a": 1000.0, "b": 3500.0, "c": 3500.0}
    got = _maxmin({"a": 9000.0, "b": 9000.0}, {"a": 3.0, "b": 1.0}, 8000.0)
    assert got == {"a": 6000.0, "b": 2000.0}
    assert _maxmin({"a": 100.0}, {}, 8000.0) == {"a": 100.0}


OPENB_PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
    "pod-0,12000,16384,1,1000,,LS,Running,0,100,0\n"
    "pod-1,6000,12288,1,460,,BE,Running,5,100,5\n"
    "pod-2,4000,8192,0,0,,BE,Running,6,100,6\n"
    "pod-3,8000,8192,2,1000,,Burstable,Running,7,100,7\n"
    "pod-4,2000,4096,1,250,,LS,Running,8,100,8\n"
    "pod-5,16000,8192,0,0,,LS,Running,9,100,9\n"
)


def test_openb_fgd_setup_keeps_gpu_less_pods_and_shuffles_by_seed(tmp_path):
    from scheduler.sim.trace import fgd_node_order

    p = write(tmp_path, "pods.csv", OPENB_PODS)
    pods = read_openb(p, setup="fgd", seed=1)
    assert sorted(j.job_id for j in pods) == [f"pod-{i}" for i in range(6)]
    cpu = {j.job_id: (j.gpus_per_node, j.gpu_milli, j.vcpus) for j in pods}
    assert cpu["pod-2"] == (0, 0, 4000) and cpu["pod-5"] == (0, 0, 16000)
    assert {j.tenant for j in pods} == {"default"} and {j.priority for j in pods} == {"standard"}
    assert [j.submit for j in pods] == [float(i) for i in range(6)]
    again = read_openb(p, setup="fgd", seed=1)
    assert [j.job_id for j in again] == [j.job_id for j in pods]  # seeded
    orders = {tuple(j.job_id for j in read_openb(p, setup="fgd", seed=s)) for s in range(8)}
    assert len(orders) > 1  # and shuffled
    # tuning: samples of the whole file until the next would pass 2 x 3 GPUs
    more = read_openb(p, setup="fgd", seed=1, inflate=2.0, capacity_gpus=3)
    assert len(more) > 6 and sum(j.gpus for j in more) <= 6.0
    assert [j.submit for j in more] == [float(i) for i in range(len(more))]
    with pytest.raises(TraceError):
        read_openb(p, setup="nope")
    nodes = [Node(f"n{i}", "openb", 2, 1, 16000, 65536) for i in range(5)]
    shuffled = fgd_node_order(nodes, 3)
    assert sorted(n.node_id.split("-", 1)[1] for n in shuffled) == [f"n{i}" for i in range(5)]
    assert sorted(int(n.node_id.split("-", 1)[0]) for n in shuffled) == list(range(5))
    assert fgd_node_order(nodes, 3) == shuffled


def test_openb_fgd_setup_end_to_end_places_gpu_less_pods(tmp_path, capsys):
    from scheduler.sim.seeds import main as seeds_main
    from scheduler.sim.seeds import parse_seeds

    p = write(tmp_path, "pods.csv", OPENB_PODS)
    nodes = write(
        tmp_path,
        "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "a,16000,65536,2,P100\nb,32000,131072,2,T4\nc,8000,32768,1,V100\n",
    )
    common = [
        "--trace", str(p), "--format", "alibaba-openb", "--cluster", str(nodes),
        "--policy", "gpucloud", "--mode", "static", "--setup", "fgd",
        "--inflate", "1.3", "--demand-marks", "1.0",
    ]  # fmt: skip
    for placement in ("fgd", "best-fit", "frag-aware"):
        assert main([*common, "--placement", placement, "--seed", "5", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        # every original pod fits this fleet, the GPU-less ones included
        assert out["placed"] >= 6, placement
        assert 0 < out["allocation_at_demand"]["1"] <= 1.0
    assert parse_seeds("42-44,7") == [42, 43, 44, 7]
    assert seeds_main(["--seeds", "1-2", "--", *common, "--placement", "fgd"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["seed"] for r in lines[:2]] == [1, 2]
    mark = lines[2]["allocation_at_demand"]["1"]
    assert mark["n"] == 2 and mark["min"] <= mark["mean"] <= mark["max"]
