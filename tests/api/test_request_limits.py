"""Requests no view should have to survive: huge bodies, absurdly deep JSON, text that is not Unicode.

Each is refused with a 4xx in the one error shape before it costs memory or reaches PostgreSQL,
anonymous callers and agents included.
"""
from __future__ import annotations

import io
import json

import pytest

from gpucloud.tenancy.models import AuditEvent, Tenant
from scheduler.models import Workload
from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    beat_body,
    new_token,
    post,
    region,
    register_body,
    registered,
    triggered,
)
from tests.api.test_bad_input import assert_error_shape

pytestmark = pytest.mark.django_db

SIXTY_MB = 60 * 1024 * 1024


class CountingBody(io.RawIOBase):
    """A request body of `size` spaces, made as it is read; counts what was read."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        left = self.size - self.read_bytes
        n = left if n is None or n < 0 else min(n, left)
        self.read_bytes += n
        return b" " * n

    def readline(self, limit: int | None = -1) -> bytes:
        return self.read(limit)


BIG_BODY_PATHS = ["/api/v1/auth/signup", "/api/v1/instances", "/api/v1/no-such-route", "/agent/v1/heartbeat",
                  "/agent/v1/register"]


@pytest.mark.parametrize("path", BIG_BODY_PATHS)
def test_a_60_mb_anonymous_body_is_a_413_and_is_never_read(client, path):
    client.raise_request_exception = False
    body = CountingBody(SIXTY_MB)
    resp = client.generic("POST", path, b"", CONTENT_TYPE="application/json",
                          CONTENT_LENGTH=str(SIXTY_MB), **{"wsgi.input": body})
    assert_error_shape(resp, 413, "request_too_large")
    assert body.read_bytes == 0


def test_a_body_over_the_limit_is_refused_also_on_console_forms(client, settings):
    body = CountingBody(settings.MAX_REQUEST_BODY_BYTES + 1)
    resp = client.generic("POST", "/console/signup/", b"", CONTENT_TYPE="application/x-www-form-urlencoded",
                          CONTENT_LENGTH=str(body.size), **{"wsgi.input": body})
    assert resp.status_code == 413 and body.read_bytes == 0
    assert not Tenant.objects.exists()


def test_the_limit_is_one_setting_and_a_heartbeat_under_it_passes(client, registered, settings):
    host_id, token = registered
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == settings.MAX_REQUEST_BODY_BYTES >= 2 * 1024 * 1024
    beat = beat_body(host_id, 1)
    beat["logs"] = [{"instance_id": "00000000-0000-0000-0000-000000000000.1", "text": "\u2588" * 170_000}]
    raw = json.dumps(beat).encode()  # a tqdm bar: 6 bytes a character, the agent's 1 MiB budget
    assert 1_000_000 < len(raw) < settings.MAX_REQUEST_BODY_BYTES
    assert post(client, "/agent/v1/heartbeat", None, token=token, raw=raw).status_code == 200
    settings.MAX_REQUEST_BODY_BYTES = len(raw) - 1
    resp = post(client, "/agent/v1/heartbeat", None, token=token, raw=raw)
    assert_error_shape(resp, 413, "request_too_large")


def _chunked(client, path: str, body: io.RawIOBase, content_type: str = "application/json"):
    # As gunicorn hands over a chunked request: no Content-Length, the input marked terminated.
    return client.generic("POST", path, b"", CONTENT_TYPE=content_type, HTTP_TRANSFER_ENCODING="chunked",
                          **{"wsgi.input": body, "wsgi.input_terminated": True})


def test_a_chunked_body_is_read_only_up_to_the_limit(client, settings):
    body = CountingBody(SIXTY_MB)
    resp = _chunked(client, "/api/v1/auth/signup", body)
    assert_error_shape(resp, 413, "request_too_large")
    assert body.read_bytes == settings.MAX_REQUEST_BODY_BYTES + 1
    ok = {"email": "chunked@x.test", "password": "a long enough password", "tenant_name": "Chunky"}
    resp = _chunked(client, "/api/v1/auth/signup", io.BytesIO(json.dumps(ok).encode()))
    assert resp.status_code == 201, resp.content


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [65, 990, 100_000])
def test_deep_json_is_a_400_for_anonymous_callers_too(anon, depth):
    anon.raise_request_exception = False
    resp = anon.post("/api/v1/auth/signup", f'{{"email": {nested(depth)}}}', content_type="application/json")
    error = assert_error_shape(resp, 400, "parse_error")
    assert "deeper than 64" in error["message"]
    assert not Tenant.objects.exists()


def test_json_64_deep_is_parsed_and_judged_by_the_serializer(alice, catalog):
    env = {"K": json.loads(nested(62))}  # the body, env and K's value: 64 levels
    resp = alice.client().post("/api/v1/instances", {"name": "d", "instance_type": "h100.1x",
                                                     "region": "us-east-1", "image": "busybox", "env": env},
                               format="json")
    assert_error_shape(resp, 400, "validation_error")
    assert "env" in resp.json()["error"]["fields"]


@pytest.mark.parametrize("path", ["/agent/v1/heartbeat", "/agent/v1/register"])
@pytest.mark.parametrize("depth", [65, 990])
def test_deep_json_is_a_400_on_the_agent_api(client, registered, path, depth):
    client.raise_request_exception = False
    host_id, token = registered
    body = json.dumps(beat_body(host_id, 1))[:-1] + f', "extra": {nested(depth)}}}'
    resp = post(client, path, None, token=token, raw=body.encode())
    error = assert_error_shape(resp, 400, "parse_error")
    assert "deeper than 64" in error["message"]


WORKLOAD = {"name": "s", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox"}


@pytest.mark.parametrize(("field", "value"), [
    ("command", '"echo \\ud800"'),
    ("command", '["echo", "\\udfff"]'),
    ("name", '"x\\ud800"'),
    ("env", '{"K": "\\ud83d"}'),
    ("env", '{"\\ud800": "v"}'),
])
def test_a_lone_surrogate_is_a_400_naming_the_field_and_writes_nothing(alice, catalog, field, value):
    body = json.dumps({k: v for k, v in WORKLOAD.items() if k != field})[:-1] + f', "{field}": {value}}}'
    client = alice.client()
    client.raise_request_exception = False
    before = AuditEvent.objects.count()
    resp = client.post("/api/v1/instances", body, content_type="application/json")
    error = assert_error_shape(resp, 400, "validation_error")
    assert list(error["fields"]) == [field]
    assert not Workload.objects.exists() and AuditEvent.objects.count() == before


def test_a_lone_surrogate_in_an_agents_free_text_is_replaced_and_in_a_name_refused(client, registered):
    host_id, token = registered
    body = json.dumps(beat_body(host_id, 1))[:-1]
    resp = post(client, "/agent/v1/heartbeat", None, token=token,
                raw=(body + ', "logs": [{"instance_id": "00000000-0000-0000-0000-000000000000.1", '
                            '"text": "bad \\ud800 byte"}]}').encode())
    assert resp.status_code == 200, resp.content
    resp = post(client, "/agent/v1/heartbeat", None, token=token,
                raw=json.dumps(beat_body(host_id, 2))[:-1].replace('"test"', '"v\\udc00"').encode() + b"}")
    error = assert_error_shape(resp, 400, "validation_error")
    assert list(error["fields"]) == ["agent_version"]
