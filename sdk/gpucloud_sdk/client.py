"""A typed client for the gpucloud REST API (/api/v1/), over httpx.

    from gpucloud_sdk import Client

    with Client("https://gpucloud.example.com", api_key="gpc_...") as gc:
        for it in gc.instance_types.list(gpu_model="H100"):
            print(it["code"], it["prices"])
        inst = gc.instances.create(name="nb", instance_type="h100.1x", region="us-east-1",
                                   image="jupyter/base-notebook", ports=[8888])
        inst = gc.instances.wait_for(inst["id"], "running", timeout=300)

- Lists are iterators that follow the pages (`page_size` up to 200).
- Errors in the API's one shape are raised as typed exceptions (`gpucloud_sdk.errors`),
  carrying `code`, `message` and `fields`.
- 429 and 503 are retried with exponential backoff, honouring `Retry-After`; so are
  connection errors of idempotent requests. `sleep` is injectable (tests, async wrappers).
- Each method that maps to an API operation names it (`@operation("api_v1_instances_list")`);
  tests/cli/test_sdk.py fails when an operation of the server's OpenAPI schema has none.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypedDict, TypeVar

import httpx

from gpucloud_sdk import errors

__all__ = ["Client", "operation", "TERMINAL_STATES"]

DEFAULT_TIMEOUT = 30.0
TERMINAL_STATES = frozenset({"stopped", "succeeded", "failed", "preempted", "lost"})
_RETRY_STATUS = frozenset({429, 503})
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})

F = TypeVar("F", bound=Callable[..., Any])


def operation(operation_id: str, *, lacks: str | None = None) -> Callable[[F], F]:
    """Mark a method as the SDK's call of one OpenAPI operation.

    `lacks` names a feature today's server does not have yet (its issue spells the contract);
    a 404 "No API route" for it is raised as `errors.ServerLacks` with a clear message.
    """

    def mark(fn: F) -> F:
        fn.__gpucloud_operation__ = operation_id  # type: ignore[attr-defined]
        fn.__gpucloud_lacks__ = lacks  # type: ignore[attr-defined]
        return fn

    return mark


# --- shapes (the keys the server answers with; total=False: servers may add keys) ---------

class Workload(TypedDict, total=False):
    id: str
    name: str
    kind: str
    state: str
    reason: str
    queue_position: int | None
    instance_type: str
    region: str
    image: str
    command: list[str]
    env: dict[str, str]
    ports: list[int]
    ssh_keys: list[str]
    billing: str
    priority: str
    max_price: str | None
    host: str | None
    hosts: list[str]
    gpus: list[str]
    gpu_share_milli: int
    hourly_cost: str | None
    cost_so_far: str
    created_at: str
    started_at: str | None
    ended_at: str | None
    stop_by: str | None
    events: list[dict[str, Any]]
    container_events: list[dict[str, Any]]  # container_lost / container_restarted: kind, count, detail
    ran_on: dict[str, list[str]] | None  # where its last run ran, once it holds no GPUs
    connect: dict[str, Any]  # once the server has the gateway (see docs/cli.md)
    # jobs
    queue: str
    nodes: int
    max_retries: int
    retries: int
    timeout_s: int | None
    exit_code: int | None
    array: str | None  # the job array it is a task of
    array_index: int | None
    checkpoint: dict[str, Any] | None  # {"signal": "SIGUSR1", "grace_s": 60}: sent before a preemption
    attained_gpu_s: float  # GPU-seconds received over its earlier runs (kept when requeued)


class JobArray(TypedDict, total=False):
    id: str
    name: str
    count: int
    state: str  # pending, running, succeeded, failed, stopped
    counts: dict[str, int]  # tasks per state
    created_at: str
    tasks: list[dict[str, Any]]  # {index, id, state, exit_code}: in the detail only


class PriceInForce(TypedDict, total=False):
    region: str
    kind: str
    currency: str
    per_hour: str
    per_bf16_tflops_hour: str
    effective_from: str



class RegionAvailability(TypedDict, total=False):
    region: str
    available_now: int
    can_host: bool
    reason: str


class InstanceType(TypedDict, total=False):
    code: str
    name: str
    gpu_model: dict[str, Any]
    gpus: str
    gpu_count: int
    gpu_share_milli: int
    vcpus: int
    memory_gib: int
    disk_gib: int
    bf16_tflops: str
    prices: list[PriceInForce]
    availability: list[RegionAvailability]  # per region: what would start now, for a new tenant


class Logs(TypedDict, total=False):
    text: str
    captured_at: str | None
    pending: bool


class Usage(TypedDict, total=False):
    group_by: str
    currency: str
    rows: list[dict[str, Any]]
    storage: dict[str, Any]  # volumes: gib_hours, seconds, amount
    total: str


Json = dict[str, Any]


# --- the client ----------------------------------------------------------------------------

class Client:
    """One API endpoint and key. Thread-safe as httpx.Client is; close it or use `with`."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                 max_retries: int = 5, backoff: float = 0.5, max_backoff: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep, transport: httpx.BaseTransport | None = None,
                 user_agent: str = "gpucloud-sdk/0.1") -> None:
        self.url = url.rstrip("/")
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.sleep = sleep
        headers = {"Accept": "application/json", "User-Agent": user_agent}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport,
                                  follow_redirects=False)
        self.instances = Instances(self, "instances")
        self.jobs = Jobs(self, "jobs")
        self.job_arrays = JobArrays(self)
        self.volumes = Volumes(self)
        self.api_keys = ApiKeys(self)
        self.ssh_keys = SshKeys(self)
        self.members = Members(self)
        self.invitations = Invitations(self)
        self.audit_events = AuditEvents(self)
        self.tenant = TenantResource(self)
        self.regions = Regions(self)
        self.gpu_models = GpuModels(self)
        self.instance_types = InstanceTypes(self)
        self.prices = Prices(self)
        self.quotas = Quotas(self)
        self.availability = AvailabilityResource(self)
        self.billing = Billing(self)
        self.ledger = Ledger(self)
        self.invoices = Invoices(self)
        self.budgets = Budgets(self)
        self.spot_prices = SpotPrices(self)
        self.metrics = Metrics(self)
        from gpucloud_sdk.autoscaling import AutoscalingGroups, ScalingPolicies, ScheduledActions

        self.groups = AutoscalingGroups(self)
        self.scaling_policies = ScalingPolicies(self)
        self.scheduled_actions = ScheduledActions(self)
        self.alarms = Alarms(self)
        self.notifications = Notifications(self)

    # context manager
    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:  # never the key
        return f"Client({self.url!r})"

    @classmethod
    def operations(cls) -> dict[str, tuple[str, str | None]]:
        """operation id -> ("resource.method", the feature the server lacks or None)."""
        probe = cls("http://sdk.invalid")
        found: dict[str, tuple[str, str | None]] = {}
        try:
            for attr, resource in vars(probe).items():
                if not isinstance(resource, Resource):
                    continue
                for name in dir(type(resource)):
                    fn = getattr(type(resource), name)
                    op = getattr(fn, "__gpucloud_operation__", None)
                    if op:
                        found[op] = (f"{attr}.{name}", fn.__gpucloud_lacks__)
        finally:
            probe.close()
        return found

    # --- transport ----------------------------------------------------------------------------

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None,
                lacks: str | None = None, accept: str | None = None) -> httpx.Response:
        """Send one request, retrying 429/503 (and connection errors of idempotent ones); raise
        the API's error as a typed exception. Returns the response (2xx)."""
        params = {k: v for k, v in (params or {}).items() if v is not None}
        headers = {"Accept": accept} if accept else None
        attempt = 0
        while True:
            try:
                response = self._http.request(method, path, params=params or None, json=json, headers=headers)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                if method.upper() in _IDEMPOTENT and attempt < min(self.max_retries, 2):
                    self.sleep(self._delay(attempt, None))
                    attempt += 1
                    continue
                raise errors.GpucloudError(f"cannot reach {self.url}: {exc}") from exc
            except httpx.TimeoutException as exc:
                raise errors.GpucloudError(f"{self.url} did not answer in time: {exc}") from exc
            if response.status_code in _RETRY_STATUS and attempt < self.max_retries:
                self.sleep(self._delay(attempt, errors.retry_after_seconds(response)))
                attempt += 1
                continue
            if response.status_code >= 400:
                err = errors.ApiError.from_response(response)
                no_route = response.status_code == 404 and err.message.startswith("No API route")
                # an older server may answer an unknown route's POST with its CSRF page (403 HTML)
                not_api = response.status_code in (403, 404, 405) and err.code == "error"
                if lacks and (no_route or not_api):
                    raise errors.ServerLacks(f"This server does not support {lacks} yet.", feature=lacks,
                                             status=response.status_code, code=err.code, response=response)
                raise err
            return response

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff * 10)  # the server's word, within reason
        return min(self.max_backoff, self.backoff * (2 ** attempt)) * (0.5 + random.random() / 2)

    def get(self, path: str, **params: Any) -> Any:
        return _json(self.request("GET", path, params=params))

    def post(self, path: str, json: Any = None, *, lacks: str | None = None) -> Any:
        return _json(self.request("POST", path, json=json, lacks=lacks))

    def patch(self, path: str, json: Any) -> Any:
        return _json(self.request("PATCH", path, json=json))

    def put(self, path: str, json: Any) -> Any:
        return _json(self.request("PUT", path, json=json))

    def delete(self, path: str, *, lacks: str | None = None) -> None:
        self.request("DELETE", path, lacks=lacks)

    def paginate(self, path: str, *, lacks: str | None = None, **params: Any) -> Iterator[Json]:
        """Every item of a paginated list, page after page (following `next`)."""
        response = self.request("GET", path, params=params, lacks=lacks)
        while True:
            body = response.json()
            if isinstance(body, list):  # an unpaginated list
                yield from body
                return
            yield from body.get("results", [])
            nxt = body.get("next")
            if not nxt:
                return
            # `next` is absolute; keep our own base (a proxy may rewrite the host).
            url = httpx.URL(nxt)
            response = self.request("GET", url.path, params=dict(url.params), lacks=lacks)

    # --- identity --------------------------------------------------------------------------------

    def whoami(self) -> Json:
        """The tenant this key acts for and the tenants its user belongs to."""
        return {"tenant": self.tenant.get(), "tenants": self.tenant.mine()}


