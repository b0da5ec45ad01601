"""Why a launch cannot start now: the one admission answer, as data, and its words.

    admission(...) ─▶ None: it starts now (or the scheduler places it in its next cycle)
         └▶ Blocker(code, params)
              refused at once (the API's 4xx, the console's disabled Launch button):
                email_unconfirmed 402 ─ insufficient_credit 402 ─ budget_exceeded 402
                quota_exceeded 400 ─ unsatisfiable 409
              waits in the queue (201; the workload's `reason`, the console's box):
                quota_full ─ no_capacity

Every face asks this one rule and prints `words(blocker)`: the console's cost box beside
the launch form, the API's error (`code` is the error code, the message the words), the
workload's waiting reason (the scheduler core's own `Wait` for budget, quota and capacity),
and so the CLI, which prints what the API said. The facts are gathered by
`scheduler/admission.py` (the launch service and the console) and by the snapshot (the
cycle); the order of the checks is this module's, so two faces cannot name two causes.

`availability` is the catalogue's one word for an offer (type x region) now: "available"
(something would start now), "busy" (some host could run it, none is free), "never" (no host of
the region could ever run it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

# Refused at once, with the HTTP status the API answers.
EMAIL_UNCONFIRMED: Final = "email_unconfirmed"
INSUFFICIENT_CREDIT: Final = "insufficient_credit"
BUDGET_EXCEEDED: Final = "budget_exceeded"
QUOTA_EXCEEDED: Final = "quota_exceeded"
UNSATISFIABLE: Final = "unsatisfiable"
# Waits in the queue.
QUOTA_FULL: Final = "quota_full"
NO_CAPACITY: Final = "no_capacity"

STATUS: Final[Mapping[str, int]] = {
    EMAIL_UNCONFIRMED: 402, INSUFFICIENT_CREDIT: 402, BUDGET_EXCEEDED: 402,
    QUOTA_EXCEEDED: 400, UNSATISFIABLE: 409,
}
# Billing's causes (pushed down onto the tenant row as a code: `Tenant.launch_blocked_reason`).
BILLING: Final = (EMAIL_UNCONFIRMED, INSUFFICIENT_CREDIT, BUDGET_EXCEEDED)

AVAILABLE: Final = "available"
BUSY: Final = "busy"
NEVER: Final = "never"
AVAILABILITIES: Final = (AVAILABLE, BUSY, NEVER)


@dataclass(frozen=True, slots=True)
class Blocker:
    """Why it cannot start now: a cause code and the numbers and names its words need."""

    code: str
    params: Mapping[str, object] = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        """Refused at once (a 4xx), rather than queued until the cause passes."""
        return self.code in STATUS

    @property
    def status(self) -> int:
        return STATUS.get(self.code, 201)


def billing_blocker(*, blocked: bool, code: str, budget: str = "") -> Blocker | None:
    """Billing's verdict as pushed down onto the tenant row (`launch_blocked`, its reason code of
    `BILLING`, the spent budget's name) as a blocker; None when it admits."""
    if not blocked:
        return None
    code = code or INSUFFICIENT_CREDIT  # a flag without its reason (rows from before the reason)
    return Blocker(code, {"budget": budget} if code == BUDGET_EXCEEDED and budget else {})


def quota_exceeded(*, need_milli: int, limit: int, gpu_model: str | None, region: str | None,
                   unit: str = "gpus") -> Blocker:
    """More GPUs than a quota allows at all (or a quota that allows no instance): no amount of
    waiting admits it."""
    return Blocker(QUOTA_EXCEEDED, {"need": need_milli, "max": limit, "unit": unit, "gpu_model": gpu_model,
                                    "region": region})


def quota_full(*, used: int, need: int, limit: int, unit: str, gpu_model: str | None,
               region: str | None) -> Blocker:
    """The quota fits it, but not beside what runs now. `unit`: "gpus" (used and need in
    milli-GPUs) or "instances" (counts)."""
    return Blocker(QUOTA_FULL, {"used": used, "need": need, "max": limit, "unit": unit,
                                "gpu_model": gpu_model, "region": region})


def no_capacity(*, region: str | None, gpu_model: str, gpus: int, share_milli: int = 1000,
                nodes: int = 1) -> Blocker:
    """No host has room for it now (some host could, later)."""
    return Blocker(NO_CAPACITY, {"region": region, "gpu_model": gpu_model, "gpus": gpus,
                                 "share_milli": share_milli, "nodes": nodes})


def unsatisfiable(*, instance_type: str, region: str, why: str) -> Blocker:
    """No host of the region could ever run it (`why`: the feasibility rule's words)."""
    return Blocker(UNSATISFIABLE, {"instance_type": instance_type, "region": region, "why": why})


