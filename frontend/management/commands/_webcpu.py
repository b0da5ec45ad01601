"""A gunicorn config for `bench_e2e --web-cpu`: where the web's CPU goes, request by request.

Loaded with `gunicorn -c <this file>`; every worker wraps its WSGI application so that each
request's thread CPU time (`time.thread_time`, so waiting for PostgreSQL, Redis, the GIL or a
long poll's wake-up costs nothing) is added to a counter keyed by what the request was:
`POST /agent/v1/heartbeat fast`, `... slow:<n>` (the synchronous path, n containers whose
state the heartbeat moved), `POST /agent/v1/wait`, `POST /api/v1/jobs`, ... Each worker
writes its counters to `$BENCH_WEB_CPU_DIR/web-<pid>.json` every half second, with the
worker's whole CPU (request threads, the long-poll listener, gunicorn's own loop), so the
benchmark can take the difference over the burst. With `BENCH_WEB_PROFILE=1` each request
also runs under a per-thread cProfile (CPU timer), dumped at the worker's exit. With
`BENCH_SWITCH_INTERVAL_S` the workers run with that GIL switch interval.

Benchmark code only: nothing of the platform imports it.
"""
from __future__ import annotations

import cProfile
import json
import os
import sys
import threading
import time
from collections import defaultdict

_DIR = os.environ.get("BENCH_WEB_CPU_DIR", "")
_PROFILE = os.environ.get("BENCH_WEB_PROFILE") == "1"
_lock = threading.Lock()
_stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
_profiles: list[cProfile.Profile] = []
_local = threading.local()


def _kind(environ) -> str:
    path = environ.get("PATH_INFO", "")
    if path.startswith("/api/v1/jobs/"):
        path = "/api/v1/jobs/<id>"
    kind = f"{environ.get('REQUEST_METHOD', '')} {path}"
    hb = environ.get("bench.heartbeat")
    return f"{kind} {hb}" if hb else kind


def _wrap(app):
    def wrapped(environ, start_response):
        prof = None
        if _PROFILE:
            prof = getattr(_local, "prof", None)
            if prof is None:
                prof = _local.prof = cProfile.Profile(time.thread_time)
                with _lock:
                    _profiles.append(prof)
            prof.enable()
        t = time.thread_time()
        try:
            return app(environ, start_response)
        finally:
            dt = time.thread_time() - t
            if prof is not None:
                prof.disable()
            with _lock:
                s = _stats[_kind(environ)]
                s[0] += 1
                s[1] += dt

    return wrapped


def _heartbeat_kind() -> None:
    """Label each heartbeat with the path it took, in the WSGI environ the wrapper reads."""
    from agents.api import views

    orig_view, orig_hb = views._host_heartbeat, views.host_heartbeat

    def labelled(request):
        response = orig_view(request)
        kind = getattr(request, "heartbeat_path", None)
        if kind is not None:
            request.META["bench.heartbeat"] = kind
        elif "bench.heartbeat" not in request.META:
            request.META["bench.heartbeat"] = "slow:?"
        return response

    def counted(*, host, hb, fresh=None, **kw):
        outcome = orig_hb(host=host, hb=hb, fresh=fresh, **kw)
        request = getattr(_local, "request", None)
        if request is not None:
            request.META["bench.heartbeat"] = f"slow:{min(len(outcome.transitions), 9)}"
        return outcome

    def with_request(request):
        _local.request = request
        try:
            return labelled(request)
        finally:
            _local.request = None

    views._host_heartbeat = with_request
    views.host_heartbeat = counted


def _writer() -> None:
    path = os.path.join(_DIR, f"web-{os.getpid()}.json")
    while True:
        time.sleep(0.5)
        with _lock:
            data = {k: list(v) for k, v in _stats.items()}
        data["_process"] = [0, time.process_time()]
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)


def post_worker_init(worker) -> None:
    if os.environ.get("BENCH_SWITCH_INTERVAL_S"):
        # the GIL's switch interval (default 5 ms): what a request waits, per turn, for a
        # thread running Python to hand the interpreter over
        sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL_S"]))
    _heartbeat_kind()
    worker.wsgi = _wrap(worker.wsgi)
    if _DIR:
        threading.Thread(target=_writer, name="bench-web-cpu", daemon=True).start()


def worker_exit(server, worker) -> None:
    if _PROFILE and _DIR:
        import pstats

        with _lock:
            profs = list(_profiles)
        if profs:
            stats = pstats.Stats(profs[0])
            for p in profs[1:]:
                stats.add(p)
            stats.dump_stats(os.path.join(_DIR, f"web-{os.getpid()}.prof"))