def _json(response: httpx.Response) -> Any:
    if response.status_code == 204 or not response.content:
        return None
    return response.json()


class Resource:
    path = ""
    lacks: str | None = None

    def __init__(self, client: Client) -> None:
        self.client = client

    def _list(self, **params: Any) -> Iterator[Json]:
        return self.client.paginate(f"/api/v1/{self.path}", lacks=self.lacks, **params)

    def _get(self, key: str | int) -> Json:
        return _json(self.client.request("GET", f"/api/v1/{self.path}/{key}", lacks=self.lacks))  # type: ignore[no-any-return]

    def _create(self, body: Json) -> Json:
        return self.client.post(f"/api/v1/{self.path}", body, lacks=self.lacks)  # type: ignore[no-any-return]

    def _delete(self, key: str | int) -> None:
        self.client.delete(f"/api/v1/{self.path}/{key}", lacks=self.lacks)


# --- workloads -------------------------------------------------------------------------------------

class _Workloads(Resource):
    kind = ""

    def __init__(self, client: Client, path: str) -> None:
        super().__init__(client)
        self.path = path

    def find(self, name_or_id: str) -> Workload:
        """The one workload with this id or exact name (raises NotFound / AmbiguousName)."""
        if _looks_like_id(name_or_id):
            try:
                return self.get(name_or_id)
            except errors.NotFound:
                pass
        matches = [w for w in self.list(name=name_or_id) if w.get("name") == name_or_id]
        if not matches:
            raise errors.NotFound(f"No {self.kind} named {name_or_id!r}.", status=404, code="not_found")
        if len(matches) > 1:
            listed = ", ".join(f"{w['id']} ({w['state']})" for w in matches)
            raise errors.AmbiguousName(f"{len(matches)} {self.kind}s are named {name_or_id!r}: {listed}; "
                                       f"give the id.", candidates=list(matches))
        return matches[0]

    def list(self, *, state: str | Iterable[str] | None = None, name: str | None = None,
             billing: str | None = None, priority: str | None = None, ordering: str | None = None,
             page_size: int | None = None) -> Iterator[Workload]:
        states = [state] if isinstance(state, str) else list(state) if state else None
        return self._list(state=states, name=name, billing=billing, priority=priority,  # type: ignore[return-value]
                          ordering=ordering, page_size=page_size)

    def get(self, id: str) -> Workload:
        return self._get(id)  # type: ignore[return-value]

    def delete(self, id: str) -> None:
        self._delete(id)

    def stop(self, id: str) -> Workload:
        return self.client.post(f"/api/v1/{self.path}/{id}/stop")  # type: ignore[no-any-return]

    def logs(self, id: str, *, tail: int | None = None) -> Logs:
        return self.client.get(f"/api/v1/{self.path}/{id}/logs", tail=tail)  # type: ignore[no-any-return]

    def metrics(self, id: str, *, since: str | None = None, step: int | None = None) -> Json:
        return self.client.get(f"/api/v1/{self.path}/{id}/metrics", since=since, step=step)  # type: ignore[no-any-return]

    def wait_for(self, id: str, state: str | Iterable[str], *, timeout: float = 600.0, poll: float = 1.0,
                 on_poll: Callable[[Workload], None] | None = None) -> Workload:
        """Poll until the workload reaches one of `state`; raise WaitTimeout after `timeout` seconds,
        UnexpectedState as soon as it ends in a terminal state that is not wanted (`last` carries it)."""
        wanted = {state} if isinstance(state, str) else set(state)
        deadline = time.monotonic() + timeout
        while True:
            current = self.get(id)
            if on_poll is not None:
                on_poll(current)
            if current.get("state") in wanted:
                return current
            if current.get("state") in TERMINAL_STATES:
                raise errors.UnexpectedState(
                    f"{self.kind} {current.get('name')} ended {current.get('state')} "
                    f"({current.get('reason') or 'no reason given'}) before reaching {'/'.join(sorted(wanted))}.",
                    last=dict(current))
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.WaitTimeout(
                    f"{self.kind} {current.get('name')} is still {current.get('state')} after {timeout:g} s.",
                    last=dict(current))
            self.client.sleep(min(poll, left))


