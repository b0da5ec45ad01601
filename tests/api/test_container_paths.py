"""Paths a tenant gives for inside a container: one rule, normal first, denied trees by component.

Issue 27, finding 3: `mount_path` compared the raw string with the system trees, so `/./proc`,
`/.`, `/./etc`, `/var/./run/docker.sock` and `/.../proc` were accepted; the runtime then
refused to start the container, over and over, with its GPUs held. Three kinds of test:

- a Hypothesis property of `gpucloud.lib.paths.container_path` over random path strings:
  nothing it accepts normalises into a denied tree, and what it accepts is already normal;
- the issue's reproductions through the API and the console's launch form: 400 in the one
  error shape, nothing created;
- the class: every writable field of every serializer and form that takes a path is one of
  the two path fields built on that rule (a new path field without it fails here).
"""
from __future__ import annotations

import importlib
import importlib.util
import posixpath
import re

import pytest
from django import forms
from django.apps import apps
from django.test import Client
from hypothesis import example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rest_framework import serializers

from frontend.forms import ContainerPathFormField
from gpucloud.api.serializers import ContainerPathField
from gpucloud.lib.paths import DENIED_TREES, PathError, container_path
from scheduler.models import Workload
from volumes.models import VolumeAttachment
from volumes.services import volume_create

# The issue's reproductions, and their near kin.
ESCAPES = ["/./proc", "/.", "/./etc", "/var/./run/docker.sock", "/.../proc", "/proc/../proc", "/data/../etc",
           "//proc", "/proc//self", "/", "/./", "/var/run/", "/ETC/../etc", "/..", "/data/\x00/x", "data",
           "./data", "/sys/.", "/dev/./shm"]


def _under_denied(path: str) -> bool:
    """The test's own oracle: is normpath(path) the root, or under a denied tree, by component?"""
    norm = posixpath.normpath("/" + path.lstrip("/"))  # as the runtime would resolve it inside the container
    norm = "/" + norm.lstrip("/")
    return norm == "/" or any(norm == d or norm.startswith(d + "/") for d in DENIED_TREES)


_PIECES = st.sampled_from(["", ".", "..", "...", "proc", "etc", "var", "run", "data", "x", "docker.sock",
                           "usr", "sys", "a-b_c.d", "\x00", " ", "//"])
_PATHS = st.one_of(
    st.text(alphabet="/._-ab\x00 prc", max_size=40),
    st.lists(_PIECES, max_size=8).map(lambda parts: "/" + "/".join(parts)),
    st.tuples(st.sampled_from(DENIED_TREES), st.lists(_PIECES, max_size=4)).map(
        lambda t: "/".join(p for p in t[1]) + t[0] if t[1] else t[0]),
    st.tuples(st.lists(_PIECES, max_size=3), st.sampled_from(DENIED_TREES)).map(
        lambda t: "/" + "/".join(t[0]) + t[1]),
)


@given(_PATHS)
@hsettings(max_examples=2000, deadline=None)
@example("/./proc")
@example("/var/./run/docker.sock")
@example("/.../proc")
@example("/workspace/")
def test_no_accepted_path_normalises_into_a_denied_tree_and_every_accepted_path_is_normal(raw):
    try:
        got = container_path(raw)
    except PathError:
        return
    assert got == posixpath.normpath(got) and got.startswith("/") and "//" not in got, (raw, got)
    assert not _under_denied(raw) and not _under_denied(got), (raw, got)
    assert all(set(part) != {"."} for part in got.split("/")[1:]), (raw, got)
    assert got in (raw, raw[:-1]), (raw, got)  # taken as typed (one trailing slash aside), never repaired


def test_plain_paths_are_taken_and_system_trees_by_component_only():
    assert container_path("/workspace") == "/workspace"
    assert container_path("/data/run-1/") == "/data/run-1"
    assert container_path("/procs") == "/procs" and container_path("/var/runner") == "/var/runner"
    assert container_path("/home/.cache") == "/home/.cache"  # a dot file is a name, not a "." segment
    for raw in ESCAPES + ["/proc", "/var/run/docker.sock", "/usr/local/x"]:
        with pytest.raises(PathError):
            container_path(raw)


# ---------------------------------------------------------------------- the reproductions


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["instances", "jobs"])
def test_the_issues_mount_paths_are_refused_by_the_api_in_the_error_shape(alice, fleet, kind):
    vol = volume_create(tenant=alice.tenant, name="data", region="us-east-1", size_gib=10)
    for raw in ESCAPES:
        r = alice.client().post(f"/api/v1/{kind}", {
            "name": "pin", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox",
            "volumes": [{"volume": str(vol.pk), "mount_path": raw}]}, format="json")
        assert r.status_code == 400, (raw, r.content)
        error = r.json()["error"]
        assert error["code"] == "validation_error" and set(error) == {"code", "message", "fields"}, error
        assert "volumes" in error["fields"], (raw, error)
    assert not Workload.objects.exists() and not VolumeAttachment.objects.exists()  # nothing made
    ok = alice.client().post(f"/api/v1/{kind}", {
        "name": "fine", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox",
        "volumes": [{"volume": str(vol.pk), "mount_path": "/data/x"}]}, format="json")
    assert ok.status_code == 201, ok.content


