"""Every console form, by class: a NUL character in any field is a form error, never a 500.

PostgreSQL cannot hold a NUL in text, so a value with one must stop at the form, as the API's
serializers stop it (DRF's CharField). `test_every_console_form_refuses_nul_in_each_field`
walks every form class defined in `frontend` (a new one that does not inherit `RefuseNul`
fails it) and each of its fields. The route sweep then posts a NUL into every field name of
every console form, to every console route that takes a POST: no answer is a 5xx.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from django import forms
from django.test import Client

import frontend
from frontend.forms import NUL_REFUSED, RefuseNul
from tests.frontend.console_world import _call, _url, console_routes, world  # noqa: F401
from tests.frontend.test_console_routes import access

pytestmark = pytest.mark.django_db


def console_form_classes() -> list[type[forms.BaseForm]]:
    """Every form class defined in a module of `frontend` (all imported first)."""
    for info in pkgutil.walk_packages(frontend.__path__, "frontend."):
        if ".migrations" not in info.name and ".management" not in info.name:
            importlib.import_module(info.name)

    def below(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)
    return sorted({c for c in below(forms.BaseForm) if c.__module__.startswith("frontend.")},
                  key=lambda c: c.__qualname__)


def _form(cls, data, alice):
    """An instance of `cls` bound to `data`, with what its constructor needs."""
    from django.contrib.auth.forms import AuthenticationForm, SetPasswordForm

    if issubclass(cls, AuthenticationForm):
        return cls(None, data=data)
    if issubclass(cls, SetPasswordForm):
        return cls(alice.user, data)
    if "tenant" in inspect.signature(cls).parameters:
        return cls(data, tenant=alice.tenant)
    return cls(data)


def test_every_console_form_refuses_nul_in_each_field(alice, catalog):
    classes = console_form_classes()
    assert len(classes) >= 15, [c.__name__ for c in classes]
    fields_checked = 0
    for cls in classes:
        assert issubclass(cls, RefuseNul), f"{cls.__qualname__}: inherit frontend.forms.ConsoleForm"
        for name, field in _form(cls, {}, alice).fields.items():
            if isinstance(field, forms.BooleanField):
                continue  # a checkbox reads any value as on or off: no text goes further
            value = ["a\x00b"] if isinstance(field, forms.MultipleChoiceField) else "a\x00b"
            form = _form(cls, {name: value}, alice)
            assert not form.is_valid(), (cls.__qualname__, name)
            assert NUL_REFUSED in form.errors.get(name, []), (cls.__qualname__, name, form.errors.get(name))
            fields_checked += 1
    assert fields_checked >= 60


def test_no_console_post_with_a_nul_in_any_field_is_a_server_error(world):  # noqa: F811
    alice = world.alice
    names = {name for cls in console_form_classes() for name in _form(cls, {}, alice).fields}
    names |= {"action", "tenant", "next", "instance", "protected", "role"}  # read straight from the POST
    body = {name: "x\x00" for name in sorted(names)}
    client = Client(raise_request_exception=False)
    client.force_login(alice.user)
    posted = 0
    for name, pattern in console_routes():
        if access(pattern).write is None:
            continue
        resp, _ = _call(client, "POST", _url(name, pattern, world.pks), None, body)
        assert resp.status_code < 500, (name, resp.status_code)
        posted += 1
    assert posted >= 35
