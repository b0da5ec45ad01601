from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpucloud.tenancy.models import AuditEvent
from gpucloud.tenancy.services import audit_purge

pytestmark = pytest.mark.django_db

# Every mutating API call, with the audit action it must leave behind.
MUTATIONS = [
    ("post", "/api/v1/api-keys", {"name": "k", "scopes": ["read"]}, "api_key.create"),
    ("post", "/api/v1/invitations", {"email": "new@acme.test", "role": "viewer"}, "invitation.create"),
    ("patch", "/api/v1/tenant", {"name": "Acme 2"}, "tenant.update"),
    ("patch", "/api/v1/members/{bob}", {"role": "admin"}, "member.update"),
    ("delete", "/api/v1/members/{bob}", None, "member.remove"),
]


@pytest.mark.parametrize("method,url,body,action", MUTATIONS, ids=[m[3] for m in MUTATIONS])
def test_every_mutating_call_is_audited_with_who_what_where(method, url, body, action, alice, bob):
    url = url.format(bob=bob.membership.pk)
    resp = getattr(alice.client(), method)(url, body, format="json", REMOTE_ADDR="203.0.113.9")
    assert resp.status_code in (200, 201, 204), resp.content
    event = AuditEvent.objects.filter(action=action).latest("created_at")
    assert event.tenant == alice.tenant
    assert event.actor_user == alice.user
    assert event.actor.startswith("alice@acme.test via key gpc_")
    assert event.source_ip == "203.0.113.9"
    assert event.object_id and event.object_type


def test_refused_calls_leave_no_audit_event(alice, bob):
    before = AuditEvent.objects.count()
    bob.client().post("/api/v1/invitations", {"email": "x@acme.test"}, format="json")
    alice.client().post("/api/v1/api-keys", {"name": ""}, format="json")
    assert AuditEvent.objects.count() == before


def test_tenants_read_only_their_own_audit_events(alice, charlie):
    alice.client().post("/api/v1/api-keys", {"name": "k", "scopes": ["read"]}, format="json")
    charlie.client().post("/api/v1/api-keys", {"name": "k", "scopes": ["read"]}, format="json")
    events = alice.client().get("/api/v1/audit-events").json()["results"]
    ids = {e["id"] for e in events}
    assert ids == {str(pk) for pk in AuditEvent.objects.filter(tenant=alice.tenant).values_list("pk", flat=True)}
    assert events == sorted(events, key=lambda e: e["created_at"], reverse=True)


def test_audit_events_filter_by_action_and_time(alice):
    alice.client().post("/api/v1/api-keys", {"name": "k", "scopes": ["read"]}, format="json")
    only_keys = alice.client().get("/api/v1/audit-events", {"action": "api_key."}).json()["results"]
    assert only_keys and all(e["action"].startswith("api_key.") for e in only_keys)
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    assert alice.client().get("/api/v1/audit-events", {"since": future}).json()["results"] == []


def test_members_and_viewers_cannot_read_the_audit_log(bob, victor):
    assert bob.client().get("/api/v1/audit-events").status_code == 403
    assert victor.client().get("/api/v1/audit-events").status_code == 403


def test_audit_list_query_count_is_constant(alice, django_assert_max_num_queries):
    for i in range(20):
        alice.client().post("/api/v1/api-keys", {"name": f"k{i}", "scopes": ["read"]}, format="json")
    # auth (key + memberships + touch) + count + page, independent of the number of events
    with django_assert_max_num_queries(6):
        assert len(alice.client().get("/api/v1/audit-events").json()["results"]) > 20


def test_purge_drops_only_events_past_retention(alice):
    old = AuditEvent.objects.create(tenant=alice.tenant, actor="system", action="x", object_type="t",
                                    created_at=timezone.now() - timedelta(days=500))
    kept = AuditEvent.objects.filter(tenant=alice.tenant).exclude(pk=old.pk).count()
    assert audit_purge(retention_days=400) == 1
    assert AuditEvent.objects.filter(tenant=alice.tenant).count() == kept


@pytest.mark.parametrize(("hops", "forwarded", "expected"), [
    (0, "6.6.6.6", "192.0.2.10"),  # no proxy configured: the header is the client's own words
    (1, "6.6.6.6, 203.0.113.9", "203.0.113.9"),  # the proxy appended the address it saw
    (1, "203.0.113.9", "203.0.113.9"),
    (2, "6.6.6.6, 198.51.100.1, 10.0.0.2", "198.51.100.1"),
    (2, "198.51.100.1", "198.51.100.1"),  # fewer entries than hops: the one a proxy wrote
    (1, "6.6.6.6, unknown", "192.0.2.10"),  # not an address (a misconfigured proxy): REMOTE_ADDR
    (1, "", "192.0.2.10"),
])
def test_the_source_ip_is_the_address_the_trusted_proxies_saw(alice, settings, hops, forwarded, expected):
    settings.TRUST_X_FORWARDED_FOR, settings.TRUSTED_PROXY_HOPS = hops > 0, hops
    resp = alice.client().post("/api/v1/api-keys", {"name": "k", "scopes": ["read"]}, format="json",
                               REMOTE_ADDR="192.0.2.10", HTTP_X_FORWARDED_FOR=forwarded)
    assert resp.status_code == 201, resp.content
    assert AuditEvent.objects.filter(action="api_key.create").latest("created_at").source_ip == expected