@pytest.mark.django_db
def test_the_launch_form_says_so_beside_the_mount_path(alice, catalog):
    vol = volume_create(tenant=alice.tenant, name="data", region="us-east-1", size_gib=10)
    client = Client()
    client.force_login(alice.user)
    body = {"kind": "instance", "name": "box", "instance_type": "h100.1x", "region": "us-east-1",
            "template": "custom", "image": "ubuntu:24.04", "volume": str(vol.pk)}
    for raw in ("/./proc", "/var/./run/docker.sock", "/.../proc"):
        refused = client.post("/console/launch/", {**body, "mount_path": raw})
        html = refused.content.decode()
        assert refused.status_code == 400, raw
        beside = html[html.index('id="field-mount_path"'):]
        assert "No . or .. segments" in beside[:beside.index("</ul>")], raw
    assert not Workload.objects.exists()


@pytest.mark.django_db
def test_the_volumes_service_refuses_a_stored_spec_with_such_a_path(alice, fleet):
    """A spec that did not come through the API this time (an autoscaling group's launch spec
    stored before the rule) meets the same rule where the mount is made."""
    from gpucloud.lib.errors import InvalidInput
    from scheduler.services import WorkloadSpec, workload_launch

    vol = volume_create(tenant=alice.tenant, name="data", region="us-east-1", size_gib=10)
    spec = WorkloadSpec(kind="instance", name="old", instance_type="h100.1x", region="us-east-1", image="busybox",
                        volumes=[{"volume": vol.pk, "mount_path": "/./proc"}])
    with pytest.raises(InvalidInput, match="No . or .. segments"):
        workload_launch(tenant=alice.tenant, user=alice.user, spec=spec)
    assert not Workload.objects.exists()


# ---------------------------------------------------------------------- the class

# A field "takes a path" when its name says so. Each one found must be a path field on the rule.
PATHISH = re.compile(r"(^|_)(path|paths|dir|dirs|directory|workdir|cwd|mount|mounts|mountpoint|file|filename)(_|$)")

# Every writable path field there is, so a new one is seen (and must be added here, on the rule).
PATH_FIELDS = {
    "scheduler.api.serializers.VolumeMountSerializer.mount_path",
    "frontend.forms.LaunchForm.mount_path",
}
# Path-named fields that are no tenant's input, each with why.
NOT_INPUT = {
    "volumes.api.serializers.AttachedToSerializer.mount_path": "answers only: where a volume is attached",
}


ROOTS = ("gpucloud", "scheduler", "agents", "billing", "volumes", "alarms", "autoscaling", "frontend", "gateway")


def _our_modules() -> list[str]:
    """Every app's serializer and form modules (imported, so their classes are seen)."""
    names = []
    for config in apps.get_app_configs():
        if config.name.split(".")[0] not in ROOTS:
            continue
        for sub in ("api.serializers", "serializers", "forms"):
            name = f"{config.name}.{sub}"
            try:
                if importlib.util.find_spec(name) is None:
                    continue
            except ModuleNotFoundError:  # no `api` package in this app
                continue
            importlib.import_module(name)
            names.append(name)
    return names


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _walk() -> dict[str, object]:
    modules = set(_our_modules())
    found: dict[str, object] = {}
    for cls in set(_subclasses(serializers.BaseSerializer)):
        if cls.__module__ not in modules or issubclass(cls, serializers.ListSerializer):
            continue
        fields = cls().fields
        for name, field in fields.items():
            if not field.read_only:
                found[f"{cls.__module__}.{cls.__qualname__}.{name}"] = field
    for cls in set(_subclasses(forms.BaseForm)):
        if cls.__module__ not in modules:
            continue
        for name, field in cls.base_fields.items():
            found[f"{cls.__module__}.{cls.__qualname__}.{name}"] = field
    return found


def test_every_serializer_and_form_field_that_takes_a_path_is_on_the_one_rule():
    found = _walk()
    modules = {k.rsplit(".", 2)[0] for k in found}
    # the walk sees the apps' serializers and the console's forms at all (or it proves nothing)
    assert {"scheduler.api.serializers", "volumes.api.serializers", "autoscaling.api.serializers",
            "frontend.forms", "gpucloud.tenancy.api.serializers"} <= modules, sorted(modules)
    pathish = {k for k in found if PATHISH.search(k.rsplit(".", 1)[1])
               or isinstance(found[k], ContainerPathField | ContainerPathFormField)}
    # subclasses inherit their parents' fields: a group's launch spec has the same volumes field
    assert pathish - set(NOT_INPUT) == PATH_FIELDS, (
        "a field that takes a path: make it ContainerPathField (API) or ContainerPathFormField (console) "
        "and list it in PATH_FIELDS", sorted(pathish - set(NOT_INPUT)))
    for key in PATH_FIELDS:
        assert isinstance(found[key], ContainerPathField | ContainerPathFormField), key
    # nested: every serializer that takes volumes takes them through VolumeMountSerializer
    for key, field in found.items():
        child = getattr(field, "child", None)
        if key.endswith(".volumes"):
            assert type(child).__name__ == "VolumeMountSerializer", key
