"""The API answers what its OpenAPI schema says: schemathesis against a live server.

`st run` (pinned in requirements.txt, configured in tests/api/schemathesis.toml: seeded,
bounded, its checks and why) generates requests for every operation of the served schema
(so endpoints added later are covered without touching this file) and checks each answer:
no 5xx, and every status, content type, header and body as documented; input the schema
forbids is refused. Once with an owner's admin-scoped key, once without a key for the
operations that need none. The rows it creates live in this test's database and are flushed
with it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("schemathesis.toml")
ST = Path(sys.executable).with_name("st")


@pytest.fixture
def unthrottled(monkeypatch):
    """Rate limits out of the way: a 429 is documented, but a run that hits them tests nothing else."""
    from rest_framework.settings import api_settings

    # the live server runs in this process; our throttles read the rates at each request
    for scope in api_settings.DEFAULT_THROTTLE_RATES:
        monkeypatch.setitem(api_settings.DEFAULT_THROTTLE_RATES, scope, "1000000/min")


def schemathesis(live_server, *args: str, **env: str) -> str:
    proc = subprocess.run(
        [str(ST), "--config-file", str(CONFIG), "run", f"{live_server.url}/api/schema/", "--no-color", *args],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=540,
    )
    out = proc.stdout + proc.stderr
    # st exits non-zero on any failure (a check that failed, or an error reaching the server)
    assert proc.returncode == 0, out[-12000:]
    assert re.search(r"\b0 unique failures|\d+ passed", out), out[-4000:]
    print(*re.findall(r"^\s*(\d+ generated.*|Tested: \d+|=+ .* in [\d.]+s =+)$", out, re.M), sep="\n")  # with -s
    return out


def operations_tested(out: str) -> int:
    match = re.search(r"Tested: (\d+)", out)
    assert match, out[-4000:]
    return int(match.group(1))


def test_the_api_answers_as_its_schema_says(live_server, alice, catalog, unthrottled):
    from gpucloud.tenancy.models import ApiKey

    key = ApiKey.objects.get(tenant=alice.tenant)
    out = schemathesis(live_server, "-H", f"Authorization: Bearer {alice.key}",
                       GPUCLOUD_API_KEY_ID=str(key.pk))
    assert operations_tested(out) >= 50  # every operation of the schema, not a few
    # the key stayed valid throughout: no operation answered nothing but 401/403
    assert "Authentication failed" not in out, out[-12000:]


def test_the_operations_without_a_key_answer_as_the_schema_says(live_server, catalog, unthrottled):
    # the same views had the full run above with a key; this one is the anonymous path through them
    out = schemathesis(live_server, "--phases", "fuzzing", GPUCLOUD_ST_ANONYMOUS="1")
    assert operations_tested(out) >= 5  # the catalogue and signup
