"""The demo's embedded broker (settings' defaults with no REDIS_URL / CELERY_BROKER_URL) under
concurrent publishers and a consumer, as real processes: every message arrives once, whole.

kombu's filesystem transport, the old default, fails this: its reader takes a message file
that a writer has created but not yet written and dies on `JSONDecodeError` (finding 14).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

PRODUCERS, EACH = 2, 10

# A slow writer: the transport's serialisation of each message takes 50 ms. kombu's
# filesystem transport does it between creating the message file and writing it, so a
# reader polling meanwhile finds the file empty; a SQLite row is one INSERT after it.
PRODUCE = """
import importlib, sys, time
from gpucloud.celery import app
who, n = sys.argv[1], int(sys.argv[2])
with app.connection_for_write() as conn:
    q = conn.SimpleQueue("h7-broker-test")
    transport = importlib.import_module(type(conn.default_channel).__module__)
    real_dumps = transport.dumps
    def slow_dumps(*args, **kwargs):
        time.sleep(0.05)
        return real_dumps(*args, **kwargs)
    transport.dumps = slow_dumps
    for i in range(n):
        q.put({"who": who, "i": i, "items": list(range(1000))})
"""

CONSUME = """
import sys
from gpucloud.celery import app
n, seen = int(sys.argv[1]), set()
with app.connection_for_read(transport_options={"polling_interval": 0.001}) as conn:
    q = conn.SimpleQueue("h7-broker-test")
    while len(seen) < n:
        msg = q.get(timeout=60)
        body = msg.payload
        assert body["items"] == list(range(1000)), body["i"]
        key = (body["who"], body["i"])
        assert key not in seen, f"delivered twice: {key}"
        seen.add(key)
        msg.ack()
    # nothing left over
    try:
        extra = q.get(timeout=1)
    except q.Empty:
        extra = None
    assert extra is None, extra.payload
print("received", len(seen))
"""


def embedded_env(var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    return {**env, "DJANGO_SETTINGS_MODULE": "gpucloud.settings", "DEBUG": "1", "GPUCLOUD_VAR_DIR": str(var_dir)}


def test_embedded_broker_delivers_every_message_once_under_concurrent_publishers(tmp_path: Path):
    env = embedded_env(tmp_path)
    cwd = settings.BASE_DIR
    consumer = subprocess.Popen([sys.executable, "-c", CONSUME, str(PRODUCERS * EACH)], env=env, cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    producers = [subprocess.Popen([sys.executable, "-c", PRODUCE, f"p{i}", str(EACH)], env=env, cwd=cwd,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(PRODUCERS)]
    try:
        for p in producers:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out
        out, _ = consumer.communicate(timeout=120)
        assert consumer.returncode == 0, out
        assert f"received {PRODUCERS * EACH}" in out
    finally:
        for p in [consumer, *producers]:
            if p.poll() is None:
                p.kill()
                p.wait()
