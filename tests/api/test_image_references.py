"""Image references checked at launch (issue 28, deliverable 12): one validator
(gpucloud/lib/images.py, the Docker reference grammar) behind every way to name an image:
instances, jobs, job arrays, autoscaling groups (create and update), and the console's
templates. A bad reference is a 400 in the error shape that creates nothing, not a 201 and a
failure at the host."""
from __future__ import annotations

import pytest

from autoscaling.models import AutoscalingGroup
from frontend.forms import IMAGE_TEMPLATES
from gpucloud.lib.images import NOT_A_REFERENCE, image_reference_problem
from scheduler.models import JobArray, Workload

HEX = "0123456789abcdef" * 4
GOOD = ["busybox", "busybox:1.36", "pytorch/pytorch:2.4.0", "nvcr.io/nvidia/pytorch:24.05-py3",
        "registry.example.com/x/y@sha256:" + HEX, "registry.example.com:5000/team/app:v1@sha256:" + HEX,
        "localhost/app", "localhost:5000/a/b/c", "ghcr.io/Org-Name/app" .lower(), "a__b/c---d.e_f:T_1",
        "[::1]:5000/app:1", "My.Registry.com/app"]
DIGEST = "A digest is sha256: followed by 64 lower-case hex digits (name@sha256:<64 hex digits>)."
BAD = [
    ("registry.example.com/x/y@sha256:zzz", DIGEST),  # the issue's: was a 201
    ("busybox@sha256:" + HEX[:63], DIGEST),
    ("busybox@sha256:" + HEX.upper(), DIGEST),
    ("busybox@md5:" + HEX, DIGEST),
    ("busybox@", DIGEST),
    ("busybox:-bad", "A tag is up to 128 letters, digits, _ . - (not starting with . or -)."),
    ("busybox:" + "t" * 129, "A tag is up to 128 letters, digits, _ . - (not starting with . or -)."),
    ("Busybox", "A repository name is lower case."),
    ("docker.io/Library/busybox", "A repository name is lower case."),
    ("NOT AN IMAGE", NOT_A_REFERENCE), ("", NOT_A_REFERENCE), (" busybox", NOT_A_REFERENCE),
    ("busybox/", NOT_A_REFERENCE), ("/busybox", NOT_A_REFERENCE), ("bu..sy", NOT_A_REFERENCE),
    ("-busybox", NOT_A_REFERENCE), ("a//b", NOT_A_REFERENCE), ("host:port/app", NOT_A_REFERENCE),
    ("a" * 256, "An image name is at most 255 characters."),
]


@pytest.mark.parametrize("ref", GOOD)
def test_references_the_engine_takes_are_taken(ref):
    assert image_reference_problem(ref) is None


@pytest.mark.parametrize(("ref", "problem"), BAD)
def test_references_the_engine_refuses_are_refused_saying_why(ref, problem):
    assert image_reference_problem(ref) == problem


def test_every_console_template_is_a_valid_reference():
    assert all(image_reference_problem(t.image) is None for t in IMAGE_TEMPLATES.values() if t.image)


BASE = {"name": "img", "instance_type": "h100.1x", "region": "us-east-1"}
LAUNCHES = [
    ("/api/v1/instances", BASE),
    ("/api/v1/jobs", BASE),
    ("/api/v1/jobs", {**BASE, "array": {"count": 3}}),
    ("/api/v1/autoscaling-groups", {**BASE, "min_size": 0, "max_size": 2}),
]


@pytest.mark.parametrize(("url", "body"), LAUNCHES, ids=["instance", "job", "array", "group"])
@pytest.mark.parametrize(("ref", "problem"), BAD[:2] + BAD[7:8])
def test_every_launch_refuses_a_bad_reference_with_a_400_that_changes_nothing(url, body, ref, problem, alice, fleet):
    resp = alice.client().post(url, {**body, "image": ref}, format="json")
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["code"] and error["message"] and error["fields"] == {"image": [problem]}
    assert not Workload.objects.exists() and not JobArray.objects.exists()
    assert not AutoscalingGroup.objects.exists()


def test_a_groups_image_update_is_checked_the_same_way(alice, fleet):
    created = alice.client().post("/api/v1/autoscaling-groups", {**BASE, "image": "busybox", "min_size": 0,
                                                                 "max_size": 2}, format="json")
    assert created.status_code == 201, created.content
    url = f"/api/v1/autoscaling-groups/{created.json()['id']}"
    resp = alice.client().patch(url, {"image": BAD[0][0]}, format="json")
    assert resp.status_code == 400 and resp.json()["error"]["fields"] == {"image": [DIGEST]}
    assert AutoscalingGroup.objects.get().image == "busybox"