class Instances(_Workloads):
    kind = "instance"

    @operation("api_v1_instances_list")
    def list(self, **filters: Any) -> Iterator[Workload]:  # type: ignore[override]
        return super().list(**filters)

    @operation("api_v1_instances_retrieve")
    def get(self, id: str) -> Workload:
        return super().get(id)

    @operation("api_v1_instances_create")
    def create(self, *, name: str, instance_type: str, region: str, image: str,
               command: list[str] | str | None = None, env: dict[str, str] | None = None,
               ports: list[int] | None = None, ssh_keys: list[str] | None = None, billing: str | None = None,
               priority: str | None = None, max_price: str | float | None = None,
               volumes: list[dict[str, str]] | None = None) -> Workload:
        """Launch an instance; it answers at once with state `pending`. `volumes`: [{"volume": id,
        "mount_path": "/workspace"}], one writer at a time (409 volume_attached)."""
        body = _body(name=name, instance_type=instance_type, region=region, image=image, command=command,
                     env=env, ports=ports, ssh_keys=ssh_keys, billing=billing, priority=priority,
                     max_price=None if max_price is None else str(max_price), volumes=volumes)
        return self._create(body)  # type: ignore[return-value]

    launch = create

    @operation("api_v1_instances_destroy")
    def delete(self, id: str) -> None:
        super().delete(id)

    @operation("api_v1_instances_stop_create")
    def stop(self, id: str) -> Workload:
        return super().stop(id)

    @operation("api_v1_instances_start_create")
    def start(self, id: str) -> Workload:
        """Start a stopped instance again (POST /api/v1/instances/{id}/start): back through the
        queue with the same configuration. Conflict (`not_stopped`) unless it is stopped."""
        return self.client.post(f"/api/v1/instances/{id}/start")  # type: ignore[no-any-return]

    @operation("api_v1_instances_logs_retrieve")
    def logs(self, id: str, *, tail: int | None = None) -> Logs:
        return super().logs(id, tail=tail)

    @operation("api_v1_instances_metrics_retrieve")
    def metrics(self, id: str, *, since: str | None = None, step: int | None = None) -> Json:
        return super().metrics(id, since=since, step=step)


