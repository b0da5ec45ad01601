"""Browser fixtures: Playwright for Python driving Debian's Chromium (/usr/bin/chromium).

Never `playwright install`: the browser is the distribution's (`.ci/run` installs it).
The console is served by pytest-django's `live_server` on the test database; a real
Celery worker and beat (`celery_stack`) run the scheduler, and simulated hosts
(`sim_host`) are real `agents.host` processes with the sim GPU backend and runtime,
heartbeating to the live server over HTTP.

Screenshots go to var/screenshots/ (git-ignored), or to $GPUCLOUD_SCREENSHOTS when set, so
anyone can look at the pages after a run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "var" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PHONE = {"width": 375, "height": 812}
DESKTOP = {"width": 1280, "height": 860}


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (see .ci/run)", pytrace=False)
    # Playwright's sync API keeps an event loop in this thread; the ORM calls the tests make
    # between browser steps are plain synchronous code, so Django's async guard is lifted
    # while the browser is up (and only then).
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            yield b
            b.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport=DESKTOP, base_url=live_server.url)
    context.set_default_timeout(15_000)
    p = context.new_page()
    yield p
    context.close()


@pytest.fixture
def phone(browser, live_server):
    context = browser.new_context(viewport=PHONE, base_url=live_server.url, is_mobile=True, has_touch=True)
    context.set_default_timeout(15_000)
    p = context.new_page()
    yield p
    context.close()


def shot(page, name: str) -> Path:
    """Write a full-page screenshot to <$GPUCLOUD_SCREENSHOTS, else var/screenshots>/<name>.png."""
    where = Path(os.environ.get("GPUCLOUD_SCREENSHOTS") or SCREENSHOTS)
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def horizontal_overflow(page) -> list[str]:
    """Elements wider than the viewport (what makes a phone scroll sideways); [] when none."""
    return page.evaluate("""() => {
        const w = document.documentElement.clientWidth;
        const out = [];
        if (document.documentElement.scrollWidth > w + 1) out.push('document ' + document.documentElement.scrollWidth);
        for (const el of document.querySelectorAll('body *')) {
            const r = el.getBoundingClientRect();
            if (r.width === 0 || getComputedStyle(el).position === 'fixed') continue;
            let p = el.parentElement, clipped = false;
            while (p && p !== document.body) {
                const o = getComputedStyle(p).overflowX;
                if (o === 'auto' || o === 'scroll' || o === 'hidden') { clipped = true; break; }
                p = p.parentElement;
            }
            if (!clipped && r.right > w + 1) out.push(el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
                (el.className && typeof el.className === 'string' ? '.' + el.className.split(' ').join('.') : '') +
                ' right=' + Math.round(r.right));
        }
        return out.slice(0, 10);
    }""")


def _env() -> dict[str, str]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "gpucloud.test_settings",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}


@pytest.fixture
def celery_stack(worker) -> Iterator[subprocess.Popen]:
    """The `worker` fixture's real Celery worker plus a real beat (scheduler ticks, sample flushes)."""
    # (The worker logs to a file, not a pipe: with beat ticking every second a pipe nobody
    # reads fills within a minute and the worker blocks on its next log line.)
    # On Redis, beat keeps its schedule in Redis (celery-redbeat): start from none, as a new
    # schedule file would, so every entry runs at start-up and no earlier test's timing carries over.
    import redis
    from django.conf import settings

    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    for key in broker.scan_iter("redbeat*"):
        broker.delete(key)
    with tempfile.TemporaryDirectory() as tmp:
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "gpucloud", "beat", "--loglevel=WARNING",
             "--schedule", os.path.join(tmp, "beat-schedule")],
            cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            yield worker
        finally:
            beat.terminate()
            beat.wait(timeout=30)


@pytest.fixture
def sim_host(live_server, celery_stack, catalog, settings):
    """Start simulated hosts as real agent processes; returns a function name, model, gpus → Host."""
    from agents.models import Host
    from agents.services.registration import bootstrap_token_create
    from gpucloud.catalogue.models import Region

    settings.AGENT_HEARTBEAT_INTERVAL_S = 1  # the live server tells the agents; charts move each second
    procs: list[subprocess.Popen] = []
    tmp = tempfile.TemporaryDirectory()

    def start(name: str = "sim-h100-1", model: str = "H100", gpus: int = 8, region: str = "us-east-1",
              timeout_s: float = 60.0):
        _, secret = bootstrap_token_create(region=Region.objects.get(code=region), note=f"test {name}")
        argv = [sys.executable, "-m", "agents.host", "--server", live_server.url,
                "--gpu-backend", "sim", "--runtime", "sim", "--sim-model", model,
                "--sim-gpus", str(gpus), "--hostname", name,
                "--state-dir", os.path.join(tmp.name, name), "--log-level", "WARNING"]
        procs.append(subprocess.Popen(argv, cwd=ROOT, env={**_env(), "GPUCLOUD_BOOTSTRAP_TOKEN": secret},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            host = Host.objects.filter(name=name, state="ready").first()
            if host:
                return host
            assert procs[-1].poll() is None, procs[-1].stderr.read()
            time.sleep(0.3)
        pytest.fail(f"simulated host {name} did not become ready within {timeout_s} s")

    yield start
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)
    tmp.cleanup()


@pytest.fixture
def fast_metering(monkeypatch):
    """Meter every second, one second behind the clock (default: every 60 s, 30 s behind).

    Request it before `celery_stack`/`sim_host`: the worker and beat read it at start-up,
    so a stopped instance's cost is posted within seconds, by the real metering task.
    """
    monkeypatch.setenv("METERING_INTERVAL_S", "1")
    monkeypatch.setenv("METERING_SETTLE_S", "1")


def sign_in(page, user, base_url: str) -> None:
    """Give the browser a signed-in session for `user` (the journey test signs up through the form)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                               "url": base_url}])
