from __future__ import annotations

import re
from decimal import Decimal

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agents.protocol import CHECKPOINT_GRACE_MAX_S, CHECKPOINT_SIGNALS
from gpucloud.api.serializers import ContainerPathField, StrictSerializer
from gpucloud.lib.images import image_reference_problem
from gpucloud.tenancy.models import SSH_PUBLIC_KEY, SSH_PUBLIC_KEY_INVALID
from scheduler.api import contributors
from scheduler.arrays import ARRAY_STATES
from scheduler.choices import Billing, PriorityClass, State
from scheduler.models import ContainerEvent, JobArray, Workload, WorkloadEvent
from scheduler.selectors import workload_last_allocations

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@extend_schema_field({"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}],
                      "description": "arguments, or one string run by /bin/sh -c"})
class CommandField(serializers.Field):
    """A list of arguments, or one string run by /bin/sh -c."""

    default_error_messages = {"invalid": "Give a list of strings or one string.",
                              "nul": "A command cannot contain a NUL character."}

    def to_internal_value(self, data):
        if isinstance(data, str):
            if len(data) > 8192:
                self.fail("invalid")
            args = ["/bin/sh", "-c", data] if data.strip() else []
        elif isinstance(data, list) and all(isinstance(a, str) for a in data) and len(data) <= 256 \
                and sum(len(a) for a in data) <= 65536:
            args = data
        else:
            self.fail("invalid")
        if any("\x00" in a for a in args):  # execve cannot pass it, and PostgreSQL refuses it in JSON
            self.fail("nul")
        return args

    def to_representation(self, value):
        return value


class VolumeMountSerializer(StrictSerializer):
    volume = serializers.UUIDField(help_text="a volume of yours in the same region (`/api/v1/volumes`)")
    mount_path = ContainerPathField(help_text="where the container sees it, e.g. /workspace: an absolute path in "
                                              "its plain form, not the root nor a system directory")


class WorkloadCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100, min_length=1)
    instance_type = serializers.CharField(max_length=48, help_text="e.g. h100.8x, l40s.quarter")
    region = serializers.CharField(max_length=32, help_text="e.g. us-east-1")
    image = serializers.CharField(max_length=500, help_text="a container image, e.g. pytorch/pytorch:2.4.0")
    command = CommandField(required=False, default=list)
    env = serializers.DictField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                required=False, default=dict)
    ports = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=65535),
                                  required=False, default=list, max_length=20)
    ssh_keys = serializers.ListField(child=serializers.CharField(max_length=4096), required=False,
                                     default=list, max_length=10)
    billing = serializers.ChoiceField(choices=Billing.choices, default=Billing.ON_DEMAND)
    priority = serializers.ChoiceField(choices=PriorityClass.choices, default=PriorityClass.STANDARD)
    max_price = serializers.DecimalField(
        max_digits=12, decimal_places=4, min_value=Decimal("0.0001"), required=False, allow_null=True,
        help_text="spot only: the most you pay per hour; when the spot price passes it, the instance "
                  "is preempted with the usual notice",
    )

    auto_stop_idle_minutes = serializers.IntegerField(
        min_value=5, max_value=7 * 24 * 60, required=False, allow_null=True,
        help_text="stop the instance after this many minutes with every GPU idle (under 5 % utilisation)",
    )

    volumes = VolumeMountSerializer(
        many=True, required=False, default=list,
        help_text="volumes to attach, each at its own path; one writer at a time: a volume attached to "
                  "other running or queued work is refused (409 volume_attached)",
    )

    def validate(self, attrs: dict) -> dict:
        if attrs.get("max_price") is not None and attrs.get("billing") != Billing.SPOT:
            raise serializers.ValidationError({"max_price": ["Only spot instances carry a max price."]})
        return attrs

    def validate_volumes(self, value: list[dict]) -> list[dict]:
        if len(value) > 8:
            raise serializers.ValidationError("At most 8 volumes.")
        if len({str(v["volume"]) for v in value}) != len(value):
            raise serializers.ValidationError("Each volume once.")
        paths = sorted(v["mount_path"] for v in value)
        if any(b == a or b.startswith(a + "/") for a, b in zip(paths, paths[1:], strict=False)):
            raise serializers.ValidationError("Each volume at its own path, not one inside another.")
        return value

    def validate_image(self, value: str) -> str:
        problem = image_reference_problem(value)  # the one check of a reference (gpucloud/lib/images.py)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_env(self, value: dict) -> dict:
        if len(value) > 100:
            raise serializers.ValidationError("At most 100 variables.")
        bad = [k for k in value if not _ENV_KEY.match(k)]
        if bad:
            raise serializers.ValidationError(f"Invalid variable names: {', '.join(sorted(bad)[:5])}.")
        return value

    def validate_ports(self, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise serializers.ValidationError("Each port once.")
        return value

    def validate_ssh_keys(self, value: list[str]) -> list[str]:
        for key in value:
            if not SSH_PUBLIC_KEY.match(key.strip()):
                raise serializers.ValidationError(SSH_PUBLIC_KEY_INVALID)
        return [k.strip() for k in value]


class ArraySpecSerializer(StrictSerializer):
    count = serializers.IntegerField(min_value=1, max_value=JobArray.MAX_COUNT,
                                     help_text=f"tasks, 1..{JobArray.MAX_COUNT}; each gets GPUCLOUD_ARRAY_INDEX "
                                               "0..count-1 in its env")


class CheckpointSerializer(StrictSerializer):
    signal = serializers.ChoiceField(
        choices=sorted(CHECKPOINT_SIGNALS),
        help_text="sent to the job's container when it is preempted, so it saves its progress")
    grace_s = serializers.IntegerField(
        min_value=1, max_value=CHECKPOINT_GRACE_MAX_S,
        help_text="seconds between the signal and the stop (its notice lasts at least this long)")


class JobCreateSerializer(WorkloadCreateSerializer):
    auto_stop_idle_minutes = None  # instances only: a job ends by itself
    queue = serializers.RegexField(r"^[a-z0-9][a-z0-9-]*$", max_length=64, default="default")
    nodes = serializers.IntegerField(min_value=1, max_value=64, default=1,
                                     help_text="hosts for a multi-node job, placed all or nothing")
    max_retries = serializers.IntegerField(min_value=0, max_value=20, default=0)
    timeout_s = serializers.IntegerField(min_value=1, max_value=30 * 86400, required=False, allow_null=True)
    array = ArraySpecSerializer(
        required=False, help_text="submit `count` tasks of this job as one job array (like `sbatch --array`): "
                                  "the answer is the array, not a job (docs/api.md)")
    checkpoint = CheckpointSerializer(
        required=False, allow_null=True,
        help_text="checkpoint-aware preemption: on preemption the signal, then `grace_s` seconds to save, "
                  "then the stop; the job is requeued and resumes with its attained service kept "
                  "(docs/scheduler.md)")


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = WorkloadEvent
        fields = ["created_at", "from_state", "to_state", "reason", "actor"]


class ContainerEventSerializer(serializers.ModelSerializer):
    count = serializers.IntegerField(help_text="the how-manieth of its kind in this run")
    detail = serializers.CharField(help_text="what the agent saw")

    class Meta:
        model = ContainerEvent
        fields = ["created_at", "kind", "count", "detail"]


class CostedListSerializer(serializers.ListSerializer):
    """Prices a whole page of workloads in a fixed number of queries before rendering it (billing's
    contributor, scheduler/api/contributors.py)."""

    def to_representation(self, data):
        items = list(data.all() if hasattr(data, "all") else data)
        self.child._costs = contributors.costs(workloads=items)
        return super().to_representation(items)


class WorkloadSerializer(serializers.ModelSerializer):
    reason = serializers.CharField(
        source="shown_reason", read_only=True,
        help_text="why it waits, ends or stops; under a preemption notice, why and when (`stop_by`)")
    instance_type = serializers.CharField(source="instance_type.code")
    region = serializers.CharField(source="region.code")
    state = serializers.ChoiceField(choices=State.choices)
    host = serializers.SerializerMethodField(help_text="the host it runs on (the first, for multi-node jobs)")
    hosts = serializers.SerializerMethodField()
    gpus = serializers.SerializerMethodField(help_text="UUIDs of the GPUs it holds")
    gpu_share_milli = serializers.IntegerField(source="instance_type.gpu_share_milli")
    hourly_cost = serializers.SerializerMethodField(help_text="what an hour of it costs now (all nodes)")
    cost_so_far = serializers.SerializerMethodField(
        help_text="billed so far, plus the running seconds not yet metered, at today's price")
    volumes = serializers.SerializerMethodField(help_text="the volumes attached, and where")

    class Meta:
        model = Workload
        fields = ["id", "name", "kind", "state", "reason", "queue_position", "instance_type", "region",
                  "image", "command", "env", "ports", "ssh_keys", "billing", "priority", "max_price", "host",
                  "hosts", "gpus", "gpu_share_milli", "hourly_cost", "cost_so_far", "auto_stop_idle_minutes",
                  "volumes", "created_at", "started_at", "ended_at", "stop_by"]
        read_only_fields = fields
        list_serializer_class = CostedListSerializer

    def _cost(self, obj):
        # A list fills `_costs` for its whole page at once (CostedListSerializer): no N+1.
        costs = getattr(self, "_costs", None)
        if costs is None or obj.pk not in costs:
            costs = self._costs = {**(costs or {}), **contributors.costs(workloads=[obj])}  # once, not per field
        return costs[obj.pk]

    @extend_schema_field(serializers.DecimalField(max_digits=14, decimal_places=4, allow_null=True))
    def get_hourly_cost(self, obj) -> str | None:
        value = self._cost(obj).hourly
        return None if value is None else str(value)

    @extend_schema_field(serializers.DecimalField(max_digits=14, decimal_places=2))
    def get_cost_so_far(self, obj) -> str:
        return str(self._cost(obj).so_far)

    @extend_schema_field(VolumeMountSerializer(many=True))
    def get_volumes(self, obj) -> list[dict]:
        return [{"volume": m["volume_id"], "mount_path": m["path"]} for m in obj.mounts]

    def get_hosts(self, obj) -> list[str]:
        return sorted({a.host.name for a in obj.active_allocations})

    def get_host(self, obj) -> str | None:
        hosts = self.get_hosts(obj)
        return hosts[0] if hosts else None

    def get_gpus(self, obj) -> list[str]:
        return [a.gpu_id for a in sorted(obj.active_allocations, key=lambda a: (a.host.name, a.gpu_id))]


class RanOnSerializer(serializers.Serializer):
    hosts = serializers.ListField(child=serializers.CharField())
    gpus = serializers.ListField(child=serializers.CharField(), help_text="UUIDs of the GPUs it held")


class WorkloadDetailSerializer(WorkloadSerializer):
    events = EventSerializer(many=True, read_only=True)
    container_events = ContainerEventSerializer(
        many=True, read_only=True,
        help_text="its container lost (`container_lost`) or restarted (`container_restarted`) without its "
                  "agent's order, with the count and what the agent saw (docs/lifecycle.md)")
    ran_on = serializers.SerializerMethodField(
        help_text="where its last run ran, once it holds no GPUs (stopped, ended, queued again); "
                  "null when it never ran or holds GPUs now (see `hosts`, `gpus`)")

    class Meta(WorkloadSerializer.Meta):
        fields = [*WorkloadSerializer.Meta.fields, "events", "container_events", "ran_on"]
        read_only_fields = fields

    @extend_schema_field(RanOnSerializer(allow_null=True))
    def get_ran_on(self, obj) -> dict | None:
        if obj.active_allocations or getattr(obj, "never_ran", False):  # a launch's 201: nothing to read
            return None
        last = workload_last_allocations(workload=obj)
        if not last:
            return None
        return {"hosts": sorted({a.host.name for a in last}), "gpus": [a.gpu_id for a in last]}


class ConnectSerializer(serializers.Serializer):
    """How to reach a RUNNING instance through the gateway (docs/connect.md); every field is
    null (and `urls` empty) before it runs and after it ends."""

    ssh = serializers.CharField(allow_null=True, help_text="the command to run, e.g. `ssh -p 2222 <id>@<host>`")
    ssh_host = serializers.CharField(allow_null=True, help_text="the gateway's public host name")
    ssh_port = serializers.IntegerField(allow_null=True, help_text="the gateway's public SSH port")
    ssh_user = serializers.CharField(allow_null=True, help_text="the user name: the instance id")
    host_key_fingerprint = serializers.CharField(
        allow_null=True, help_text="the gateway's SSH host key, `SHA256:…` as `ssh` prints it; null until "
                                   "the gateway has started once")
    urls = serializers.DictField(child=serializers.CharField(),
                                 help_text="published port → URL through the gateway's HTTP proxy "
                                           "(empty: the proxy is not built yet)")


class InstanceDetailSerializer(WorkloadDetailSerializer):
    connect = serializers.SerializerMethodField()

    class Meta(WorkloadDetailSerializer.Meta):
        fields = [*WorkloadDetailSerializer.Meta.fields, "connect"]
        read_only_fields = fields

    @extend_schema_field(ConnectSerializer)
    def get_connect(self, obj) -> dict:
        return contributors.connect_hints(obj)


# The instance's and job's GPU metrics and log tail (`.../metrics`, `.../logs`): the agents fill
# them (scheduler/api/contributors.py); their shapes are the resource's own.


class MetricPointSerializer(serializers.Serializer):
    t = serializers.DateTimeField(help_text="start of the step")
    gpu_util = serializers.FloatField(allow_null=True, help_text="percent")
    mem_util = serializers.FloatField(allow_null=True, help_text="percent, memory controller busy")
    mem_used_mib = serializers.FloatField(allow_null=True)
    temperature_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)


