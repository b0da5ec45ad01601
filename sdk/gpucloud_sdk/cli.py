"""`gpucloud`: the command line over the SDK.

Exit codes: 0 ok, 1 API error (its message printed), 2 usage error, 3 not found,
4 timeout on `--wait`. Every listing takes `--json` (the API's own keys, stable).
"""
from __future__ import annotations

import base64
import hashlib
import inspect
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpucloud_sdk import config, errors
from gpucloud_sdk.client import TERMINAL_STATES, Client

EXIT_OK, EXIT_API, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_TIMEOUT = 0, 1, 2, 3, 4



def _console(*, stderr: bool = False) -> Console:
    """The one place output is set up. What we print is mostly the server's text (names, reasons,
    image references, log lines): printed literally, never read as rich markup (`[x]`), emoji
    codes (`sha256:zzz:` is not 💤) or highlighted. Our own emphasis is a `Text` style."""
    return Console(stderr=stderr, soft_wrap=True, markup=False, emoji=False, highlight=False)


out = _console()
err = _console(stderr=True)

app = typer.Typer(
    name="gpucloud", no_args_is_help=True, rich_markup_mode="markdown",
    pretty_exceptions_show_locals=False,  # a crash must never print the API key held in a local
    help="Rent GPUs on a gpucloud server from your terminal.\n\n"
         "Start with `gpucloud login`, then `gpucloud offers`, `gpucloud launch h100.1x --wait`.\n\n"
         "Exit codes: 0 ok, 1 API error, 2 usage error, 3 not found, 4 timeout on --wait.",
)
jobs_app = typer.Typer(no_args_is_help=True, help="Batch jobs: submit, list, logs, stop.")
volumes_app = typer.Typer(no_args_is_help=True, help="Persistent volumes: ls, create, show, resize, rm.")
keys_app = typer.Typer(no_args_is_help=True, help="API keys of your tenant.")
app.add_typer(jobs_app, name="jobs")
app.add_typer(volumes_app, name="volumes")
app.add_typer(keys_app, name="keys")
ssh_keys_app = typer.Typer(no_args_is_help=True,
                           help="Your SSH public keys: the gateway lets them in to your instances.")
app.add_typer(ssh_keys_app, name="ssh-keys")
alarms_app = typer.Typer(no_args_is_help=True,
                         help="Alarms on a workload's GPU metrics or your tenant's spend and queue (docs/alarms.md).")
app.add_typer(alarms_app, name="alarms")

_state: dict[str, Any] = {"profile": None}

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON (the API's keys).")]
WideOpt = Annotated[bool, typer.Option("--wide", "-w", help="One line per row: no column wraps (names and ids "
                                                             "are never cut either way).")]
T = TypeVar("T")


class Exit(Exception):
    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def fail(code: int, message: str) -> NoReturn:
    raise Exit(code, message)


@app.callback()
def _root(profile: Annotated[str | None, typer.Option(
        "--profile", "-P", envvar="GPUCLOUD_PROFILE", help="The profile of config.toml to use.")] = None) -> None:
    _state["profile"] = profile


def client() -> Client:
    prof = config.resolve(_state["profile"])
    if not prof.url or not prof.api_key:
        fail(EXIT_USAGE, f"Not logged in (profile {prof.name!r}): run `gpucloud login`, "
                         f"or set GPUCLOUD_URL and GPUCLOUD_API_KEY.")
    return Client(prof.url, prof.api_key)


def emit_json(data: Any) -> None:
    # print, not rich: byte-exact JSON for scripts (no wrapping, no markup)
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


#: columns a listing never cuts or wraps: what you type next (`gpucloud ssh NAME`, `... ID`)
WHOLE_COLUMNS = frozenset({"NAME", "ARRAY", "ID"})


def table(columns: list[str], rows: Iterable[Iterable[Any]], *, empty: str = "Nothing to show.",
          wide: bool = False) -> None:
    """A listing. Names and ids are shown whole: the other columns wrap to fit the terminal,
    and when even that is too narrow the lines run past it (the terminal wraps them) rather
    than cutting an id. `wide`: nothing wraps at all (one line per row, for a wide pager)."""
    t = Table(*columns, box=None, header_style="bold", pad_edge=False)
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    if not cells:
        out.print(empty)
        return
    for i, col in enumerate(t.columns):
        # a header never shrinks to nothing: a column squeezed to 0 hides its data
        col.min_width = len(columns[i])
        if columns[i] in WHOLE_COLUMNS:
            col.no_wrap = True
            col.min_width = max([len(r[i]) for r in cells if i < len(r)] + [col.min_width])
    for row in cells:
        t.add_row(*(Text(v) for v in row))
    need = Measurement.get(out, out.options.update_width(1 << 20), t)
    width = need.maximum if wide else max(out.width, need.minimum)
    saved = out.width
    try:
        out.width = max(width, 1)
        out.print(t)
    finally:
        out.width = saved


def bold(text: str) -> Text:
    return Text(text, style="bold")


def _money(value: Any) -> str:
    return "" if value in (None, "") else f"{float(value):.2f}"


def _short(ts: str | None) -> str:
    return (ts or "")[:19].replace("T", " ")


# --- login --------------------------------------------------------------------------------

@app.command()
def login(
    url: Annotated[str | None, typer.Option(help="The server, e.g. https://gpucloud.example.com")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="An API key (gpc_...). Omit it to be asked without echo; `-` reads it from stdin.",
        show_default=False)] = None,
    profile: Annotated[str | None, typer.Option(help="Save as this profile (default: the current one).")] = None,
) -> None:
    """Check an API key against the server and save it in ~/.config/gpucloud/config.toml (0600).

    Examples:

        gpucloud login --url https://gpucloud.example.com        # asks for the key
        echo "$KEY" | gpucloud login --url http://127.0.0.1:8000 --api-key -
        gpucloud --profile staging login --url https://staging.example.com
    """
    current = config.resolve(_state["profile"])
    name = profile or current.name
    url = url or current.url or typer.prompt("Server URL", default="http://127.0.0.1:8000")
    if api_key == "-":
        api_key = sys.stdin.readline().strip()
    elif not api_key:
        api_key = typer.prompt("API key", hide_input=True)
    if not url.startswith(("http://", "https://")):
        fail(EXIT_USAGE, f"--url must start with http:// or https:// (got {url!r}).")
    if not api_key:
        fail(EXIT_USAGE, "An API key is needed (create one in the console: Settings → API keys).")
    with Client(url, api_key) as gc:
        me = gc.whoami()
    path = config.store(name, url=url, api_key=api_key, make_default=profile is None or name == current.name)
    out.print(Text.assemble(f"Logged in to {url} as tenant ", bold(me['tenant']['name']),
                            f" (profile {name}, saved in {path})."))


@app.command()
def whoami(as_json: JsonOpt = False) -> None:
    """The server, profile and tenant your key acts for.

    Example: `gpucloud whoami --json`
    """
    prof = config.resolve(_state["profile"])
    with client() as gc:
        me = gc.whoami()
    if as_json:
        emit_json({"url": prof.url, "profile": prof.name, **me})
        return
    t = me["tenant"]
    out.print(f"{prof.url}  profile {prof.name}\ntenant {t['name']} ({t['slug']}, plan {t['plan']}, {t['status']})")


# --- catalogue ---------------------------------------------------------------------------------

