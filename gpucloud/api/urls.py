"""/api/v1/ routes. Later apps add their routers here."""
from __future__ import annotations

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from agents.api.availability import AvailabilityApi
from agents.api.workloads import SeriesApi
from alarms.api import views as alarms
from autoscaling.api import views as autoscaling
from billing.api import views as billing
from frontend.api import views as ssh_keys
from gpucloud.api.errors import not_found
from gpucloud.catalogue.api import views as catalogue
from gpucloud.tenancy.api import views as tenancy
from notifications.api import views as notifications
from scheduler.api import views as scheduler
from volumes.api import views as volumes


class Router(SimpleRouter):
    """No trailing slashes: /api/v1/instances, /api/v1/instances/{id}."""

    def __init__(self) -> None:
        super().__init__(trailing_slash="")


router = Router()
router.register("members", tenancy.MemberViewSet, basename="member")
router.register("invitations", tenancy.InvitationViewSet, basename="invitation")
router.register("api-keys", tenancy.ApiKeyViewSet, basename="api-key")
router.register("audit-events", tenancy.AuditEventViewSet, basename="audit-event")
router.register("instances", scheduler.InstanceViewSet, basename="instance")
router.register("jobs", scheduler.JobViewSet, basename="job")
router.register("job-arrays", scheduler.JobArrayViewSet, basename="job-array")
router.register("regions", catalogue.RegionViewSet, basename="region")
router.register("gpu-models", catalogue.GpuModelViewSet, basename="gpu-model")
router.register("instance-types", catalogue.InstanceTypeViewSet, basename="instance-type")
router.register("prices", catalogue.PriceViewSet, basename="price")
router.register("spot-prices", billing.SpotPriceViewSet, basename="spot-price")
router.register("ledger", billing.LedgerViewSet, basename="ledger-entry")
router.register("invoices", billing.InvoiceViewSet, basename="invoice")
router.register("budgets", billing.BudgetViewSet, basename="budget")
router.register("ssh-keys", ssh_keys.SshKeyViewSet, basename="ssh-key")
router.register("autoscaling-groups", autoscaling.AutoscalingGroupViewSet, basename="autoscaling-group")
router.register("scaling-policies", autoscaling.ScalingPolicyViewSet, basename="scaling-policy")
router.register("scheduled-actions", autoscaling.ScheduledActionViewSet, basename="scheduled-action")
router.register("alarms", alarms.AlarmViewSet, basename="alarm")
router.register("volumes", volumes.VolumeViewSet, basename="volume")
router.register("notifications", notifications.NotificationViewSet, basename="notification")

urlpatterns = [
    path("auth/signup", tenancy.SignupApi.as_view(), name="signup"),
    path("tenant", tenancy.TenantApi.as_view(), name="tenant"),
    path("tenants", tenancy.MyTenantsApi.as_view(), name="my-tenants"),
    path("invitations/accept", tenancy.InvitationAcceptApi.as_view(), name="invitation-accept"),
    path("quotas", catalogue.QuotaApi.as_view(), name="quotas"),
    path("balance", billing.BalanceApi.as_view(), name="balance"),
    path("usage", billing.UsageApi.as_view(), name="usage"),
    path("payments/webhook", billing.PaymentWebhookApi.as_view(), name="payments-webhook"),
    path("metrics", SeriesApi.as_view(), name="metrics"),
    path("availability", AvailabilityApi.as_view(), name="availability"),
    path("notification-settings", notifications.NotificationSettingsApi.as_view(), name="notification-settings"),
    *router.urls,
    # Unknown API paths answer in the API's error shape, also with DEBUG on.
    re_path(r"^.*$", not_found, name="api-not-found"),
]
