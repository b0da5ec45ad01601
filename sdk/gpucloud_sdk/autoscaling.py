"""Autoscaling groups, their scaling policies and scheduled actions (the server's docs/autoscaling.md)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpucloud_sdk.client import Json, Resource, _body, operation


class AutoscalingGroups(Resource):
    path = "autoscaling-groups"

    @operation("api_v1_autoscaling_groups_list")
    def list(self, *, ordering: str | None = None) -> Iterator[Json]:
        return self._list(ordering=ordering)

    @operation("api_v1_autoscaling_groups_retrieve")
    def get(self, id: str) -> Json:
        return self._get(id)

    def find(self, name_or_id: str) -> Json:
        """The group with this id or name (raises NotFound)."""
        from gpucloud_sdk import errors

        for g in self.list():
            if name_or_id in (g["id"], g["name"]):
                return g
        raise errors.NotFound(f"No autoscaling group {name_or_id!r}.", status=404, code="not_found")

    @operation("api_v1_autoscaling_groups_create")
    def create(self, *, name: str, instance_type: str, region: str, image: str, min_size: int | None = None,
               max_size: int | None = None, desired: int | None = None, command: list[str] | str | None = None,
               env: dict[str, str] | None = None, ports: list[int] | None = None,
               on_demand_base: int | None = None, on_demand_percent: int | None = None,
               warmup_s: int | None = None, cooldown_s: int | None = None, job_queue: str | None = None,
               **more: Any) -> Json:
        """Create a group; `job_queue` makes it a batch pool that follows that queue."""
        return self._create(_body(name=name, instance_type=instance_type, region=region, image=image,
                                  min_size=min_size, max_size=max_size, desired=desired, command=command,
                                  env=env, ports=ports, on_demand_base=on_demand_base,
                                  on_demand_percent=on_demand_percent, warmup_s=warmup_s, cooldown_s=cooldown_s,
                                  job_queue=job_queue, **more))

    @operation("api_v1_autoscaling_groups_partial_update")
    def update(self, id: str, **changes: Any) -> Json:
        """e.g. `update(id, desired=3)` or `update(id, min_size=0, max_size=10)`."""
        return self.client.patch(f"/api/v1/{self.path}/{id}", changes)  # type: ignore[no-any-return]

    @operation("api_v1_autoscaling_groups_destroy")
    def delete(self, id: str) -> None:
        self._delete(id)

    @operation("api_v1_autoscaling_groups_activities_list")
    def activities(self, id: str) -> Iterator[Json]:
        """What the group did and why, newest first."""
        return self.client.paginate(f"/api/v1/{self.path}/{id}/activities")

    @operation("api_v1_autoscaling_groups_protection_create")
    def protect(self, id: str, instance: str, protected: bool = True) -> Json:
        """Scale-in protection of one member on (or off)."""
        return self.client.post(f"/api/v1/{self.path}/{id}/protection",  # type: ignore[no-any-return]
                                {"instance": instance, "protected": protected})


class ScalingPolicies(Resource):
    path = "scaling-policies"

    @operation("api_v1_scaling_policies_list")
    def list(self) -> Iterator[Json]:
        return self._list()

    @operation("api_v1_scaling_policies_retrieve")
    def get(self, id: str) -> Json:
        return self._get(id)

    @operation("api_v1_scaling_policies_create")
    def create(self, *, group: str, name: str, kind: str, **fields: Any) -> Json:
        """kind `target_tracking` (metric, target, …) or `step` (adjustment_type, steps, cooldown_s)."""
        return self._create(_body(group=group, name=name, kind=kind, **fields))

    @operation("api_v1_scaling_policies_partial_update")
    def update(self, id: str, **changes: Any) -> Json:
        return self.client.patch(f"/api/v1/{self.path}/{id}", changes)  # type: ignore[no-any-return]

    @operation("api_v1_scaling_policies_destroy")
    def delete(self, id: str) -> None:
        self._delete(id)


class ScheduledActions(Resource):
    path = "scheduled-actions"

    @operation("api_v1_scheduled_actions_list")
    def list(self) -> Iterator[Json]:
        return self._list()

    @operation("api_v1_scheduled_actions_retrieve")
    def get(self, id: str) -> Json:
        return self._get(id)

    @operation("api_v1_scheduled_actions_create")
    def create(self, *, group: str, name: str, cron: str, timezone: str | None = None, min_size: int | None = None,
               max_size: int | None = None, desired: int | None = None) -> Json:
        return self._create(_body(group=group, name=name, cron=cron, timezone=timezone, min_size=min_size,
                                  max_size=max_size, desired=desired))

    @operation("api_v1_scheduled_actions_partial_update")
    def update(self, id: str, **changes: Any) -> Json:
        return self.client.patch(f"/api/v1/{self.path}/{id}", changes)  # type: ignore[no-any-return]

    @operation("api_v1_scheduled_actions_destroy")
    def delete(self, id: str) -> None:
        self._delete(id)