def _offers(gc: Client, gpu: str | None, region: str | None, spot: bool) -> list[dict[str, Any]]:
    rows = []
    kind = "spot" if spot else "on_demand"
    try:  # what your tenant could start now, counted by the scheduler (GET /availability)
        now: dict[tuple[str, str], dict[str, Any]] | None = {
            (a["instance_type"], a["region"]): a for a in gc.availability.list(gpu_model=gpu, region=region)}
    except errors.NotFound:  # a server without the availability API
        now = None
    for it in gc.instance_types.list(gpu_model=gpu, region=region):
        for p in it.get("prices", []):
            if p["kind"] != kind or (region and p["region"] != region):
                continue
            rows.append({
                "instance_type": it["code"], "gpu_model": it["gpu_model"]["code"], "gpus": it["gpus"],
                "vcpus": it["vcpus"], "memory_gib": it["memory_gib"], "region": p["region"], "kind": p["kind"],
                "currency": p["currency"], "per_hour": p["per_hour"],
                "per_tflops_hour": p["per_bf16_tflops_hour"],
                "available": None if now is None else now.get((it["code"], p["region"]), {}).get("available_now", 0),
                # available, busy or never (the server's word; a server before it: from the counts)
                "availability": None if now is None else _availability(now.get((it["code"], p["region"]))),
            })
    rows.sort(key=lambda r: (float(r["per_hour"]), r["instance_type"], r["region"]))
    return rows


def _availability(row: dict[str, Any] | None) -> str:
    if row is None:  # not priced there for availability: nothing to run
        return "never"
    if "availability" in row:
        return str(row["availability"])
    return "never" if not row.get("can_host", True) else "available" if row["available_now"] > 0 else "busy"


