"""`gpucloud groups …`: autoscaling groups and batch pools (registered by gpucloud_sdk.cli)."""
from __future__ import annotations

from typing import Annotated, Any

import typer

from gpucloud_sdk.cli import EXIT_USAGE, JsonOpt, _env_pairs, _short, client, emit_json, fail, out, table

groups_app = typer.Typer(no_args_is_help=True,
                         help="Autoscaling groups and batch pools: instances kept at a desired size.")


def _find(gc: Any, name: str) -> dict[str, Any]:
    return gc.groups.find(name)  # type: ignore[no-any-return]


@groups_app.command("ls")
def groups_ls(as_json: JsonOpt = False) -> None:
    """Your groups. Example: `gpucloud groups ls`"""
    with client() as gc:
        items = list(gc.groups.list())
    if as_json:
        emit_json(items)
        return
    table(["NAME", "TYPE", "REGION", "MIN", "DESIRED", "MAX", "MEMBERS", "POOL", "ID"],
          ([g["name"], g["instance_type"], g["region"], g["min_size"], g["desired"], g["max_size"],
            len(g["members"]), g.get("job_queue") or "", g["id"]] for g in items))


@groups_app.command("create")
def groups_create(
    name: Annotated[str, typer.Argument()],
    instance_type: Annotated[str, typer.Option("--type", help="Instance type code, e.g. h100.1x.")],
    region: Annotated[str, typer.Option(help="Region, e.g. us-east-1.")],
    image: Annotated[str, typer.Option(help="Container image.")] = "ubuntu:24.04",
    min_size: Annotated[int, typer.Option("--min")] = 0,
    max_size: Annotated[int, typer.Option("--max")] = 1,
    desired: Annotated[int | None, typer.Option(help="Default: --min.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE; repeatable.")] = None,
    port: Annotated[list[int] | None, typer.Option("--port", help="A port to expose; repeatable.")] = None,
    on_demand_base: Annotated[int | None, typer.Option(help="The first N members on demand.")] = None,
    on_demand_percent: Annotated[int | None, typer.Option(help="%% above the base on demand; rest spot.")] = None,
    job_queue: Annotated[str | None, typer.Option(help="Make it a batch pool following this job queue.")] = None,
    target_gpu_util: Annotated[float | None, typer.Option(
        help="Add a target tracking policy keeping average GPU utilisation at this %.")] = None,
    as_json: JsonOpt = False,
    command: Annotated[list[str] | None, typer.Argument(help="Command after --.")] = None,
) -> None:
    """Create a group.

    Examples:

        gpucloud groups create web --type h100.1x --region us-east-1 --min 1 --max 5 --target-gpu-util 60
        gpucloud groups create render --type l40s.1x --region us-east-1 --max 10 --job-queue render
    """
    with client() as gc:
        g = gc.groups.create(name=name, instance_type=instance_type, region=region, image=image, min_size=min_size,
                             max_size=max_size, desired=desired, env=_env_pairs(env or []) or None,
                             ports=port or None, command=command or None, on_demand_base=on_demand_base,
                             on_demand_percent=on_demand_percent, job_queue=job_queue)
        if target_gpu_util is not None:
            gc.scaling_policies.create(group=g["id"], name="gpu-util", kind="target_tracking", metric="gpu_util",
                                       target=target_gpu_util)
    if as_json:
        emit_json(g)
        return
    out.print(f"Created group {g['name']} ({g['id']}): min {g['min_size']}, desired {g['desired']}, "
              f"max {g['max_size']}.", highlight=False)


@groups_app.command("show")
def groups_show(name: Annotated[str, typer.Argument(help="Group name or id.")], as_json: JsonOpt = False) -> None:
    """A group, its members, policies, scheduled actions and latest activity."""
    with client() as gc:
        g = _find(gc, name)
        policies = [p for p in gc.scaling_policies.list() if p["group"] == g["id"]]
        scheduled = [s for s in gc.scheduled_actions.list() if s["group"] == g["id"]]
        acts = []
        for a in gc.groups.activities(g["id"]):
            acts.append(a)
            if len(acts) >= 10:
                break
    if as_json:
        emit_json({**g, "policies": policies, "scheduled_actions": scheduled, "activities": acts})
        return
    out.print(f"{g['name']}  {g['instance_type']} in {g['region']}  min {g['min_size']} / desired "
              f"{g['desired']} / max {g['max_size']}" + (f"  pool of queue {g['job_queue']}" if g["job_queue"] else ""),
              highlight=False)
    table(["MEMBER", "STATE", "BILLING", "PROTECTED", "LAUNCHED", "ID"],
          ([m["name"], m["state"], m["billing"], "yes" if m["protected"] else "", _short(m["launched_at"]),
            m["instance"]] for m in g["members"]), empty="No members.")
    for p in policies:
        what = (f"{p['metric']} at {p['target']}" if p["kind"] == "target_tracking"
                else f"{p['adjustment_type']} {p['steps']}")
        out.print(f"policy {p['name']} ({p['kind']}): {what}  id {p['id']}", highlight=False)
    for s in scheduled:
        out.print(f"scheduled {s['name']}: {s['cron']} {s['timezone']} → min {s['min_size']} desired "
                  f"{s['desired']} max {s['max_size']}; next {_short(s['next_run_at'])}", highlight=False)
    for a in acts:
        out.print(f"{_short(a['created_at'])}  {a['cause']}", highlight=False)