class Jobs(_Workloads):
    kind = "job"

    @operation("api_v1_jobs_list")
    def list(self, *, array: str | None = None, in_array: bool | None = None,  # type: ignore[override]
             **filters: Any) -> Iterator[Workload]:
        """Your jobs; `array`: only that job array's tasks; `in_array`: only tasks (True) or only jobs
        outside arrays (False)."""
        if array is None and in_array is None:
            return super().list(**filters)
        state = filters.pop("state", None)
        states = [state] if isinstance(state, str) else list(state) if state else None
        return self._list(state=states, array=array,  # type: ignore[return-value]
                          in_array=None if in_array is None else str(in_array).lower(), **filters)

    @operation("api_v1_jobs_retrieve")
    def get(self, id: str) -> Workload:
        return super().get(id)

    @operation("api_v1_jobs_create")
    def create(self, *, name: str, instance_type: str, region: str, image: str,
               command: list[str] | str | None = None, env: dict[str, str] | None = None,
               ports: list[int] | None = None, ssh_keys: list[str] | None = None, billing: str | None = None,
               priority: str | None = None, max_price: str | float | None = None, queue: str | None = None,
               nodes: int | None = None, max_retries: int | None = None,
               timeout_s: int | None = None, array: int | None = None,
               volumes: list[dict[str, str]] | None = None, checkpoint_signal: str | None = None,
               checkpoint_grace_s: int | None = None) -> Workload | JobArray:
        """Submit a batch job; it answers at once with state `pending`. With `array=N` it submits N
        tasks as one job array (each with GPUCLOUD_ARRAY_INDEX 0..N-1) and answers with the array.
        `volumes`: as for instances. `checkpoint_signal` (e.g. "SIGUSR1") and `checkpoint_grace_s`
        (1..3600), together: on preemption the job gets the signal, then that long to save its
        progress before it is stopped; it is requeued and resumes (docs/scheduler.md)."""
        checkpoint = None
        if checkpoint_signal is not None or checkpoint_grace_s is not None:
            checkpoint = _body(signal=checkpoint_signal, grace_s=checkpoint_grace_s)
        body = _body(name=name, instance_type=instance_type, region=region, image=image, command=command,
                     env=env, ports=ports, ssh_keys=ssh_keys, billing=billing, priority=priority,
                     max_price=None if max_price is None else str(max_price), queue=queue, nodes=nodes,
                     max_retries=max_retries, timeout_s=timeout_s,
                     array=None if array is None else {"count": array}, volumes=volumes,
                     checkpoint=checkpoint)
        return self._create(body)  # type: ignore[return-value]

    submit = create

    @operation("api_v1_jobs_destroy")
    def delete(self, id: str) -> None:
        super().delete(id)

    @operation("api_v1_jobs_stop_create")
    def stop(self, id: str) -> Workload:
        return super().stop(id)

    @operation("api_v1_jobs_logs_retrieve")
    def logs(self, id: str, *, tail: int | None = None) -> Logs:
        return super().logs(id, tail=tail)

    @operation("api_v1_jobs_metrics_retrieve")
    def metrics(self, id: str, *, since: str | None = None, step: int | None = None) -> Json:
        return super().metrics(id, since=since, step=step)