class AveragePointSerializer(MetricPointSerializer):
    gpus = serializers.IntegerField(help_text="GPUs that reported in this step")


class GpuSeriesSerializer(serializers.Serializer):
    uuid = serializers.CharField()
    index = serializers.IntegerField()
    points = MetricPointSerializer(many=True)


class MetricsSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    step = serializers.IntegerField()
    source = serializers.ChoiceField(choices=["raw", "minute"])
    gpus = GpuSeriesSerializer(many=True)
    average = AveragePointSerializer(many=True, help_text="the mean over the workload's GPUs")


class LogsSerializer(serializers.Serializer):
    text = serializers.CharField(allow_blank=True, help_text="the last lines stored")
    captured_at = serializers.DateTimeField(allow_null=True, help_text="when the agent read them")
    pending = serializers.BooleanField(
        help_text="it runs and no tail answered the last request yet (none at all, or an earlier "
                  "request is still unanswered): ask again after the host's next heartbeat; false once "
                  "text arrived (each call still asks the agent for a fresher tail)"
    )


_JOB_FIELDS = ["queue", "nodes", "max_retries", "retries", "timeout_s", "exit_code", "array", "array_index",
               "checkpoint", "attained_gpu_s"]


def _checkpoint(obj) -> dict | None:
    if not obj.checkpoint_signal:
        return None
    return {"signal": obj.checkpoint_signal, "grace_s": obj.checkpoint_grace_s}


