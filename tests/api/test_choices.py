"""A wrong choice says the valid ones (issue 28): the usage API's `group_by` first, then every
choice field of every API serializer, so a new one cannot answer with a bare "not a valid choice"."""
from __future__ import annotations

import importlib
import pkgutil

import pytest
from rest_framework import serializers

from gpucloud.api.serializers import StrictMixin

pytestmark = pytest.mark.django_db


def test_an_invalid_group_by_lists_the_valid_choices_in_the_one_error_shape(alice):
    r = alice.client().get("/api/v1/usage", {"group_by": "galaxy"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] and err["message"]
    [said] = err["fields"]["group_by"]
    assert said == '"galaxy" is not a valid choice: one of instance_type, region, day, instance.'


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_choice_field_of_every_api_serializer_names_its_choices():
    for app in ("gpucloud", "scheduler", "agents", "billing", "volumes", "alarms", "autoscaling", "frontend"):
        pkg = importlib.import_module(app)
        for mod in pkgutil.walk_packages(pkg.__path__, f"{app}."):
            if mod.name.endswith(".serializers"):
                importlib.import_module(mod.name)
    checked = 0
    for cls in set(_all_subclasses(StrictMixin)):
        if cls.__module__ == "gpucloud.api.serializers":
            continue  # the bases
        try:
            fields = cls().fields
        except Exception:  # a serializer that needs its context to build: its fields are built per request
            continue
        for name, field in fields.items():
            for f in (field, getattr(field, "child", None)):
                if isinstance(f, serializers.ChoiceField) and f.choices:
                    first = str(next(iter(f.choices)))
                    assert first in f.error_messages["invalid_choice"], (cls, name)
                    checked += 1
    assert checked >= 10