class JobArrays(Resource):
    """Job arrays (`/api/v1/job-arrays`): submitted with `jobs.create(..., array=N)`."""

    path = "job-arrays"

    @operation("api_v1_job_arrays_list")
    def list(self, *, ordering: str | None = None, page_size: int | None = None) -> Iterator[JobArray]:
        return self._list(ordering=ordering, page_size=page_size)  # type: ignore[return-value]

    @operation("api_v1_job_arrays_retrieve")
    def get(self, id: str) -> JobArray:
        """One array with every task's state, by index."""
        return self._get(id)  # type: ignore[return-value]

    @operation("api_v1_job_arrays_stop_create")
    def stop(self, id: str) -> JobArray:
        """Stop every task of the array."""
        return self.client.post(f"/api/v1/job-arrays/{id}/stop")  # type: ignore[no-any-return]


class Volumes(Resource):
    """Persistent volumes (`/api/v1/volumes`, docs/volumes.md)."""

    path = "volumes"

    @operation("api_v1_volumes_list")
    def list(self, **filters: Any) -> Iterator[Json]:
        return self._list(**filters)

    @operation("api_v1_volumes_retrieve")
    def get(self, id: str) -> Json:
        return self._get(id)

    @operation("api_v1_volumes_create")
    def create(self, *, name: str, size_gib: int, region: str) -> Json:
        return self._create({"name": name, "size_gib": size_gib, "region": region})

    @operation("api_v1_volumes_partial_update")
    def resize(self, id: str, *, size_gib: int) -> Json:
        """Grow a volume (it never shrinks)."""
        return _json(self.client.request("PATCH", f"/api/v1/volumes/{id}", json={"size_gib": size_gib}))  # type: ignore[no-any-return]

    @operation("api_v1_volumes_destroy")
    def delete(self, id: str) -> None:
        """Delete a detached volume (409 volume_attached while work uses it)."""
        self._delete(id)

    def find(self, name_or_id: str) -> Json:
        if _looks_like_id(name_or_id):
            try:
                return self.get(name_or_id)
            except errors.ServerLacks:
                raise
            except errors.NotFound:
                pass
        matches = [v for v in self.list(name=name_or_id) if v.get("name") == name_or_id]
        if not matches:
            raise errors.NotFound(f"No volume named {name_or_id!r}.", status=404, code="not_found")
        if len(matches) > 1:
            raise errors.AmbiguousName(f"{len(matches)} volumes are named {name_or_id!r}; give the id.",
                                       candidates=matches)
        return matches[0]


# --- tenancy -----------------------------------------------------------------------------------------

class ApiKeys(Resource):
    path = "api-keys"

    @operation("api_v1_api_keys_list")
    def list(self, *, name: str | None = None, ordering: str | None = None) -> Iterator[Json]:
        return self._list(name=name, ordering=ordering)

    @operation("api_v1_api_keys_retrieve")
    def get(self, id: str) -> Json:
        return self._get(id)

    @operation("api_v1_api_keys_create")
    def create(self, *, name: str, scopes: list[str] | None = None, expires_at: str | None = None) -> Json:
        """A new key; the answer's `secret` is shown this once."""
        return self._create(_body(name=name, scopes=scopes, expires_at=expires_at))

    @operation("api_v1_api_keys_destroy")
    def delete(self, id: str) -> None:
        self._delete(id)

    @operation("api_v1_api_keys_revoke_create")
    def revoke(self, id: str) -> Json:
        return self.client.post(f"/api/v1/api-keys/{id}/revoke")  # type: ignore[no-any-return]