@app.command()
def offers(
    gpu: Annotated[str | None, typer.Option(help="GPU model code, e.g. H100, A100-80G, L40S.")] = None,
    region: Annotated[str | None, typer.Option(help="Region code, e.g. us-east-1.")] = None,
    available: Annotated[bool, typer.Option("--available", help="Only what would start now.")] = False,
    show_all: Annotated[bool, typer.Option(
        "--all", help="Also offers no host of this fleet can ever run (NOW never), hidden by default.")] = False,
    spot: Annotated[bool, typer.Option("--spot", help="Spot prices instead of on-demand.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The catalogue: price per hour and per BF16-TFLOPS-hour, how many would start now (FREE)
    and whether one would (NOW: available; busy: it queues; never: no host here can run it,
    shown with --all), what would start now first, then cheapest first.

    Examples:

        gpucloud offers --gpu H100 --region us-east-1
        gpucloud offers --available --spot --json
        gpucloud offers --all
    """
    with client() as gc:
        rows = _offers(gc, gpu, region, spot)
    reported = any(r["available"] is not None for r in rows)
    if available:
        if rows and not reported:
            fail(EXIT_API, "This server does not report availability yet; run without --available.")
        rows = [r for r in rows if (r["available"] or 0) > 0]
    if not show_all:
        rows = [r for r in rows if r["availability"] != "never"]
    # runnable first: available, then busy, then never; each part cheapest first (a stable sort)
    rows.sort(key=lambda r: {"available": 0, "busy": 1, "never": 2}.get(r["availability"] or "", 0))
    if as_json:
        emit_json(rows)
        return
    table(["TYPE", "GPU", "GPUS", "VCPUS", "MEM GiB", "REGION", "PER HOUR", "PER TFLOPS-H", "FREE", "NOW"],
          ([r["instance_type"], r["gpu_model"], r["gpus"], r["vcpus"], r["memory_gib"], r["region"],
            f"{float(r['per_hour']):.2f} {r['currency']}", f"{float(r['per_tflops_hour']):.5f}",
            "?" if r["available"] is None else r["available"], r["availability"] or "?"] for r in rows),
          empty="No offers match." if show_all else "No offers match (those this fleet can never run are "
                                                     "hidden: --all shows them).")


# --- instances ---------------------------------------------------------------------------------

def _find(resource: Any, name: str) -> dict[str, Any]:
    return resource.find(name)  # type: ignore[no-any-return]


def _read_key(path: str) -> str:
    p = Path(path).expanduser()
    try:
        text = p.read_text().strip()
    except OSError as exc:
        fail(EXIT_USAGE, f"--ssh-key {path}: {exc.strerror}.")
    if p.suffix != ".pub" and "PRIVATE KEY" in text:
        fail(EXIT_USAGE, f"--ssh-key {path} is a private key; give the .pub file.")
    return text


def _default_ssh_keys() -> list[str]:
    for name in ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub"):
        p = Path.home() / ".ssh" / name
        if p.is_file():
            return [p.read_text().strip()]
    return []


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(EXIT_USAGE, f"--env wants KEY=VALUE (got {pair!r}).")
        env[key] = value
    return env


def _pick_region(gc: Client, instance_type: str, spot: bool) -> str:
    kind = "spot" if spot else "on_demand"
    it = gc.instance_types.get(instance_type)
    prices = sorted((p for p in it.get("prices", []) if p["kind"] == kind), key=lambda p: float(p["per_hour"]))
    if not prices:
        fail(EXIT_USAGE, f"{instance_type} has no {kind.replace('_', '-')} price in any region.")
    try:  # runnable first: where it would start now, then where it would queue; cheapest within each
        now = {a["region"]: a for a in gc.availability.list(instance_type=instance_type)}
    except errors.NotFound:  # a server without the availability API: the cheapest
        return str(prices[0]["region"])
    rank = {"available": 0, "busy": 1, "never": 2}
    prices.sort(key=lambda p: rank.get(_availability(now.get(p["region"])), 0))
    return str(prices[0]["region"])


def _describe(w: dict[str, Any]) -> str:
    parts = [w["state"]]
    if w.get("queue_position"):
        parts.append(f"queue position {w['queue_position']}")
    if w.get("reason"):
        parts.append(w["reason"])
    if w.get("host"):
        parts.append(f"on {w['host']}")
    return " — ".join(parts)


def _wait(resource: Any, w: dict[str, Any], targets: set[str], timeout: float, quiet: bool) -> dict[str, Any]:
    """Poll to one of `targets` with a live progress line (a line per change when not a terminal)."""
    seen: list[str] = []

    def show(cur: dict[str, Any]) -> None:
        line = _describe(cur)
        if not seen or seen[-1] != line:
            seen.append(line)
            if not quiet and not err.is_terminal:
                err.print(f"{cur['name']}: {line}", highlight=False)
        if status is not None:
            status.update(f"{cur['name']}: {line}")

    status = err.status(f"{w['name']}: {_describe(w)}") if err.is_terminal and not quiet else None
    try:
        if status is not None:
            status.start()
        return resource.wait_for(w["id"], targets, timeout=timeout, poll=1.0, on_poll=show)  # type: ignore[no-any-return]
    finally:
        if status is not None:
            status.stop()


def _connect_lines(w: dict[str, Any]) -> list[str]:
    c = w.get("connect") or {}
    lines = []
    if c.get("ssh"):
        lines.append(f"ssh:     gpucloud ssh {w['name']}      (or: {c['ssh']})")
    for port, url in sorted((c.get("urls") or {}).items()):
        lines.append(f"port {port}: {url}   (or: gpucloud forward {w['name']} {port})")
    if not c:
        lines.append(f"status:  gpucloud show {w['name']}   logs: gpucloud logs {w['name']} -f")
        for port in w.get("ports") or []:
            lines.append(f"port {port}: gpucloud forward {w['name']} {port}  (once the server has the gateway)")
    return lines


@app.command()
def launch(
    instance_type: Annotated[str, typer.Argument(metavar="TYPE", help="Instance type code, e.g. h100.1x.")],
    name: Annotated[str | None, typer.Option(help="Name (default: TYPE-xxxx).")] = None,
    region: Annotated[str | None, typer.Option(
        help="Region (default: where TYPE would start now, else where it would queue; the cheapest of those).")] = None,
    image: Annotated[str, typer.Option(help="Container image.")] = "ubuntu:24.04",
    volume: Annotated[list[str] | None, typer.Option(
        "--volume", help="VOLUME:/path to mount (name or id); repeatable.")] = None,
    port: Annotated[list[int] | None, typer.Option("--port", help="A port to expose; repeatable.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE; repeatable.")] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Spot billing: cheaper, may be preempted.")] = False,
    max_price: Annotated[str | None, typer.Option(help="Spot only: the most you pay per hour.")] = None,
    ssh_key: Annotated[list[str] | None, typer.Option(
        "--ssh-key", help="A public key file; repeatable (default: ~/.ssh/id_ed25519.pub if any).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until it runs, then print how to connect.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 600.0,
    as_json: JsonOpt = False,
    command: Annotated[list[str] | None, typer.Argument(help="Command after --, e.g. -- jupyter lab.")] = None,
) -> None:
    """Launch an instance.

    Examples:

        gpucloud launch h100.1x --port 8888 --image jupyter/base-notebook --wait
        gpucloud launch l40s.quarter --spot --max-price 0.40 --region eu-west-1
        gpucloud launch h100.8x --volume datasets:/data --ssh-key ~/.ssh/id_ed25519.pub --wait
    """
    if max_price is not None and not spot:
        fail(EXIT_USAGE, "--max-price is for spot instances: add --spot.")
    keys = [_read_key(k) for k in ssh_key] if ssh_key else _default_ssh_keys()
    with client() as gc:
        mounts = []
        for spec in volume or []:
            vol, sep, path = spec.partition(":")
            if not sep or not path.startswith("/"):
                fail(EXIT_USAGE, f"--volume wants VOLUME:/path (got {spec!r}).")
            mounts.append({"volume": gc.volumes.find(vol)["id"], "mount_path": path})
        region = region or _pick_region(gc, instance_type, spot)
        w = gc.instances.create(
            name=name or f"{instance_type.replace('.', '-')}-{secrets.token_hex(2)}", instance_type=instance_type,
            region=region, image=image, command=command or None, env=_env_pairs(env or []) or None,
            ports=port or None, ssh_keys=keys or None, billing="spot" if spot else None, max_price=max_price,
            volumes=mounts or None)
        if not as_json:
            err.print(f"Launched {w['name']} ({w['id']}): {w['instance_type']} in {w['region']}, "
                      f"{_describe(w)}", highlight=False)
        if wait:
            w = _wait(gc.instances, w, {"running"}, timeout, as_json)
    if as_json:
        emit_json(w)
        return
    if wait:
        out.print(Text.assemble(bold(w['name']), f" is running on {w.get('host')}."))
        for line in _connect_lines(w):
            out.print("  " + line, highlight=False)


def _workload_rows(items: Iterable[dict[str, Any]]) -> Iterable[list[Any]]:
    for w in items:
        yield [w["name"], w["state"], w["instance_type"], w["region"], w.get("host") or "",
               _money(w.get("hourly_cost")), _money(w.get("cost_so_far")), _short(w.get("created_at")),
               w["id"]]


@app.command("ls")
def ls(
    state: Annotated[list[str] | None, typer.Option("--state", help="Only these states; repeatable.")] = None,
    active: Annotated[bool, typer.Option("--active", help="Hide stopped, failed, ... instances.")] = False,
    wide: WideOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Your instances. Names and ids are shown whole (`--wide`: nothing wraps).

    Examples: `gpucloud ls`, `gpucloud ls --state running --json`, `gpucloud ls --wide | less -S`
    """
    with client() as gc:
        items = [w for w in gc.instances.list(state=state or None)
                 if not (active and w["state"] in TERMINAL_STATES)]
    if as_json:
        emit_json(items)
        return
    table(["NAME", "STATE", "TYPE", "REGION", "HOST", "PER HOUR", "COST", "CREATED", "ID"], _workload_rows(items),
          empty="No instances. Launch one: gpucloud launch TYPE", wide=wide)


def _show(w: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(w)
        return
    fields = ["id", "name", "kind", "state", "reason", "queue_position", "instance_type", "region", "image",
              "command", "ports", "billing", "priority", "max_price", "host", "gpus", "hourly_cost", "cost_so_far",
              "created_at", "started_at", "ended_at", "stop_by", "queue", "nodes", "retries", "max_retries",
              "exit_code", "checkpoint", "attained_gpu_s"]
    t = Table(box=None, show_header=False, pad_edge=False)
    for f in fields:
        if f in w and w[f] not in (None, "", [], {}):
            v = w[f]
            if f == "checkpoint":
                v = f"{v.get('signal')}, then {v.get('grace_s')} s to save before a preemption stops it"
            t.add_row(f, " ".join(v) if f == "command" else ", ".join(map(str, v)) if isinstance(v, list) else str(v))
    out.print(t)
    if w.get("connect"):
        out.print(Text.assemble("\n", bold("connect")))
        for line in _connect_lines(w):
            out.print("  " + line, highlight=False)
    if w.get("events"):
        out.print(Text.assemble("\n", bold("events")))
        table(["AT", "FROM", "TO", "REASON"], ([_short(e["created_at"]), e["from_state"], e["to_state"],
                                                e.get("reason", "")] for e in w["events"]))
    if w.get("container_events"):  # its container lost or restarted without its agent's order
        out.print("\n[bold]container events[/bold]")
        table(["AT", "EVENT", "COUNT", "WHAT THE AGENT SAW"],
              ([_short(e["created_at"]), e["kind"], str(e["count"]), e.get("detail", "")]
               for e in w["container_events"]))


@app.command()
def show(name: Annotated[str, typer.Argument(help="Instance name or id.")], as_json: JsonOpt = False) -> None:
    """One instance: state and reason, host, GPUs, cost, its timeline.

    Example: `gpucloud show train-1 --json`
    """
    with client() as gc:
        w = gc.instances.get(_find(gc.instances, name)["id"])
    _show(dict(w), as_json)


@app.command()
def stop(name: Annotated[str, typer.Argument(help="Instance name or id.")],
         wait: Annotated[bool, typer.Option("--wait", help="Wait until it has stopped.")] = False,
         timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 300.0,
         as_json: JsonOpt = False) -> None:
    """Stop an instance (its GPUs are freed; billing stops).

    Example: `gpucloud stop train-1 --wait`
    """
    with client() as gc:
        w = gc.instances.stop(_find(gc.instances, name)["id"])
        if wait:
            w = _wait(gc.instances, w, set(TERMINAL_STATES), timeout, as_json)
    if as_json:
        emit_json(w)
    else:
        out.print(f"{w['name']}: {_describe(w)}", highlight=False)


@app.command()
def start(name: Annotated[str, typer.Argument(help="Instance name or id.")],
          wait: Annotated[bool, typer.Option("--wait", help="Wait until it runs.")] = False,
          timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 600.0,
          as_json: JsonOpt = False) -> None:
    """Start a stopped instance again: back through the queue with the same configuration.

    Example: `gpucloud start train-1 --wait`
    """
    with client() as gc:
        w = gc.instances.start(_find(gc.instances, name)["id"])
        if wait:
            w = _wait(gc.instances, w, {"running"}, timeout, as_json)
    if as_json:
        emit_json(w)
    else:
        out.print(f"{w['name']}: {_describe(w)}", highlight=False)


@app.command()
def rm(name: Annotated[str, typer.Argument(help="Instance name or id.")]) -> None:
    """Terminate an instance and remove it from your lists (billing keeps its history).

    Example: `gpucloud rm train-1`
    """
    with client() as gc:
        w = _find(gc.instances, name)
        gc.instances.delete(w["id"])
    out.print(f"Removed {w['name']} ({w['id']}).", highlight=False)


def _new_lines(old: list[str], new: list[str]) -> list[str]:
    """The lines of a fresh tail `new` not already shown at the end of `old`."""
    for k in range(min(len(old), len(new)), 0, -1):
        if old[-k:] == new[:k]:
            return new[k:]
    return new


def _logs(resource: Any, name: str, follow: bool, tail: int, wait_s: float = 5.0) -> None:
    with client() as gc:
        res = getattr(gc, resource)
        w = _find(res, name)
        shown: list[str] = []
        deadline = time.monotonic() + wait_s
        while True:
            answer = res.logs(w["id"], tail=tail)
            if answer.get("pending") and not follow and not shown and time.monotonic() < deadline:
                # the agent sends a fresh tail with its next heartbeat: give it a moment
                gc.sleep(0.5)
                continue
            lines = (answer.get("text") or "").splitlines()
            fresh = _new_lines(shown, lines)
            for line in fresh:
                sys.stdout.write(line + "\n")
            sys.stdout.flush()
            shown = (shown + fresh)[-max(tail, 1000):]
            if not follow:
                return
            if res.get(w["id"])["state"] in TERMINAL_STATES and not answer.get("pending"):
                return
            gc.sleep(1.0)


@app.command()
def logs(name: Annotated[str, typer.Argument(help="Instance name or id.")],
         follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = False,
         tail: Annotated[int, typer.Option(help="Lines (1..10000).")] = 100) -> None:
    """The latest lines of an instance's container log.

    Examples: `gpucloud logs train-1`, `gpucloud logs train-1 -f`
    """
    _logs("instances", name, follow, tail)


# --- connect through the gateway ----------------------------------------------------------------------

def _connect(gc: Client, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    w = gc.instances.get(_find(gc.instances, name)["id"])
    c = w.get("connect")
    if "connect" not in w:
        fail(EXIT_API, "This server does not support connecting through the gateway yet "
                       "(instances carry no `connect`).")
    if w["state"] != "running" or not c:
        fail(EXIT_API, f"{w['name']} is {w['state']}: it can be reached once it runs.")
    return dict(w), c


def fingerprint(public_key_line: str) -> str:
    """OpenSSH's SHA256 fingerprint of `type base64 [comment]` (as `ssh-keygen -lf` prints it)."""
    blob = base64.b64decode(public_key_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def known_hosts_path() -> Path:
    return config.config_path().parent / "known_hosts"


def _host_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def pin_host_key(c: dict[str, Any], keyscan: Callable[[str, int], list[str]] | None = None) -> Path:
    """Write the gateway's host key to our own known_hosts, so ssh checks it strictly.

    With `host_key` given we write it; with only `host_key_fingerprint` we scan the gateway and
    keep the key whose fingerprint matches (none matching: refuse, it is not the gateway)."""
    host, port = c["ssh_host"], int(c.get("ssh_port") or 22)
    lines: list[str] = []
    if c.get("host_key"):
        lines = [c["host_key"].strip()]
    elif c.get("host_key_fingerprint"):
        scanned = (keyscan or _keyscan)(host, port)
        lines = [k for k in scanned if fingerprint(k) == c["host_key_fingerprint"]]
        if not lines:
            fail(EXIT_API, f"The gateway {host}:{port} did not show the host key the server names "
                           f"({c['host_key_fingerprint']}): refusing to connect.")
    path = known_hosts_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    entry = _host_entry(host, port)
    keep = []
    if path.exists():
        keep = [ln for ln in path.read_text().splitlines() if ln.split(" ", 1)[0] != entry]
    keep += [f"{entry} {' '.join(k.split()[:2])}" for k in lines]
    path.write_text("\n".join(keep) + "\n")
    path.chmod(0o600)
    return path


def _keyscan(host: str, port: int) -> list[str]:
    try:
        done = subprocess.run(["ssh-keyscan", "-p", str(port), "-T", "10", host], capture_output=True,
                              text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        fail(EXIT_API, f"ssh-keyscan {host}:{port} failed: {exc}")
    return [" ".join(ln.split()[1:]) for ln in done.stdout.splitlines() if ln and not ln.startswith("#")]


def ssh_argv(c: dict[str, Any], known_hosts: Path, *, extra: list[str] | None = None,
             command: list[str] | None = None) -> list[str]:
    """The `ssh` command line that reaches an instance through the gateway."""
    argv = ["ssh", "-p", str(int(c.get("ssh_port") or 22)),
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
            *(extra or []), f"{c['ssh_user']}@{c['ssh_host']}"]
    if command:
        argv += ["--", *command]
    return argv


def _exec(argv: list[str], dry_run: bool) -> None:
    if dry_run:
        sys.stdout.write(shlex.join(argv) + "\n")
        return
    exe = shutil.which(argv[0])
    if exe is None:
        fail(EXIT_API, f"{argv[0]} is not installed (OpenSSH client).")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, argv)


IdentityOpt = Annotated[Path | None, typer.Option(
    "--identity", "-i", help="The private key to log in with (as `ssh -i`); only it is offered.",
    show_default=False)]


def identity_args(identity: Path | None) -> list[str]:
    """`ssh -i KEY -o IdentitiesOnly=yes`: offer that key alone (an agent full of keys would
    otherwise hit the gateway's limit of attempts before it)."""
    if identity is None:
        return []
    key = identity.expanduser()
    if key.suffix == ".pub":
        fail(EXIT_USAGE, f"--identity wants the private key, not {key} (try {key.with_suffix('')}).")
    if not key.is_file():
        fail(EXIT_USAGE, f"--identity: no such key file: {key}")
    return ["-i", str(key), "-o", "IdentitiesOnly=yes"]


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(name: Annotated[str, typer.Argument(help="Instance name or id.")],
        command: Annotated[list[str] | None, typer.Argument(help="A command after --.")] = None,
        identity: IdentityOpt = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the ssh command line, run nothing.")] = False,
        ) -> None:
    """Open a shell on a running instance through the gateway (execs the system `ssh`).

    The gateway's host key is checked strictly (pinned in ~/.config/gpucloud/known_hosts).

    Examples:

        gpucloud ssh train-1
        gpucloud ssh train-1 -i ~/.ssh/id_ed25519
        gpucloud ssh train-1 -- nvidia-smi
        gpucloud ssh train-1 --dry-run
    """
    extra = identity_args(identity)
    with client() as gc:
        _, c = _connect(gc, name)
    _exec(ssh_argv(c, pin_host_key(c), extra=extra, command=command), dry_run)


@app.command()
def forward(name: Annotated[str, typer.Argument(help="Instance name or id.")],
            port: Annotated[int, typer.Argument(help="The instance's port.")],
            local_port: Annotated[int | None, typer.Option("--local", help="Local port (default: the same).")] = None,
            identity: IdentityOpt = None,
            dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the ssh command line.")] = False,
            ) -> None:
    """Forward a port of a running instance to localhost through the gateway (ssh -L).

    Example: `gpucloud forward train-1 8888` then open http://127.0.0.1:8888
    """
    if not 1 <= port <= 65535:
        fail(EXIT_USAGE, "PORT must be 1..65535.")
    with client() as gc:
        w, c = _connect(gc, name)
    url = (c.get("urls") or {}).get(str(port))
    if url:
        err.print(f"{w['name']}:{port} is also published at {url}", highlight=False)
    err.print(f"Forwarding 127.0.0.1:{local_port or port} → {w['name']}:{port} (Ctrl-C ends it).")
    _exec(ssh_argv(c, pin_host_key(c), extra=[*identity_args(identity), "-N", "-L",
                                              f"127.0.0.1:{local_port or port}:127.0.0.1:{port}"]),
          dry_run)


# --- jobs ---------------------------------------------------------------------------------------------

@jobs_app.command("submit")
def jobs_submit(
    instance_type: Annotated[str, typer.Option("--type", "-t", help="Instance type code, e.g. h100.8x.")],
    image: Annotated[str, typer.Option("--image", "-i", help="Container image.")],
    command: Annotated[list[str], typer.Argument(help="The command, after --.")],
    name: Annotated[str | None, typer.Option(help="Name (default: job-xxxx).")] = None,
    region: Annotated[str | None, typer.Option(
        help="Region (default: where the type would start now, else queue; the cheapest of those).")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE; repeatable.")] = None,
    nodes: Annotated[int | None, typer.Option(help="Hosts for a multi-node job.")] = None,
    max_retries: Annotated[int | None, typer.Option(help="Retries after a failure.")] = None,
    timeout_s: Annotated[int | None, typer.Option("--timeout-s", help="Kill it after this many seconds.")] = None,
    queue: Annotated[str | None, typer.Option(help="Queue name.")] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Spot billing.")] = False,
    array: Annotated[int | None, typer.Option(
        "--array", help="Submit N tasks as one job array (1..10000); each gets GPUCLOUD_ARRAY_INDEX 0..N-1.")] = None,
    checkpoint_signal: Annotated[str | None, typer.Option(
        "--checkpoint-signal", help="On preemption send this signal (SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, "
                                    "SIGQUIT) so the job saves its progress; it resumes when requeued. "
                                    "With --checkpoint-grace.")] = None,
    checkpoint_grace: Annotated[int | None, typer.Option(
        "--checkpoint-grace", help="Seconds (1..3600) between the checkpoint signal and the stop.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until it ends; exit 1 unless it succeeded.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 3600.0,
    as_json: JsonOpt = False,
) -> None:
    """Submit a batch job.

    Examples:

        gpucloud jobs submit --type h100.8x --image pytorch/pytorch:2.4.0 -- python train.py --epochs 3
        gpucloud jobs submit -t l40s.1x -i alpine --wait -- sh -c 'echo hi'
        gpucloud jobs submit -t h100.1x -i busybox --array 100 -- sh -c 'echo $GPUCLOUD_ARRAY_INDEX'
        gpucloud jobs submit -t h100.8x -i trainer:1 --checkpoint-signal SIGUSR1 --checkpoint-grace 60 -- python t.py
    """
    with client() as gc:
        region = region or _pick_region(gc, instance_type, spot)
        w = gc.jobs.create(name=name or f"job-{secrets.token_hex(2)}", instance_type=instance_type, region=region,
                           image=image, command=command, env=_env_pairs(env or []) or None, nodes=nodes,
                           max_retries=max_retries, timeout_s=timeout_s, queue=queue,
                           billing="spot" if spot else None, array=array, checkpoint_signal=checkpoint_signal,
                           checkpoint_grace_s=checkpoint_grace)
        if array is not None:
            if wait:
                w = _wait_array(gc, w, timeout, as_json)
            if as_json:
                emit_json(w)
            else:
                out.print(f"{'Array' if wait else 'Submitted array'} {w['name']} ({w['id']}): {w['count']} tasks, "
                          f"{_counts(w)}", highlight=False)
            if wait and w["state"] != "succeeded":
                raise typer.Exit(EXIT_API)
            return
        if not as_json:
            err.print(f"Submitted {w['name']} ({w['id']}): {_describe(w)}", highlight=False)
        if wait:
            w = _wait(gc.jobs, w, set(TERMINAL_STATES), timeout, as_json)
    if as_json:
        emit_json(w)
    elif wait:
        out.print(f"{w['name']}: {_describe(w)} (exit code {w.get('exit_code')})", highlight=False)
    if wait and w["state"] != "succeeded":
        raise typer.Exit(EXIT_API)


@jobs_app.command("ls")
def jobs_ls(state: Annotated[list[str] | None, typer.Option("--state", help="Only these states.")] = None,
            array: Annotated[str | None, typer.Option("--array", help="Only the tasks of this job array.")] = None,
            wide: WideOpt = False, as_json: JsonOpt = False) -> None:
    """Your batch jobs, then your job arrays (one row each; `--array ID` lists its tasks).

    Examples: `gpucloud jobs ls --state running`, `gpucloud jobs ls --array 3f2a…`
    """
    with client() as gc:
        if array is not None:
            items = list(gc.jobs.list(state=state or None, array=array))
            arrays: list[dict[str, Any]] = []
        else:
            items = list(gc.jobs.list(state=state or None, in_array=False))
            arrays = [dict(a) for a in gc.job_arrays.list()]
    if as_json:
        emit_json(items)  # a list of jobs, as every listing: its stable shape (arrays: `--array ID`)
        return
    if array is not None:
        table(["INDEX", "STATE", "HOST", "RETRIES", "EXIT", "COST", "ID"],
              ([j.get("array_index"), j["state"], j.get("host") or "", j.get("retries"), j.get("exit_code"),
                _money(j.get("cost_so_far")), j["id"]] for j in sorted(items, key=lambda j: j.get("array_index") or 0)),
              empty="No tasks.", wide=wide)
        return
    table(["NAME", "STATE", "TYPE", "REGION", "NODES", "RETRIES", "EXIT", "COST", "CREATED", "ID"],
          ([j["name"], j["state"], j["instance_type"], j["region"], j.get("nodes"), j.get("retries"),
            j.get("exit_code"), _money(j.get("cost_so_far")), _short(j.get("created_at")), j["id"]] for j in items),
          empty="No jobs. Submit one: gpucloud jobs submit --type T --image I -- CMD" if not arrays else "", wide=wide)
    if arrays:
        out.print()
        table(["ARRAY", "STATE", "TASKS", "BY STATE", "CREATED", "ID"],
              ([a["name"], a["state"], a["count"], _counts(a), _short(a.get("created_at")), a["id"]] for a in arrays),
              wide=wide)


def _counts(a: dict[str, Any]) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted((a.get("counts") or {}).items())) or "none"


def _wait_array(gc: Client, a: Any, timeout: float, as_json: bool) -> dict[str, Any]:
    """Poll the array until every task has ended (raise WaitTimeout after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while a["state"] in ("pending", "running"):
        if time.monotonic() >= deadline:
            raise errors.WaitTimeout(f"array {a['name']} is still {a['state']} after {timeout:g} s.", last=dict(a))
        gc.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        a = gc.job_arrays.get(a["id"])
        if not as_json:
            err.print(f"{a['name']}: {_counts(a)}", highlight=False)
    return dict(a)


@jobs_app.command("stop-array")
def jobs_stop_array(array_id: Annotated[str, typer.Argument(help="The job array's id.")],
                    as_json: JsonOpt = False) -> None:
    """Stop every task of a job array. Example: `gpucloud jobs stop-array 3f2a…`"""
    with client() as gc:
        a = gc.job_arrays.stop(array_id)
    if as_json:
        emit_json(a)
    else:
        out.print(f"{a['name']}: {_counts(a)}", highlight=False)


@jobs_app.command("show")
def jobs_show(name: Annotated[str, typer.Argument(help="Job name or id.")], as_json: JsonOpt = False) -> None:
    """One job with its timeline. Example: `gpucloud jobs show train-42`"""
    with client() as gc:
        w = gc.jobs.get(_find(gc.jobs, name)["id"])
    _show(dict(w), as_json)


@jobs_app.command("logs")
def jobs_logs(name: Annotated[str, typer.Argument(help="Job name or id.")],
              follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
              tail: Annotated[int, typer.Option(help="Lines (1..10000).")] = 100) -> None:
    """A job's log. Example: `gpucloud jobs logs train-42 -f`"""
    _logs("jobs", name, follow, tail)


@jobs_app.command("stop")
def jobs_stop(name: Annotated[str, typer.Argument(help="Job name or id.")], as_json: JsonOpt = False) -> None:
    """Cancel a queued job or stop a running one. Example: `gpucloud jobs stop train-42`"""
    with client() as gc:
        w = gc.jobs.stop(_find(gc.jobs, name)["id"])
    if as_json:
        emit_json(w)
    else:
        out.print(f"{w['name']}: {_describe(w)}", highlight=False)


@jobs_app.command("rm")
def jobs_rm(name: Annotated[str, typer.Argument(help="Job name or id.")]) -> None:
    """Remove a job from your lists. Example: `gpucloud jobs rm train-42`"""
    with client() as gc:
        w = _find(gc.jobs, name)
        gc.jobs.delete(w["id"])
    out.print(f"Removed {w['name']} ({w['id']}).", highlight=False)


# --- volumes ------------------------------------------------------------------------------------------

@volumes_app.command("ls")
def volumes_ls(as_json: JsonOpt = False) -> None:
    """Your volumes. Example: `gpucloud volumes ls --json`"""
    with client() as gc:
        items = list(gc.volumes.list())
    if as_json:
        emit_json(items)
        return
    table(["NAME", "SIZE GiB", "REGION", "STATE", "ID"],
          ([v.get("name"), v.get("size_gib"), v.get("region"), v.get("state", ""), v.get("id")] for v in items),
          empty="No volumes. Create one: gpucloud volumes create NAME --size 100 --region R")


@volumes_app.command("create")
def volumes_create(name: Annotated[str, typer.Argument()],
                   size: Annotated[int, typer.Option("--size", help="GiB.")],
                   region: Annotated[str, typer.Option(help="Region.")],
                   as_json: JsonOpt = False) -> None:
    """Create a volume. Example: `gpucloud volumes create datasets --size 500 --region us-east-1`"""
    with client() as gc:
        v = gc.volumes.create(name=name, size_gib=size, region=region)
    if as_json:
        emit_json(v)
    else:
        out.print(f"Created volume {v.get('name')} ({v.get('id')}).", highlight=False)


@volumes_app.command("show")
def volumes_show(name: Annotated[str, typer.Argument(help="Volume name or id.")], as_json: JsonOpt = False) -> None:
    """One volume: size, host, what uses it, its events. Example: `gpucloud volumes show datasets`"""
    with client() as gc:
        v = gc.volumes.get(gc.volumes.find(name)["id"])
    if as_json:
        emit_json(v)
        return
    att = v.get("attached_to") or {}
    used = v.get("used_bytes")
    rows = [("name", v.get("name")), ("id", v.get("id")), ("region", v.get("region")),
            ("size", f"{v.get('size_gib')} GiB"), ("state", v.get("state")),
            ("host", v.get("host") or "none yet (chosen where it is first used)"),
            ("used", "not measured yet" if used is None else f"{used / 1024**3:.2f} GiB"),
            ("attached to", f"{att.get('kind')} {att.get('name')} at {att.get('mount_path')}" if att else "nothing")]
    for key, value in rows:
        out.print(f"{key:<12} {value}", highlight=False)
    for e in v.get("events") or []:
        out.print(f"{e.get('created_at')}  {e.get('kind')}: {e.get('message')}", highlight=False)


@volumes_app.command("resize")
def volumes_resize(name: Annotated[str, typer.Argument(help="Volume name or id.")],
                   size: Annotated[int, typer.Option("--size", help="The new size in GiB (only grows).")],
                   as_json: JsonOpt = False) -> None:
    """Grow a volume. Example: `gpucloud volumes resize datasets --size 1000`"""
    with client() as gc:
        v = gc.volumes.resize(gc.volumes.find(name)["id"], size_gib=size)
    if as_json:
        emit_json(v)
    else:
        out.print(f"Volume {v.get('name')} is now {v.get('size_gib')} GiB.", highlight=False)


@volumes_app.command("rm")
def volumes_rm(name: Annotated[str, typer.Argument(help="Volume name or id.")]) -> None:
    """Delete a volume. Example: `gpucloud volumes rm datasets`"""
    with client() as gc:
        v = gc.volumes.find(name)
        gc.volumes.delete(v["id"])
    out.print(f"Deleted volume {v.get('name')} ({v.get('id')}).", highlight=False)


# --- alarms -------------------------------------------------------------------------------------------

_COMPARISONS = {">": "gt", ">=": "ge", "<": "lt", "<=": "le"}


_PERIOD = re.compile(r"^\s*(\d+)\s*(s|m|min|h)?\s*$", re.IGNORECASE)


def period_seconds(text: str | int) -> int:
    """`--period` as the console takes it: `5m`, `300s`, `1h`, or bare seconds (the API's unit)."""
    m = _PERIOD.match(str(text))
    if not m:
        raise typer.BadParameter(f"write a period as 5m, 300s or 1h (got {text!r})")
    return int(m[1]) * {"s": 1, "m": 60, "min": 60, "h": 3600}[(m[2] or "s").lower()]


def period_words(seconds: Any) -> str:
    """The one unit alarm periods are shown in, here as on the console's pages: minutes."""
    s = int(seconds or 0)
    return f"{s // 60} min" if s % 60 == 0 else f"{s} s"


def _rule(a: dict[str, Any]) -> str:
    sign = {v: k for k, v in _COMPARISONS.items()}.get(a.get("comparison", ""), a.get("comparison"))
    return (f"{a.get('statistic')}({a.get('metric')}) {sign} {a.get('threshold'):g} for "
            f"{a.get('datapoints_to_alarm')} of {a.get('evaluation_periods')} x {period_words(a.get('period'))}")


@alarms_app.command("ls")
def alarms_ls(as_json: JsonOpt = False) -> None:
    """Your alarms and their states. Example: `gpucloud alarms ls`"""
    with client() as gc:
        items = list(gc.alarms.list())
    if as_json:
        emit_json(items)
        return
    table(["NAME", "STATE", "TARGET", "RULE", "SINCE", "ID"],
          ([a["name"], a["state"], f"{a['target_kind']} {a['target_id']}".strip(), _rule(a),
            _short(a.get("state_changed_at")), a["id"]] for a in items),
          empty="No alarms. Create one: gpucloud alarms create NAME --workload W --metric gpu_util --gt 80")


@alarms_app.command("create")
def alarms_create(
    name: Annotated[str, typer.Argument()],
    metric: Annotated[str, typer.Option(help="gpu_util, gpu_mem_used, gpu_temp, power, cost_rate (a workload); "
                                             "spend_rate, queued_gpus, queue_wait (--tenant).")],
    threshold: Annotated[float, typer.Option(help="The value compared with.")],
    comparison: Annotated[str, typer.Option(help="gt, ge, lt, le (or >, >=, <, <=).")] = "gt",
    workload: Annotated[str | None, typer.Option(help="An instance's (or job's) name or id.")] = None,
    tenant: Annotated[bool, typer.Option("--tenant", help="Watch your tenant's metric.")] = False,
    stat: Annotated[str, typer.Option(help="avg, max, min, p95 or sum per period.")] = "avg",
    period: Annotated[int, typer.Option(
        parser=period_seconds, metavar="PERIOD",
        help="5m, 300s or 1h (a bare number is seconds); whole minutes.")] = 60,
    periods: Annotated[int, typer.Option(help="Evaluation periods (N).")] = 1,
    datapoints: Annotated[int | None, typer.Option(help="Datapoints to alarm (M of N; default N).")] = None,
    missing: Annotated[str, typer.Option(help="missing, ignore, breaching or not_breaching.")] = "missing",
    webhook: Annotated[list[str] | None, typer.Option(help="POST signed state changes here (repeatable).")] = None,
    email: Annotated[bool, typer.Option("--email", help="E-mail the tenant's owners and admins.")] = False,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the workload when the alarm fires.")] = False,
    on_ok: Annotated[bool, typer.Option("--on-ok", help="Also e-mail/POST when it returns to OK.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Create an alarm.

    Example: `gpucloud alarms create hot --workload nb --metric gpu_util --threshold 80 --periods 2 --webhook https://x`
    """
    if tenant == (workload is not None):
        fail(EXIT_USAGE, "Give either --workload NAME or --tenant.")
    notify: list[dict[str, Any]] = [{"type": "webhook", "url": u} for u in webhook or []]
    if email:
        notify.append({"type": "email"})
    with client() as gc:
        target_id = None
        if workload is not None:
            try:
                target_id = gc.instances.find(workload)["id"]
            except errors.NotFound:
                target_id = gc.jobs.find(workload)["id"]
        a = gc.alarms.create(name=name, target_kind="tenant" if tenant else "workload", target_id=target_id,
                             metric=metric, threshold=threshold, comparison=_COMPARISONS.get(comparison, comparison),
                             statistic=stat, period=period, evaluation_periods=periods,
                             datapoints_to_alarm=datapoints or periods, treat_missing_data=missing,
                             actions={"alarm": notify + ([{"type": "stop_workload"}] if stop else []),
                                      "ok": notify if on_ok else []})
    if as_json:
        emit_json(a)
        return
    out.print(f"Created alarm {a['name']} ({a['id']}): {_rule(a)}.", highlight=False)
    if webhook:
        out.print(f"Webhook signing secret (shown once): {a['webhook_secret']}", highlight=False)


@alarms_app.command("show")
def alarms_show(name: Annotated[str, typer.Argument(help="Alarm name or id.")], as_json: JsonOpt = False) -> None:
    """An alarm, its last datapoints and its history. Example: `gpucloud alarms show hot`"""
    with client() as gc:
        a = gc.alarms.find(name)
        history = list(gc.alarms.history(a["id"]))
    if as_json:
        emit_json({**a, "history": history})
        return
    out.print(f"{a['name']} ({a['id']}): {a['state']} since {_short(a.get('state_changed_at'))}", highlight=False)
    out.print(f"  {a['target_kind']} {a['target_id']}: {_rule(a)}, missing data: {a['treat_missing_data']}",
              highlight=False)
    out.print(f"  {a['state_reason']}", highlight=False)
    points = ", ".join("-" if d["value"] is None else f"{d['value']:g}" for d in a.get("datapoints") or [])
    out.print(f"  last datapoints: [{points}]", highlight=False)
    table(["WHEN", "FROM", "TO", "ACTIONS", "REASON"],
          ([_short(h["created_at"]), h["old_state"], h["new_state"],
            ", ".join(f"{x['type']} {x['status']}" for x in h["actions"]), h["reason"]] for h in history),
          empty="No state changes yet.")


@alarms_app.command("rm")
def alarms_rm(name: Annotated[str, typer.Argument(help="Alarm name or id.")]) -> None:
    """Delete an alarm. Example: `gpucloud alarms rm hot`"""
    with client() as gc:
        a = gc.alarms.find(name)
        gc.alarms.delete(a["id"])
    out.print(f"Deleted alarm {a['name']} ({a['id']}).", highlight=False)


# --- billing ------------------------------------------------------------------------------------------

_MONTH = re.compile(r"^(\d{4})-(\d{2})$")


@app.command()
def usage(
    month: Annotated[str | None, typer.Option(help="YYYY-MM (default: this month so far).")] = None,
    by: Annotated[str, typer.Option(help="instance_type, region, day or instance.")] = "instance_type",
    as_json: JsonOpt = False,
) -> None:
    """Metered usage and its cost.

    Examples: `gpucloud usage`, `gpucloud usage --month 2025-01 --by instance --json`
    """
    start = end = None
    if month:
        m = _MONTH.match(month)
        if not m or not 1 <= int(m[2]) <= 12:
            fail(EXIT_USAGE, f"--month wants YYYY-MM (got {month!r}).")
        y, mo = int(m[1]), int(m[2])
        start = f"{y:04d}-{mo:02d}-01T00:00:00Z"
        end = f"{y + mo // 12:04d}-{mo % 12 + 1:02d}-01T00:00:00Z"
    with client() as gc:
        u = gc.billing.usage(start=start, end=end, group_by=by)
    if as_json:
        emit_json(u)
        return
    out.print(f"Usage {_short(u.get('from'))} → {_short(u.get('to'))} by {u['group_by']}", highlight=False)
    rows = [[r["label"] or r["key"], r["gpu_hours"], r["seconds"], r["amount"]] for r in u["rows"]]
    storage = u.get("storage")  # volumes, per GiB-hour (servers before it sent none)
    if storage and (storage["seconds"] or Decimal(storage["amount"])):
        rows.append([f"storage ({storage['gib_hours']} GiB-h)", "", storage["seconds"], storage["amount"]])
    table([by.upper(), "GPU HOURS", "SECONDS", f"AMOUNT {u['currency']}"], rows, empty="No usage in this period.")
    out.print(f"total {u['total']} {u['currency']}", highlight=False)


@app.command()
def balance(as_json: JsonOpt = False) -> None:
    """Your prepaid balance, this month's spend and each budget's progress. Example: `gpucloud balance`"""
    with client() as gc:
        b = gc.billing.balance()
    if as_json:
        emit_json(b)
        return
    t = Table(box=None, show_header=False, pad_edge=False)
    for k, v in b.items():
        if not isinstance(v, (list, dict)):
            t.add_row(k, str(v))
    out.print(t)
    for budget in b.get("budgets") or []:
        out.print(f"budget {budget.get('name')}: " + ", ".join(f"{k} {v}" for k, v in budget.items() if k != "name"),
                  highlight=False)


@app.command()
def quotas(as_json: JsonOpt = False) -> None:
    """Your quotas beside current use. Example: `gpucloud quotas`"""
    with client() as gc:
        rows = gc.quotas.list()
    if as_json:
        emit_json(rows)
        return
    table(["GPU MODEL", "REGION", "MAX GPUS", "USED GPUS", "MAX INSTANCES", "USED", "SOURCE"],
          ([q["gpu_model"] or "*", q["region"] or "*", q["max_gpus"], q["used_gpus"], q["max_instances"],
            q["used_instances"], q["source"]] for q in rows))


# --- keys -----------------------------------------------------------------------------------------------

@keys_app.command("ls")
def keys_ls(as_json: JsonOpt = False) -> None:
    """Your tenant's API keys (never their secrets). Example: `gpucloud keys ls`"""
    with client() as gc:
        items = list(gc.api_keys.list())
    if as_json:
        emit_json(items)
        return
    table(["NAME", "PREFIX", "SCOPES", "CREATED", "EXPIRES", "LAST USED", "REVOKED", "ID"],
          ([k["name"], k["prefix"], ",".join(k["scopes"]), _short(k.get("created_at")), _short(k.get("expires_at")),
            _short(k.get("last_used_at")), _short(k.get("revoked_at")), k["id"]] for k in items))


@keys_app.command("create")
def keys_create(name: Annotated[str, typer.Argument()],
                scope: Annotated[list[str] | None, typer.Option("--scope", help="read, write or admin.")] = None,
                expires_at: Annotated[str | None, typer.Option(help="ISO 8601.")] = None,
                as_json: JsonOpt = False) -> None:
    """Create an API key; its secret is printed this once.

    Example: `gpucloud keys create ci --scope read --scope write`
    """
    with client() as gc:
        k = gc.api_keys.create(name=name, scopes=scope or None, expires_at=expires_at)
    if as_json:
        emit_json(k)
        return
    out.print(f"Created key {k['name']} ({k['id']}), scopes {','.join(k['scopes'])}. Its secret, shown once:",
              highlight=False)
    sys.stdout.write(k["secret"] + "\n")


def _key(gc: Client, name: str) -> dict[str, Any]:
    items = [k for k in gc.api_keys.list() if name in (k["id"], k["name"], k["prefix"])]
    if not items:
        fail(EXIT_NOT_FOUND, f"No API key named {name!r}.")
    if len(items) > 1:
        fail(EXIT_USAGE, f"{len(items)} keys match {name!r}: {', '.join(k['id'] for k in items)}; give the id.")
    return items[0]


@keys_app.command("revoke")
def keys_revoke(name: Annotated[str, typer.Argument(help="Key name, prefix or id.")]) -> None:
    """Revoke a key: it stops working at once. Example: `gpucloud keys revoke ci`"""
    with client() as gc:
        k = _key(gc, name)
        gc.api_keys.revoke(k["id"])
    out.print(f"Revoked {k['name']} ({k['id']}).", highlight=False)


@keys_app.command("rm")
def keys_rm(name: Annotated[str, typer.Argument(help="Key name, prefix or id.")]) -> None:
    """Delete a key. Example: `gpucloud keys rm ci`"""
    with client() as gc:
        k = _key(gc, name)
        gc.api_keys.delete(k["id"])
    out.print(f"Deleted {k['name']} ({k['id']}).", highlight=False)


# --- ssh keys -------------------------------------------------------------------------------------------

@ssh_keys_app.command("ls")
def ssh_keys_ls(as_json: JsonOpt = False) -> None:
    """Your SSH keys in this tenant. Example: `gpucloud ssh-keys ls`"""
    with client() as gc:
        items = list(gc.ssh_keys.list())
    if as_json:
        emit_json(items)
        return
    table(["NAME", "FINGERPRINT", "CREATED", "ID"],
          ([k["name"], k["fingerprint"], _short(k.get("created_at")), k["id"]] for k in items))


@ssh_keys_app.command("add")
def ssh_keys_add(file: Annotated[Path, typer.Argument(help="A public key file, e.g. ~/.ssh/id_ed25519.pub.")],
                 name: Annotated[str | None, typer.Option(help="Defaults to the file's name.")] = None,
                 as_json: JsonOpt = False) -> None:
    """Add a public key. Example: `gpucloud ssh-keys add ~/.ssh/id_ed25519.pub`"""
    try:
        public_key = file.expanduser().read_text().strip()
    except OSError as exc:
        fail(EXIT_USAGE, f"Cannot read {file}: {exc.strerror}.")
    with client() as gc:
        k = gc.ssh_keys.create(name=name or file.name, public_key=public_key)
    if as_json:
        emit_json(k)
        return
    out.print(f"Added {k['name']} ({k['fingerprint']}).", highlight=False)


@ssh_keys_app.command("rm")
def ssh_keys_rm(name: Annotated[str, typer.Argument(help="Key name, fingerprint or id.")]) -> None:
    """Remove a key. Example: `gpucloud ssh-keys rm laptop`"""
    with client() as gc:
        items = [k for k in gc.ssh_keys.list() if name in (k["id"], k["name"], k["fingerprint"])]
        if not items:
            fail(EXIT_NOT_FOUND, f"No SSH key named {name!r}.")
        if len(items) > 1:
            fail(EXIT_USAGE, f"{len(items)} SSH keys match {name!r}: {', '.join(k['id'] for k in items)}; give the id.")
        gc.ssh_keys.delete(items[0]["id"])
    out.print(f"Removed {items[0]['name']} ({items[0]['id']}).", highlight=False)


# --- entry point ----------------------------------------------------------------------------------------

def _api_error(e: errors.ApiError) -> str:
    lines = [f"Error: {e.message}" + (f" ({e.code})" if e.code not in ("error",) else "")]
    for field, problems in (e.fields or {}).items():
        lines.append(f"  {field}: {'; '.join(map(str, problems)) if isinstance(problems, list) else problems}")
    return "\n".join(lines)


from gpucloud_sdk.cli_groups import groups_app  # noqa: E402  (it builds on the helpers above)

app.add_typer(groups_app, name="groups")


def fence_examples(doc: str) -> str:
    """A help text whose indented example lines are a fenced code block. Typer's markdown help
    dedents every paragraph after the first on its own, so an indented block that follows
    "Examples:" lost its indent, became prose and ran its lines together."""
    lines: list[str] = []
    block: list[str] = []
    for line in inspect.cleandoc(doc).splitlines() + [""]:
        if line.startswith("    ") and line.strip():
            block.append(line[4:])
            continue
        if block:
            lines += ["```", *block, "```"]
            block = []
        lines.append(line)
    return "\n".join(lines).rstrip() + "\n"


def _keep_example_lines(typer_app: typer.Typer) -> None:
    for info in typer_app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if doc:
            info.help = fence_examples(doc)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _keep_example_lines(group.typer_instance)


_keep_example_lines(app)


def main(argv: list[str] | None = None) -> None:
    """The console script: map the SDK's errors to the documented exit codes."""
    code = EXIT_OK
    try:
        # standalone: usage errors exit 2 with typer's message, --help exits 0 (SystemExit passes)
        app(args=argv, prog_name="gpucloud")
    except Exit as e:
        code = e.code
        if e.message:
            err.print(f"Error: {e.message}", highlight=False, markup=False)
    except errors.AmbiguousName as e:
        code = EXIT_USAGE
        err.print(f"Error: {e}", highlight=False, markup=False)
    except errors.ServerLacks as e:
        code = EXIT_API
        err.print(f"Error: {e.message}", highlight=False, markup=False)
    except errors.NotFound as e:
        code = EXIT_NOT_FOUND
        err.print(_api_error(e), highlight=False, markup=False)
    except errors.ApiError as e:
        code = EXIT_API
        err.print(_api_error(e), highlight=False, markup=False)
    except errors.WaitTimeout as e:
        code = EXIT_TIMEOUT
        err.print(f"Error: {e}", highlight=False, markup=False)
    except errors.GpucloudError as e:
        code = EXIT_API
        err.print(f"Error: {e}", highlight=False, markup=False)
    sys.exit(code)

