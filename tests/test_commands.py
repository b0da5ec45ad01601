from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from gpucloud.tenancy.models import ApiKey, Membership, Tenant

pytestmark = pytest.mark.django_db


def test_create_tenant_prints_a_working_key_as_its_last_line():
    out = io.StringIO()
    call_command("create_tenant", "--name", "Initech", "--email", "Peter@Initech.test", "--api-key", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    tenant = Tenant.objects.get(name="Initech")
    assert Membership.objects.get(tenant=tenant).user.email == "peter@initech.test"
    assert ApiKey.objects.filter(tenant=tenant, scopes=["admin"]).count() == 1
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/v1/tenant").json()["slug"] == tenant.slug


def test_create_tenant_without_key_and_with_password():
    out = io.StringIO()
    call_command("create_tenant", "--name", "Hooli", "--email", "gavin@hooli.test", "--password", "pw-123-hooli",
                 stdout=out)
    assert not ApiKey.objects.exists()
    client = APIClient()
    # A real sign-in, through the form django-axes watches (it refuses authenticate() without a request).
    signed_in = client.post("/console/signin/", {"username": "gavin@hooli.test", "password": "pw-123-hooli"})
    assert signed_in.status_code == 302
    assert client.get("/api/v1/tenant").json()["name"] == "Hooli"


def test_create_tenant_refuses_a_bad_email():
    with pytest.raises(CommandError):
        call_command("create_tenant", "--name", "X", "--email", "nobody", stdout=io.StringIO())
    assert not Tenant.objects.exists()


def test_demo_setup_is_idempotent():
    call_command("demo_setup", stdout=io.StringIO())
    call_command("demo_setup", stdout=io.StringIO())
    assert Tenant.objects.filter(name="Demo Lab").count() == 1