class SshKeys(Resource):
    """Your SSH public keys in this tenant: the gateway lets them in to the tenant's instances."""

    path = "ssh-keys"

    @operation("api_v1_ssh_keys_list")
    def list(self) -> Iterator[Json]:
        return self._list()

    @operation("api_v1_ssh_keys_retrieve")
    def get(self, id: str) -> Json:
        return self._get(id)

    @operation("api_v1_ssh_keys_create")
    def create(self, *, name: str, public_key: str) -> Json:
        """Add a key (`ssh-ed25519 AAAA… comment`); the answer carries its `fingerprint`."""
        return self._create(_body(name=name, public_key=public_key))

    @operation("api_v1_ssh_keys_destroy")
    def delete(self, id: str) -> None:
        self._delete(id)


class Members(Resource):
    path = "members"

    @operation("api_v1_members_list")
    def list(self, *, ordering: str | None = None) -> Iterator[Json]:
        return self._list(ordering=ordering)

    @operation("api_v1_members_retrieve")
    def get(self, id: str | int) -> Json:
        return self._get(id)

    @operation("api_v1_members_partial_update")
    def update(self, id: str | int, *, role: str) -> Json:
        return self.client.patch(f"/api/v1/members/{id}", {"role": role})  # type: ignore[no-any-return]

    @operation("api_v1_members_destroy")
    def delete(self, id: str | int) -> None:
        self._delete(id)


class Invitations(Resource):
    path = "invitations"

    @operation("api_v1_invitations_list")
    def list(self, *, ordering: str | None = None) -> Iterator[Json]:
        return self._list(ordering=ordering)

    @operation("api_v1_invitations_retrieve")
    def get(self, id: str | int) -> Json:
        return self._get(id)

    @operation("api_v1_invitations_create")
    def create(self, *, email: str, role: str = "member") -> Json:
        return self._create({"email": email, "role": role})

    @operation("api_v1_invitations_destroy")
    def delete(self, id: str | int) -> None:
        self._delete(id)

    @operation("invitation_accept")
    def accept(self, *, token: str) -> Json:
        return self.client.post("/api/v1/invitations/accept", {"token": token})  # type: ignore[no-any-return]


class AuditEvents(Resource):
    path = "audit-events"

    @operation("api_v1_audit_events_list")
    def list(self, **filters: Any) -> Iterator[Json]:
        """Filters: action, actor, object_type, object_id, since, until, ordering."""
        return self._list(**filters)

    @operation("api_v1_audit_events_retrieve")
    def get(self, id: str | int) -> Json:
        return self._get(id)


class TenantResource(Resource):
    @operation("tenant_retrieve")
    def get(self) -> Json:
        return self.client.get("/api/v1/tenant")  # type: ignore[no-any-return]

    @operation("tenant_update")
    def update(self, **changes: Any) -> Json:
        return self.client.patch("/api/v1/tenant", changes)  # type: ignore[no-any-return]

    @operation("my_tenants_list")
    def mine(self) -> list[Json]:
        return self.client.get("/api/v1/tenants")  # type: ignore[no-any-return]

    @operation("signup")
    def signup(self, **fields: Any) -> Json:
        """Create a user and the tenant they own (no key needed)."""
        return self.client.post("/api/v1/auth/signup", fields)  # type: ignore[no-any-return]


# --- catalogue ----------------------------------------------------------------------------------------

class Regions(Resource):
    path = "regions"

    @operation("api_v1_regions_list")
    def list(self) -> Iterator[Json]:
        return self._list()

    @operation("api_v1_regions_retrieve")
    def get(self, code: str) -> Json:
        return self._get(code)


class GpuModels(Resource):
    path = "gpu-models"

    @operation("api_v1_gpu_models_list")
    def list(self, *, vendor: str | None = None, ordering: str | None = None) -> Iterator[Json]:
        return self._list(vendor=vendor, ordering=ordering)

    @operation("api_v1_gpu_models_retrieve")
    def get(self, code: str) -> Json:
        return self._get(code)


class InstanceTypes(Resource):
    path = "instance-types"

    @operation("api_v1_instance_types_list")
    def list(self, *, gpu_model: str | None = None, vendor: str | None = None, region: str | None = None,
             min_gpus: int | None = None, fractional: bool | None = None,
             ordering: str | None = None) -> Iterator[InstanceType]:
        frac = None if fractional is None else str(fractional).lower()
        return self._list(gpu_model=gpu_model, vendor=vendor, region=region, min_gpus=min_gpus,  # type: ignore[return-value]
                          fractional=frac, ordering=ordering, page_size=200)

    @operation("api_v1_instance_types_retrieve")
    def get(self, code: str) -> InstanceType:
        return self._get(code)  # type: ignore[return-value]


class Prices(Resource):
    path = "prices"

    @operation("api_v1_prices_list")
    def list(self, **filters: Any) -> Iterator[Json]:
        """Filters: instance_type, region, kind, at, ordering."""
        return self._list(**filters)

    @operation("api_v1_prices_retrieve")
    def get(self, id: int) -> Json:
        return self._get(id)