@groups_app.command("scale")
def groups_scale(name: Annotated[str, typer.Argument(help="Group name or id.")],
                 desired: Annotated[int | None, typer.Option()] = None,
                 min_size: Annotated[int | None, typer.Option("--min")] = None,
                 max_size: Annotated[int | None, typer.Option("--max")] = None) -> None:
    """Set desired (and/or min, max). Example: `gpucloud groups scale web --desired 3`"""
    changes = {k: v for k, v in (("desired", desired), ("min_size", min_size), ("max_size", max_size))
               if v is not None}
    if not changes:
        fail(EXIT_USAGE, "Give --desired, --min or --max.")
    with client() as gc:
        g = gc.groups.update(_find(gc, name)["id"], **changes)
    out.print(f"{g['name']}: min {g['min_size']}, desired {g['desired']}, max {g['max_size']}.", highlight=False)


@groups_app.command("protect")
def groups_protect(name: Annotated[str, typer.Argument(help="Group name or id.")],
                   instance: Annotated[str, typer.Argument(help="Member instance id.")],
                   off: Annotated[bool, typer.Option("--off", help="Remove the protection.")] = False) -> None:
    """Scale-in protection of a member. Example: `gpucloud groups protect web 1f0c… [--off]`"""
    with client() as gc:
        m = gc.groups.protect(_find(gc, name)["id"], instance, not off)
    out.print(f"{m['name']}: scale-in protection {'on' if m['protected'] else 'off'}.", highlight=False)


@groups_app.command("schedule")
def groups_schedule(name: Annotated[str, typer.Argument(help="Group name or id.")],
                    action: Annotated[str, typer.Argument(help="A name for the scheduled action.")],
                    cron: Annotated[str, typer.Option(help="e.g. '0 9 * * 1-5'.")],
                    tz: Annotated[str, typer.Option("--tz", help="IANA time zone.")] = "UTC",
                    desired: Annotated[int | None, typer.Option()] = None,
                    min_size: Annotated[int | None, typer.Option("--min")] = None,
                    max_size: Annotated[int | None, typer.Option("--max")] = None) -> None:
    """Add a scheduled action. Example: `gpucloud groups schedule web night --cron '0 20 * * *' --desired 0`"""
    with client() as gc:
        s = gc.scheduled_actions.create(group=_find(gc, name)["id"], name=action, cron=cron, timezone=tz,
                                        desired=desired, min_size=min_size, max_size=max_size)
    out.print(f"Scheduled {s['name']} ({s['cron']} {s['timezone']}); next run {_short(s['next_run_at'])}.",
              highlight=False)


@groups_app.command("activity")
def groups_activity(name: Annotated[str, typer.Argument(help="Group name or id.")],
                    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20,
                    as_json: JsonOpt = False) -> None:
    """What the group did and why. Example: `gpucloud groups activity web`"""
    with client() as gc:
        acts = []
        for a in gc.groups.activities(_find(gc, name)["id"]):
            acts.append(a)
            if len(acts) >= limit:
                break
    if as_json:
        emit_json(acts)
        return
    table(["WHEN", "KIND", "CAUSE"], ([_short(a["created_at"]), a["kind"], a["cause"]] for a in acts),
          empty="No activity.")


@groups_app.command("rm")
def groups_rm(name: Annotated[str, typer.Argument(help="Group name or id.")]) -> None:
    """Delete a group; its members are stopped. Example: `gpucloud groups rm web`"""
    with client() as gc:
        g = _find(gc, name)
        gc.groups.delete(g["id"])
    out.print(f"Deleted group {g['name']}; its members are stopping.", highlight=False)
