from __future__ import annotations

import io

import pytest
from django.conf import settings
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
    signed_in = client.post("/console/signin/", {"username": "gavin@hooli.test", "password": "pw-123-hooli"},
                            format="multipart")
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


def test_create_bootstrap_token_prints_a_token_that_admits_one_host_as_its_last_line(client):
    from agents.models import BootstrapToken, Host
    from agents.selectors import hash_token
    from gpucloud.catalogue.models import Region
    from gpucloud.tenancy.models import AuditEvent

    Region.objects.create(code="us-east-1", name="US East", country="US")
    out = io.StringIO()
    call_command(
        "create_bootstrap_token", "--region", "us-east-1", "--note", "rack 7",
        "--expires-in-hours", "2", stdout=out,
    )
    secret = out.getvalue().strip().splitlines()[-1]
    token = BootstrapToken.objects.get(token_hash=hash_token(secret))  # only the hash is kept
    assert (token.region.code, token.note, token.used_at) == ("us-east-1", "rack 7", None)
    assert 1.9 * 3600 < (token.expires_at - token.created_at).total_seconds() <= 2 * 3600
    assert AuditEvent.objects.filter(action="bootstrap_token.create").count() == 1
    body = {
        "protocol_version": 1, "bootstrap_token": secret, "hostname": "rack7-1",
        "agent_version": "t", "gpu_backend": "sim", "runtime": "sim", "cpu_count": 8,
        "memory_mib": 65536, "gpus": [],
    }
    resp = client.post("/agent/v1/register", body, content_type="application/json")
    assert resp.status_code == 200 and Host.objects.get().name == "rack7-1"
    token.refresh_from_db()
    assert token.host == Host.objects.get()


@pytest.mark.parametrize(
    "args", [["--region", "mars-1"], ["--region", "us-east-1", "--expires-in-hours", "0"]]
)
def test_create_bootstrap_token_refuses_bad_input(args):
    from agents.models import BootstrapToken
    from gpucloud.catalogue.models import Region

    Region.objects.create(code="us-east-1", name="US East", country="US")
    with pytest.raises(CommandError):
        call_command("create_bootstrap_token", *args, stdout=io.StringIO())
    assert not BootstrapToken.objects.exists()


def test_the_demo_runs_containers_in_docker_when_an_engine_answers_else_simulated(monkeypatch):
    import docker

    from agents.host.config import parse_args
    from frontend.management.commands import demo

    runtime, image, about = demo.choose_runtime("auto")  # an engine answers here (.ci/run starts one)
    assert runtime == "docker" and about.startswith("docker (engine ") and image in about
    client = docker.from_env()
    assert client.images.get(image).tags == [image]  # the busybox stand-in, built locally
    client.close()
    call_command("seed_catalog", stdout=io.StringIO())
    hosts = demo._sim_hosts(8000, runtime, image)
    assert len(hosts) == len(demo.SIM_HOSTS)
    for (_, argv, env), (host, *_) in zip(hosts, demo.SIM_HOSTS, strict=True):
        cfg = parse_args(argv[3:], environ=env)  # what the agent will run with
        assert (cfg.gpu_backend, cfg.runtime, cfg.docker_image_fallback) == ("sim", "docker", image)
        # one engine, each agent only its own containers, and each demo (var dir) its own
        assert cfg.docker_scope == demo.docker_scope(settings.VAR_DIR, host)
    scopes = {demo.docker_scope(settings.VAR_DIR, h) for h, *_ in demo.SIM_HOSTS}
    others = {demo.docker_scope(settings.VAR_DIR / "other", h) for h, *_ in demo.SIM_HOSTS}
    assert len(scopes) == len(demo.SIM_HOSTS) and not scopes & others  # two demos never share one

    assert demo.choose_runtime("sim")[0] == "sim"

    def no_busybox(client):
        raise FileNotFoundError("/bin/busybox is missing: apt-get install busybox-static")

    with monkeypatch.context() as m:  # an engine, but no busybox to build the stand-in from
        m.setattr("agents.host.standin.busybox_image", no_busybox)
        runtime, image, about = demo.choose_runtime("auto")
        assert (runtime, image) == ("sim", "") and "the Docker engine answered, but the stand-in image" in about
        assert "apt-get install busybox-static" in about
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")  # nothing listens: no engine answers
    runtime, image, about = demo.choose_runtime("auto")
    assert (runtime, image) == ("sim", "") and about.startswith("simulated: no Docker engine answered")
    assert all("sim" == parse_args(argv[3:], environ=env).runtime for _, argv, env in demo._sim_hosts(8000))
    with pytest.raises(CommandError, match="GPUCLOUD_DEMO_RUNTIME=docker"):
        demo.choose_runtime("docker")
    with pytest.raises(CommandError, match="must be one of"):
        demo.choose_runtime("podman")


def test_the_demo_prints_its_logins_once(monkeypatch):
    from frontend.management.commands import demo

    printed: list[str] = []

    class Stop(Exception):
        pass

    def started(*args, **kwargs):  # the first child process: stop here, all that was printed
        raise Stop

    monkeypatch.setattr(demo.Supervisor, "start", started)
    monkeypatch.setenv("GPUCLOUD_DEMO_RUNTIME", "sim")
    out = io.StringIO()
    with pytest.raises(Stop):
        call_command("demo", "--port", "8000", stdout=out)
    printed = out.getvalue().splitlines()
    assert "demo: runtime simulated (GPUCLOUD_DEMO_RUNTIME=sim): containers are simulated, nothing runs" in printed
    assert not [line for line in printed if "login" in line]  # not before the URL

    out = io.StringIO()
    call_command("demo", "--setup-only", stdout=out)
    assert sum("demo login:" in line for line in out.getvalue().splitlines()) == 1


@pytest.mark.django_db
def test_the_demo_seeds_one_batch_pool_of_the_render_queue():
    """Issue 28: the demo shows a batch pool (jobs with queue=render run on its members only)."""
    from autoscaling.models import AutoscalingGroup

    call_command("demo", "--setup-only", stdout=io.StringIO())
    call_command("demo", "--setup-only", stdout=io.StringIO())  # idempotent
    [pool] = AutoscalingGroup.objects.all()
    assert (pool.name, pool.job_queue, pool.min_size, pool.desired) == ("render-pool", "render", 0, 0)
    assert pool.tenant.memberships.filter(user__username="demo@gpucloud.local").exists()