class Availability(TypedDict, total=False):
    instance_type: str
    gpu_model: str
    region: str
    available_now: int  # one-node launches the scheduler would start now
    can_host: bool  # whether some host of the region could ever run one
    reason: str  # why it never could; empty when it can
    availability: str  # available (available_now > 0), busy (it would queue) or never (refused)


class AvailabilityResource(Resource):
    @operation("api_v1_availability_list")
    def list(self, *, region: str | None = None, gpu_model: str | None = None,
             instance_type: str | None = None, available: bool | None = None,
             runnable: bool | None = None) -> list[Availability]:
        """What your tenant could start now, per instance type and region where it is priced
        (`available=True`: only what would start now; `runnable=True`: without what no host
        could ever run), and whether the fleet could ever run it."""
        flag = None if available is None else str(available).lower()
        return self.client.get("/api/v1/availability", region=region, gpu_model=gpu_model,  # type: ignore[no-any-return]
                               instance_type=instance_type, available=flag,
                               runnable=None if runnable is None else str(runnable).lower())


class Quotas(Resource):
    @operation("quotas_list")
    def list(self) -> list[Json]:
        return self.client.get("/api/v1/quotas")  # type: ignore[no-any-return]


# --- billing ---------------------------------------------------------------------------------------

class Billing(Resource):
    @operation("balance_retrieve")
    def balance(self) -> Json:
        return self.client.get("/api/v1/balance")  # type: ignore[no-any-return]

    @operation("usage_retrieve")
    def usage(self, *, start: str | None = None, end: str | None = None,
              group_by: str | None = None) -> Usage:
        """Metered usage from `start` (default: this month) to `end` (exclusive, default now)."""
        return self.client.get("/api/v1/usage", **{"from": start, "to": end, "group_by": group_by})  # type: ignore[no-any-return]


class Ledger(Resource):
    path = "ledger"

    @operation("api_v1_ledger_list")
    def list(self, *, kind: str | None = None, ordering: str | None = None) -> Iterator[Json]:
        return self._list(kind=kind, ordering=ordering)

    @operation("api_v1_ledger_retrieve")
    def get(self, id: str | int) -> Json:
        return self._get(id)


class Invoices(Resource):
    path = "invoices"

    @operation("api_v1_invoices_list")
    def list(self, *, status: str | None = None, ordering: str | None = None) -> Iterator[Json]:
        return self._list(status=status, ordering=ordering)

    @operation("api_v1_invoices_retrieve")
    def get(self, id: str | int) -> Json:
        return self._get(id)

    def csv(self, id: str | int) -> str:
        """The invoice as CSV text."""
        return self.client.request("GET", f"/api/v1/invoices/{id}", params={"format": "csv"},
                                   accept="text/csv").text


class Notifications(Resource):
    """Your own notifications in this tenant (`/api/v1/notifications`, docs/notifications.md), and
    what you are told of, and how (`/api/v1/notification-settings`)."""

    path = "notifications"

    @operation("api_v1_notifications_list")
    def list(self, *, unread: bool | None = None, ordering: str | None = None) -> Iterator[Json]:
        return self._list(unread=None if unread is None else str(unread).lower(), ordering=ordering)

    @operation("api_v1_notifications_retrieve")
    def get(self, id: int) -> Json:
        return self._get(id)

    @operation("api_v1_notifications_read_create")
    def mark_read(self, ids: list[int] | None = None) -> int:
        """Mark these read (all of yours in this tenant without `ids`); how many were unread."""
        done = self.client.post("/api/v1/notifications/read", _body(ids=ids))
        return int(done["marked"])

    @operation("notification_settings_retrieve")
    def settings(self) -> Json:
        return self.client.get("/api/v1/notification-settings")  # type: ignore[no-any-return]

    @operation("notification_settings_update")
    def set(self, *, scope: str | None = None, channels: dict[str, list[str]] | None = None,
            webhook_url: str | None = None) -> Json:
        """The answer's `webhook_secret` (when the URL was set or changed) is shown this once."""
        return self.client.put("/api/v1/notification-settings",  # type: ignore[no-any-return]
                               _body(scope=scope, channels=channels, webhook_url=webhook_url))


