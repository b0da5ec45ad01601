"""The SDK (sdk/gpucloud_sdk): no Django, every schema operation covered, typed errors, 429 retries."""
from __future__ import annotations

import inspect
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from gpucloud_sdk import Client, errors

ROOT = Path(__file__).resolve().parents[2]
SERVER_PACKAGES = ["gpucloud", "scheduler", "billing", "agents"]


def test_the_sdk_and_cli_import_no_django():
    code = ("import sys, gpucloud_sdk, gpucloud_sdk.cli; "
            "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith(('django.', 'rest_framework')));"
            "print(bad); sys.exit(1 if bad else 0)")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "sdk")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.django_db
def test_every_operation_of_the_schema_has_an_sdk_method():
    from django.core.management import call_command

    out = io.StringIO()
    call_command("spectacular", stdout=out)
    schema = {op["operationId"] for item in yaml.safe_load(out.getvalue())["paths"].values()
              for method, op in item.items() if method in ("get", "post", "put", "patch", "delete")}
    sdk = Client.operations()
    missing = sorted(schema - set(sdk))
    assert not missing, f"operations of the API with no SDK method (add one with @operation): {missing}"
    # Methods written ahead of the server (their issues spell the contract) say so explicitly;
    # once the server has the operation, the marker must go.
    lacks = {op: where for op, (where, feature) in sdk.items() if feature}
    assert not lacks  # every operation the SDK knows, the server has
    landed = sorted(op for op in lacks if op in schema)
    assert not landed, f"the server now has {landed}: drop `lacks=` from their SDK methods"
    stale = sorted(op for op, (_, feature) in sdk.items() if not feature and op not in schema)
    assert not stale, f"SDK methods name operations the schema does not have: {stale}"


