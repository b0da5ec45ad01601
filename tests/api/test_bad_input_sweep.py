"""Every field of the create endpoints against awkward values: never a 5xx, always the error shape.

A sweep, not a list of known cases: each field gets each value below in an otherwise valid
body. It found a NUL byte in a command reaching PostgreSQL (which refuses it in JSON) as
a 500.
"""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.django_db

AWKWARD = [None, "", "x" * 5000, "nul\x00byte", "\x00", 0, -1, 2**63, 1.5, True, [], {}, ["a"], [None],
           ["nul\x00"], {"a": 1}, {"K": "nul\x00"}, {"nul\x00": "v"}, "💥", "<script>", "1e309", "NaN"]

# Values no JSON encoder of ours writes, sent as raw JSON text: lone surrogates (valid JSON, not
# Unicode; PostgreSQL cannot store them) and nesting deep enough for a RecursionError.
RAW_AWKWARD = ['"\\ud800"', '"a\\udfffb"', '["\\ud800"]', '{"K": "\\ud83d"}', '{"\\ud800": "v"}',
               "[" * 990 + "]" * 990, '{"a": ' * 100 + "1" + "}" * 100]


def with_raw(base: dict, field: str, raw: str) -> str:
    """`base` as JSON text with `field` set to the raw JSON `raw`."""
    rest = json.dumps({k: v for k, v in base.items() if k != field})
    return rest[:-1] + (", " if len(rest) > 2 else "") + f'"{field}": {raw}}}'


WORKLOAD = {"name": "nb", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox"}
ENDPOINTS = [
    ("post", "/api/v1/instances", WORKLOAD,
     ["name", "instance_type", "region", "image", "command", "env", "ports", "ssh_keys", "billing", "priority",
      "max_price"]),
    ("post", "/api/v1/jobs", WORKLOAD,
     ["name", "command", "env", "queue", "nodes", "max_retries", "timeout_s", "priority"]),
    ("post", "/api/v1/api-keys", {"name": "ci"}, ["name", "scopes", "expires_in_days", "expires_at"]),
    ("post", "/api/v1/invitations", {"email": "new@x.test"}, ["email", "role"]),
    ("post", "/api/v1/budgets", {"name": "cap", "monthly_amount": "100"},
     ["name", "monthly_amount", "thresholds", "notify_email", "webhook_url", "hard_stop"]),
    ("patch", "/api/v1/tenant", {"name": "Acme"}, ["name"]),
    ("post", "/api/v1/alarms", {"name": "queue", "target_kind": "tenant", "metric": "queued_gpus", "threshold": 4,
                                "comparison": "gt"},
     ["name", "description", "target_kind", "target_id", "metric", "statistic", "period", "evaluation_periods",
      "datapoints_to_alarm", "threshold", "comparison", "treat_missing_data", "actions", "enabled"]),
]


def assert_refused_or_fine(resp, what):
    assert resp.status_code < 500, (what, resp.status_code, resp.content[:300])
    if resp.status_code >= 400:
        body = resp.json()
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "fields"}, (what, body)


@pytest.mark.parametrize(("method", "url", "base", "fields"), ENDPOINTS, ids=[e[1] + ":" + e[0] for e in ENDPOINTS])
def test_no_field_value_makes_a_server_error(method, url, base, fields, alice, fleet):
    client = alice.client()
    client.raise_request_exception = False
    assert getattr(client, method)(url, base, format="json").status_code < 300  # the base body is valid
    for field in fields:
        for value in AWKWARD:
            resp = getattr(client, method)(url, {**base, field: value}, format="json")
            assert_refused_or_fine(resp, (field, repr(value)[:40]))
        for raw in RAW_AWKWARD:
            resp = client.generic(method.upper(), url, with_raw(base, field, raw), content_type="application/json")
            assert 400 <= resp.status_code < 500, (field, raw[:40], resp.status_code, resp.content[:300])
            assert_refused_or_fine(resp, (field, raw[:40]))


LISTS = ["/api/v1/instances", "/api/v1/jobs", "/api/v1/audit-events", "/api/v1/ledger", "/api/v1/invoices",
         "/api/v1/prices", "/api/v1/spot-prices", "/api/v1/usage", "/api/v1/instance-types", "/api/v1/budgets",
         "/api/v1/members", "/api/v1/api-keys", "/api/v1/alarms"]
QUERIES = ["page=-1", "page=abc", "page=99999", "page_size=100000", "page_size=-3", "state=bogus", "ordering=bogus",
           "region=nul%00", "from=yesterday", "to=2026-13-45", "since=1e309", "gpu_model=%F0%9F%92%A5",
           "kind=x", "group_by=bogus", "cursor=zzz"]


@pytest.mark.parametrize("url", LISTS)
def test_no_query_parameter_makes_a_server_error(url, alice, catalog):
    client = alice.client()
    client.raise_request_exception = False
    for query in QUERIES:
        assert_refused_or_fine(client.get(f"{url}?{query}"), query)


def test_a_nul_byte_in_a_command_is_refused_by_name_and_writes_nothing(alice, catalog):
    from scheduler.models import Workload

    for command in ["echo \x00", ["echo", "a\x00b"]]:
        resp = alice.client().post("/api/v1/instances", {**WORKLOAD, "command": command}, format="json")
        assert resp.status_code == 400
        assert "command" in resp.json()["error"]["fields"]
    assert not Workload.objects.exists()