class Budgets(Resource):
    path = "budgets"

    @operation("api_v1_budgets_list")
    def list(self, *, ordering: str | None = None) -> Iterator[Json]:
        return self._list(ordering=ordering)

    @operation("api_v1_budgets_retrieve")
    def get(self, id: str | int) -> Json:
        return self._get(id)

    @operation("api_v1_budgets_create")
    def create(self, *, name: str, monthly_amount: str | float, thresholds: list[int] | None = None,
               notify_email: bool | None = None, webhook_url: str | None = None,
               hard_stop: bool | None = None) -> Json:
        return self._create(_body(name=name, monthly_amount=str(monthly_amount), thresholds=thresholds,
                                  notify_email=notify_email, webhook_url=webhook_url, hard_stop=hard_stop))

    @operation("api_v1_budgets_update")
    def replace(self, id: str | int, **fields: Any) -> Json:
        return self.client.put(f"/api/v1/budgets/{id}", fields)  # type: ignore[no-any-return]

    @operation("api_v1_budgets_partial_update")
    def update(self, id: str | int, **changes: Any) -> Json:
        return self.client.patch(f"/api/v1/budgets/{id}", changes)  # type: ignore[no-any-return]

    @operation("api_v1_budgets_destroy")
    def delete(self, id: str | int) -> None:
        self._delete(id)


class SpotPrices(Resource):
    path = "spot-prices"

    @operation("api_v1_spot_prices_list")
    def list(self, *, instance_type: str | None = None, region: str | None = None,
             since: str | None = None) -> Iterator[Json]:
        return self._list(instance_type=instance_type, region=region, since=since)


class Metrics(Resource):
    """Time series of one of your workloads (minute roll-ups plus the raw recent samples)."""

    @operation("metrics_retrieve")
    def series(self, workload: str, metric: str, *, stat: str | None = None, start: str | None = None,
               end: str | None = None, step: int | None = None) -> Json:
        """`metric`: gpu_util, gpu_mem_used, gpu_temp, power or cost_rate; `stat`: avg, max, min or p95;
        `start`/`end` ISO 8601 (the API's `from`/`to`), `step` seconds per point."""
        params = {"workload": workload, "metric": metric, "stat": stat, "from": start, "to": end, "step": step}
        return self.client.get("/api/v1/metrics", **{k: v for k, v in params.items() if v is not None})


class Alarms(Resource):
    """CloudWatch-style alarms (`/api/v1/alarms`): a metric of a workload or of the tenant, a rule,
    a state (OK, ALARM, INSUFFICIENT_DATA) and actions on state changes (docs/alarms.md)."""

    path = "alarms"

    @operation("api_v1_alarms_list")
    def list(self, *, ordering: str | None = None) -> Iterator[Json]:
        return self._list(ordering=ordering)

    @operation("api_v1_alarms_retrieve")
    def get(self, id: str) -> Json:
        return self._get(id)

    @operation("api_v1_alarms_create")
    def create(self, *, name: str, target_kind: str, metric: str, threshold: float, comparison: str,
               target_id: str | None = None, statistic: str | None = None, period: int | None = None,
               evaluation_periods: int | None = None, datapoints_to_alarm: int | None = None,
               treat_missing_data: str | None = None, actions: dict[str, list[Json]] | None = None,
               description: str | None = None, enabled: bool | None = None) -> Json:
        """The answer's `webhook_secret` signs the alarm's webhooks: it is shown this once."""
        return self._create(_body(name=name, target_kind=target_kind, target_id=target_id, metric=metric,
                                  threshold=threshold, comparison=comparison, statistic=statistic, period=period,
                                  evaluation_periods=evaluation_periods, datapoints_to_alarm=datapoints_to_alarm,
                                  treat_missing_data=treat_missing_data, actions=actions, description=description,
                                  enabled=enabled))

    @operation("api_v1_alarms_update")
    def replace(self, id: str, **fields: Any) -> Json:
        return self.client.put(f"/api/v1/alarms/{id}", fields)  # type: ignore[no-any-return]

    @operation("api_v1_alarms_partial_update")
    def update(self, id: str, **changes: Any) -> Json:
        return self.client.patch(f"/api/v1/alarms/{id}", changes)  # type: ignore[no-any-return]

    @operation("api_v1_alarms_destroy")
    def delete(self, id: str) -> None:
        self._delete(id)

    @operation("api_v1_alarms_history_list")
    def history(self, id: str) -> Iterator[Json]:
        """State changes, newest first, each with its reason, datapoints and actions' delivery log."""
        return self.client.paginate(f"/api/v1/alarms/{id}/history")

    def find(self, name_or_id: str) -> Json:
        if _looks_like_id(name_or_id):
            try:
                return self.get(name_or_id)
            except errors.NotFound:
                pass
        matches = [a for a in self.list() if a.get("name") == name_or_id]
        if not matches:
            raise errors.NotFound(f"No alarm named {name_or_id!r}.", status=404, code="not_found")
        return matches[0]  # names are unique per tenant


def _body(**fields: Any) -> Json:
    return {k: v for k, v in fields.items() if v is not None}


def _looks_like_id(value: str) -> bool:
    """Workload ids are UUIDs; anything else is a name."""
    import uuid

    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
