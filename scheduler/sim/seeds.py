"""Repeat one simulator run over several seeds and summarise the demand marks.

    python -m scheduler.sim.seeds --seeds 42-51 -- --trace ... --setup fgd ...

Everything after ``--`` is a ``python -m scheduler.sim`` command line without
``--seed``. Prints one JSON line per seed, then one with the mean, min and max
of ``allocation_at_demand`` per mark (FGD reports the mean of 10 seeds, 42-51).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Sequence
from typing import Any

from .cli import add_arguments, run


def parse_seeds(spec: str) -> list[int]:
    """``42-51`` or ``1,5,9`` (or a mix: ``1,3-4``)."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part[1:]:
            a, b = part.split("-", 1) if not part.startswith("-") else (part, "")
            lo, hi = int(a), int(b)
            if hi < lo:
                raise ValueError(f"bad seed range {part!r}")
            out.extend(range(lo, hi + 1))
        else:
            out.append(int(part))
    if not out:
        raise ValueError("no seeds")
    return out


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    marks: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r["allocation_at_demand"].items():
            marks.setdefault(k, []).append(v)
    return {
        "seeds": [r["seed"] for r in rows],
        "allocation_at_demand": {
            k: {
                "mean": round(sum(v) / len(v), 4),
                "min": round(min(v), 4),
                "max": round(max(v), 4),
                "n": len(v),
            }
            for k, v in sorted(marks.items())
        },
        "placed_mean": round(sum(r["placed"] for r in rows) / len(rows), 1),
        "wall_s_total": round(sum(r["wall_s"] for r in rows), 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        own, rest = argv[:i], argv[i + 1 :]
    else:
        own, rest = argv, []
    p = argparse.ArgumentParser(prog="python -m scheduler.sim.seeds", description=__doc__)
    p.add_argument("--seeds", default="42-51")
    a = p.parse_args(own)
    sim = argparse.ArgumentParser(prog="python -m scheduler.sim")
    add_arguments(sim)
    rows = []
    for seed in parse_seeds(a.seeds):
        args = sim.parse_args([*rest, "--seed", str(seed)])
        args.json = True
        got = run(args, out=io.StringIO())
        row = {
            "seed": seed,
            "allocation_at_demand": got["allocation_at_demand"],
            "placed": got["placed"],
            "rejected": got["rejected"],
            "wall_s": got["wall_s"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps(summarise(rows)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