def admission(*, billing: Blocker | None = None, quota: Blocker | None = None, never: Blocker | None = None,
              available_now: int | None = None, capacity: Blocker | None = None) -> Blocker | None:
    """The one rule: which cause stands in the way first, or None when nothing does.

    A quota the request can never fit comes first (asking less is the only remedy), then
    billing (nothing new launches, whatever it is), then a fleet that could never run it,
    then a quota full now, then capacity: `available_now` 0 (the scheduler's own count, when
    the caller has it) means it waits for `capacity`.
    """
    if quota is not None and quota.code == QUOTA_EXCEEDED:
        return quota
    if billing is not None:
        return billing
    if never is not None:
        return never
    if quota is not None:
        return quota
    if available_now is not None and available_now <= 0 and capacity is not None:
        return capacity
    return None


def availability(*, can_host: bool, available_now: int) -> str:
    """The catalogue's word for an offer now: available, busy or never."""
    if not can_host:
        return NEVER
    return AVAILABLE if available_now > 0 else BUSY


# ---------------------------------------------------------------- words (the edge)


def _gpus(milli: object) -> str:
    return f"{int(milli) / 1000:g}" if isinstance(milli, int) else str(milli)


def _scope(params: Mapping[str, object], noun: str) -> str:
    model = f"{params['gpu_model']} " if params.get("gpu_model") else ""
    where = f" in {params['region']}" if params.get("region") else ""
    return f"{model}{noun}{where}"


def needs_words(*, gpu_model: str, gpus: int, share_milli: int = 1000) -> str:
    """What one node needs free, in words ("2 free H100 GPUs", "a 25% share of an A100 GPU free")."""
    if gpus == 0 and share_milli == 0:
        return "room for work without GPUs"
    if gpus == 0:
        return f"a {share_milli / 10:g}% share of a {gpu_model} GPU free"
    return f"{gpus} free {gpu_model} GPU{'s' if gpus > 1 else ''}"


def words(b: Blocker) -> str:
    """The blocker in a person's words: the same sentence on every face."""
    p = b.params
    if b.code == EMAIL_UNCONFIRMED:
        return ("Your e-mail address is not confirmed yet, so your sign-up credit has not been granted: "
                "open the link we sent you, then launch.")
    if b.code == INSUFFICIENT_CREDIT:
        return ("Your balance is used up: add credit to launch. Running on-demand work stops after "
                "a grace period, spot work at once.")
    if b.code == BUDGET_EXCEEDED:
        name = f'The hard-stop budget "{p["budget"]}"' if p.get("budget") else "A hard-stop budget"
        return f"{name} is spent this month and stops new launches until next month or until it is raised."
    if b.code == QUOTA_EXCEEDED:
        if p.get("unit") == "instances":
            return f"quota: no {_scope(p, 'instances')} allowed"
        return (f"quota: this asks for {_gpus(p['need'])} {_scope(p, 'GPUs')} but the quota allows "
                f"{p['max']}")
    if b.code == QUOTA_FULL:
        if p.get("unit") == "instances":
            return (f"quota: {p['used']} of {p['max']} {_scope(p, 'instances')} running and this needs "
                    f"{p['need']} more")
        return (f"quota: {_gpus(p['used'])} of {p['max']} {_scope(p, 'GPUs')} in use and this needs "
                f"{_gpus(p['need'])} more")
    if b.code == NO_CAPACITY:
        where = f" in {p['region']}" if p.get("region") else ""
        needs = needs_words(gpu_model=str(p["gpu_model"]), gpus=int(str(p["gpus"])),
                            share_milli=int(str(p.get("share_milli", 1000))))
        nodes = int(str(p.get("nodes", 1)))
        if nodes > 1:
            return f"fewer than {nodes} hosts{where} have {needs}"
        return f"no host{where} has {needs}"
    if b.code == UNSATISFIABLE:
        return f"No host in {p['region']} can ever run {p['instance_type']}: {p['why']}."
    return b.code.replace("_", " ")


def sentence(b: Blocker) -> str:
    """`words` as a sentence of a page (a final full stop), the same words otherwise."""
    said = words(b)
    return said if said.endswith(".") else f"{said}."


def consequence(b: Blocker) -> str:
    """What happens to a launch now, after the words: refused, or queued until the cause passes."""
    if b.refused:
        return "A launch is refused."
    if b.code == QUOTA_FULL:
        return "A launch waits in the queue until your own work frees quota."
    return "A launch waits in the queue until GPUs free up."