class JobSerializer(WorkloadSerializer):
    checkpoint = serializers.SerializerMethodField(
        help_text="the signal sent on preemption and the grace before the stop; null: none")
    attained_gpu_s = serializers.FloatField(
        read_only=True, help_text="GPU-seconds received over its earlier runs (kept when it is requeued)")

    class Meta(WorkloadSerializer.Meta):
        fields = [*WorkloadSerializer.Meta.fields, *_JOB_FIELDS]
        read_only_fields = fields

    @extend_schema_field(CheckpointSerializer(allow_null=True))
    def get_checkpoint(self, obj) -> dict | None:
        return _checkpoint(obj)


class JobDetailSerializer(WorkloadDetailSerializer):
    checkpoint = serializers.SerializerMethodField(
        help_text="the signal sent on preemption and the grace before the stop; null: none")
    attained_gpu_s = serializers.FloatField(
        read_only=True, help_text="GPU-seconds received over its earlier runs (kept when it is requeued)")

    class Meta(WorkloadDetailSerializer.Meta):
        fields = [*WorkloadDetailSerializer.Meta.fields, *_JOB_FIELDS]
        read_only_fields = fields

    @extend_schema_field(CheckpointSerializer(allow_null=True))
    def get_checkpoint(self, obj) -> dict | None:
        return _checkpoint(obj)


# --- job arrays


class ArrayTaskSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    id = serializers.UUIDField(help_text="the task's job id (GET /api/v1/jobs/{id})")
    state = serializers.ChoiceField(choices=State.choices)
    exit_code = serializers.IntegerField(allow_null=True)


class JobArraySerializer(serializers.ModelSerializer):
    state = serializers.ChoiceField(
        choices=ARRAY_STATES,
        help_text="running: some task holds GPUs; pending: tasks wait, none holds GPUs; when all ended: "
                  "succeeded (all did), failed (some failed), else stopped")
    counts = serializers.DictField(child=serializers.IntegerField(),
                                   help_text="tasks per state (states with no task left out)")

    class Meta:
        model = JobArray
        fields = ["id", "name", "count", "state", "counts", "created_at"]
        read_only_fields = fields


class JobArrayDetailSerializer(JobArraySerializer):
    tasks = ArrayTaskSerializer(many=True, help_text="every task, by index")

    class Meta(JobArraySerializer.Meta):
        fields = [*JobArraySerializer.Meta.fields, "tasks"]
        read_only_fields = fields