def _server_error_codes() -> dict[str, int | None]:
    """Every error code the server can answer with: its ServiceError classes, DRF's exceptions,
    and each `code="..."` a service or view raises (with the status where the class says it)."""
    from rest_framework import exceptions as drf

    from gpucloud.lib.errors import ServiceError

    codes: dict[str, int | None] = {}

    def walk(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    import agents.services.registration  # noqa: F401  (its ServiceError subclasses register on import)
    for cls in [ServiceError, *walk(ServiceError)]:
        codes[cls.code] = cls.status
    for cls in walk(drf.APIException):
        if cls.__module__.startswith("rest_framework") and cls is not drf.ValidationError:
            codes[cls.default_code] = cls.status_code
    codes["validation_error"] = 400
    from scheduler.core import blockers  # the admission refusals: codes kept as data, with their statuses

    codes.update(blockers.STATUS)
    for pkg in SERVER_PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "migrations" in path.parts or "host" in path.parts:
                continue
            for code in re.findall(r'\bcode="([a-z_]+)"', path.read_text()):
                codes.setdefault(code, None)
    return codes


@pytest.mark.django_db
def test_every_documented_error_code_raises_a_typed_exception():
    codes = _server_error_codes()
    assert {"validation_error", "not_found", "throttled", "insufficient_scope", "illegal_transition",
            "quota_exceeded", "authentication_failed"} <= set(codes)
    missing = sorted(set(codes) - set(errors.CODES))
    assert not missing, f"server error codes with no SDK exception class: {missing}"
    for code, status in codes.items():
        if status is None:
            continue
        klass = errors.error_class(status, code)
        assert klass is errors.CODES[code], (code, status, klass)
        assert klass.status_code == status or status >= 500, (code, status)
    # a code the SDK has never heard of still lands in its status's family
    assert errors.error_class(409, "brand_new_conflict") is errors.Conflict
    assert errors.error_class(502, "bad_gateway") is errors.ServerError


@pytest.mark.django_db(transaction=True)
def test_api_errors_arrive_as_typed_exceptions_with_code_message_fields(live_server, alice, catalog):
    with Client(live_server.url, "gpc_not_a_key") as bad:
        with pytest.raises(errors.AuthenticationError) as e:
            bad.tenant.get()
    assert e.value.code == "authentication_failed" and e.value.status == 401
    assert e.value.message == "This API key is unknown, revoked or expired."
    with Client(live_server.url, alice.key) as gc:
        with pytest.raises(errors.ValidationError) as e:
            gc.instances.create(name="x", instance_type="h100.1x", region="us-east-1", image="NOT AN IMAGE")
        assert e.value.code == "validation_error" and "image" in e.value.fields
        with pytest.raises(errors.NotFound) as e:
            gc.instances.get("0b7f0e46-0000-4000-8000-000000000000")
        assert e.value.code == "not_found"
        # volumes: every operation, and their refusals typed
        v = gc.volumes.create(name="data", size_gib=10, region="us-east-1")
        assert gc.volumes.find("data")["id"] == v["id"] and gc.volumes.get(v["id"])["size_gib"] == 10
        assert gc.volumes.resize(v["id"], size_gib=20)["size_gib"] == 20
        with pytest.raises(errors.ValidationError) as e:
            gc.volumes.resize(v["id"], size_gib=5)
        assert e.value.code == "volume_shrink"
        with pytest.raises(errors.Conflict) as e:
            gc.volumes.create(name="data", size_gib=1, region="us-east-1")
        assert e.value.code == "volume_name_taken"
        gc.volumes.delete(v["id"])
        assert list(gc.volumes.list()) == []
        # starting an instance that is not there: the API's 404, not Django's CSRF page
        with pytest.raises(errors.NotFound) as e:
            gc.instances.start("0b7f0e46-0000-4000-8000-000000000000")
        assert e.value.status == 404 and e.value.code == "not_found"
        # a launch no host could ever run: 409 unsatisfiable, its own class, with the reason
        with pytest.raises(errors.Unsatisfiable) as e:
            gc.instances.create(name="x", instance_type="h100.1x", region="us-east-1", image="alpine")
        assert e.value.code == "unsatisfiable" and "the fleet has no H100 GPUs in us-east-1" in e.value.message
        # pagination: every item, across pages
        types = list(gc.instance_types.list())
        assert len(types) == len({t["code"] for t in types}) > 10


class CountingTransport(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.statuses.append(response.status_code)
        return response


@pytest.mark.django_db(transaction=True)
def test_a_429_is_retried_after_the_servers_retry_after(live_server, alice):
    from django.core.cache import cache

    from gpucloud.tenancy.models import ApiKey

    created = alice.client().post("/api/v1/api-keys", {"name": "slow", "scopes": ["read"]}, format="json").json()
    ApiKey.objects.filter(pk=created["id"]).update(rate_limit_per_min=1)  # the key's own limit: the real throttle
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        # Time passes for the throttle: its window in Redis ends (no real minute waited).
        slept.append(seconds)
        cache.clear()

    transport = CountingTransport()
    with Client(live_server.url, created["secret"], sleep=sleep, transport=transport) as gc:
        assert gc.tenant.get()["name"] == "Acme"
        assert gc.tenant.get()["name"] == "Acme"  # throttled once, then retried
    assert transport.statuses == [200, 429, 200]
    assert len(slept) == 1 and 1 <= slept[0] <= 60  # exactly the Retry-After the server sent


def test_retries_give_up_after_max_retries_and_raise_throttled():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(429, headers={"Retry-After": "3"},
                              json={"error": {"code": "throttled", "message": "Slow down.", "fields": {}}})

    slept: list[float] = []
    with Client("http://gpucloud.test", "k", sleep=slept.append, max_retries=2,
                transport=httpx.MockTransport(handler)) as gc:
        with pytest.raises(errors.Throttled) as e:
            gc.tenant.get()
    assert len(calls) == 3 and slept == [3.0, 3.0]
    assert e.value.retry_after == 3.0 and e.value.message == "Slow down."


def test_wait_for_times_out_and_stops_at_an_unwanted_end():
    states = iter(["pending", "pending", "failed"])

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": "i", "name": "nb", "state": next(states), "reason": "boom"})

    with Client("http://gpucloud.test", "k", sleep=lambda s: None, transport=httpx.MockTransport(handler)) as gc:
        with pytest.raises(errors.UnexpectedState, match="ended failed"):
            gc.instances.wait_for("i", "running", timeout=60)
        with pytest.raises(errors.WaitTimeout, match="still pending"):
            states = iter(["pending"] * 100)
            gc.instances.wait_for("i", "running", timeout=0)


def test_the_client_never_shows_its_key():
    with Client("http://gpucloud.test", "gpc_secret_value") as gc:
        assert "gpc_secret_value" not in repr(gc)
    assert "api_key" in inspect.signature(Client).parameters
