"""Bring the hosts' names into the one form (agents.protocol.host_name_normalise) before the
constraint on it: "sec3-h1 " and "SEC3-H1" became second hosts that read as "sec3-h1".

A name that normalises cleanly takes that form. One that does not (other scripts' letters,
'_', inner spaces, control characters) or that would read like a name already taken is
repaired: outside characters become '-', and a clash gets the first 8 characters of the
host's id appended. Each rename is printed; the host's agent keeps working (its heartbeats
carry its id and token, not its name), and an operator may rename it in the admin.
"""

import re

from django.db import migrations

from agents.protocol import HOST_NAME_MAX_LEN, host_name_normalise

_OUTSIDE = re.compile(r"[^a-z0-9.-]+")


def repaired(name: str, host_id: str, taken: set[str]) -> str:
    """The name a host gets (pure; `taken` holds the names given so far)."""
    try:
        new = host_name_normalise(name)
    except ValueError:
        labels = _OUTSIDE.sub("-", name.strip().lower()).split(".")
        new = ".".join(x.strip("-")[:63].strip("-") for x in labels if x.strip("-"))
        new = new[:HOST_NAME_MAX_LEN].strip(".-")
        try:
            new = host_name_normalise(new)
        except ValueError:
            new = ""
        new = new or "host"
    if new in taken:
        new = f"{new[:HOST_NAME_MAX_LEN - 9].rstrip('.-')}-{host_id[:8]}"
    return new


def forwards(apps, schema_editor):
    Host = apps.get_model("agents", "Host")
    hosts = list(Host.objects.order_by("created_at", "id").only("id", "name"))
    # Names already in the one form keep it; the others yield to them.
    taken = {h.name for h in hosts if _is_normal(h.name)}
    for h in hosts:
        if _is_normal(h.name):
            continue
        new = repaired(h.name, str(h.id), taken)
        taken.add(new)
        Host.objects.filter(pk=h.pk).update(name=new)
        print(f"\n  host {h.id}: name {h.name!r} is now {new!r}", end="")


def _is_normal(name: str) -> bool:
    try:
        return host_name_normalise(name) == name
    except ValueError:
        return False


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0007_bootstraptoken_nonce_hash"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
