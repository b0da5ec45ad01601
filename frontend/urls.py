from __future__ import annotations

from django.urls import include, path

from frontend import account_views as account
from frontend import alarm_views, array_views, groups, notification_views, views
from frontend import volume_views as volumes
from frontend.console import session_probe
from scheduler.choices import WorkloadKind


def _workload_routes(prefix: str, kind: str, name: str) -> list:
    k = {"kind": kind}
    return [
        path(f"{prefix}/", views.workload_list, k, name=f"{name}s"),
        path(f"{prefix}/<uuid:pk>/", views.workload_detail, k, name=name),
        path(f"{prefix}/<uuid:pk>/live", views.workload_live, k, name=f"{name}_live"),
        path(f"{prefix}/<uuid:pk>/metrics.json", views.workload_metrics, k, name=f"{name}_metrics"),
        path(f"{prefix}/<uuid:pk>/logs", views.workload_logs, k, name=f"{name}_logs"),
        path(f"{prefix}/<uuid:pk>/stop", views.workload_stop, k, name=f"{name}_stop"),
        path(f"{prefix}/<uuid:pk>/terminate", views.workload_terminate, k, name=f"{name}_terminate"),
        *([path(f"{prefix}/<uuid:pk>/start", views.workload_start, k, name=f"{name}_start")]
          if kind == WorkloadKind.INSTANCE else []),
    ]


console = [
    path("", views.dashboard, name="dashboard"),
    path("signin/", account.sign_in, name="login"),
    path("signin/code/", account.signin_code, name="signin_code"),
    path("signup/", account.signup, name="signup"),
    path("verify-email/", account.verify_email, name="verify_email"),
    path("verify-email/resend", account.verify_email_resend, name="verify_email_resend"),
    path("password-reset/", account.password_reset, name="password_reset"),
    path("password-reset/sent/", account.password_reset_done, name="password_reset_done"),
    path("password-reset/<uidb64>/<token>/", account.password_reset_confirm,
         name="password_reset_confirm"),
    path("password-reset/done/", account.password_reset_complete, name="password_reset_complete"),
    path("settings/security/", account.security, name="security"),
    path("signout/", views.signout, name="logout"),
    path("session", session_probe, name="session"),
    path("inbox/", notification_views.inbox, name="inbox"),
    path("settings/notifications/", notification_views.notification_settings, name="notification_settings"),
    path("tenant/", views.tenant_switch, name="tenant_switch"),
    path("invitations/accept/", views.invitation_accept, name="invitation_accept"),
    path("catalogue/", views.catalogue, name="catalogue"),
    path("launch/", views.launch, name="launch"),
    path("launch/price", views.launch_price, name="launch_price"),
    *_workload_routes("instances", WorkloadKind.INSTANCE, "instance"),
    path("instances/<uuid:pk>/terminal/", views.instance_terminal, name="instance_terminal"),
    *_workload_routes("jobs", WorkloadKind.JOB, "job"),
    path("groups/", groups.group_list, name="groups"),
    path("groups/new", groups.group_create, name="group_create"),
    path("groups/<uuid:pk>/", groups.group_detail, name="group"),
    path("groups/<uuid:pk>/scale", groups.group_scale, name="group_scale"),
    path("groups/<uuid:pk>/protect", groups.group_protect, name="group_protect"),
    path("groups/<uuid:pk>/schedule", groups.group_schedule, name="group_schedule"),
    path("groups/<uuid:pk>/delete", groups.group_delete, name="group_delete"),
    path("jobs/arrays/new", array_views.job_array_create, name="job_array_create"),
    path("jobs/arrays/<uuid:pk>/stop", views.job_array_stop, name="job_array_stop"),
    path("alarms/", alarm_views.alarm_list, name="alarms"),
    path("alarms/<uuid:pk>/", alarm_views.alarm_detail, name="alarm"),
    path("alarms/<uuid:pk>/delete", alarm_views.alarm_delete, name="alarm_delete"),
    path("volumes/", volumes.volume_list, name="volumes"),
    path("volumes/<uuid:pk>/", volumes.volume_detail, name="volume"),
    path("volumes/<uuid:pk>/delete", volumes.volume_delete, name="volume_delete"),
    path("usage/", views.usage, name="usage"),
    path("invoices/<uuid:pk>/", views.invoice_detail, name="invoice"),
    path("invoices/<uuid:pk>/csv", views.invoice_download, name="invoice_csv"),
    path("budgets/", views.budget_create, name="budget_create"),
    path("credit/top-up", views.topup_create, name="topup_create"),
    path("budgets/<uuid:pk>/delete", views.budget_delete, name="budget_delete"),
    path("settings/api-keys/", views.api_keys, name="api_keys"),
    path("settings/api-keys/<uuid:pk>/revoke", views.api_key_revoke, name="api_key_revoke"),
    path("settings/ssh-keys/", views.ssh_keys, name="ssh_keys"),
    path("settings/ssh-keys/<int:pk>/delete", views.ssh_key_delete, name="ssh_key_delete"),
    path("settings/members/", views.members, name="members"),
    path("settings/members/<uuid:pk>/role", views.member_role, name="member_role"),
    path("settings/members/<uuid:pk>/remove", views.member_remove, name="member_remove"),
    path("settings/quotas/", views.quotas, name="quotas"),
]

urlpatterns = [
    path("", views.home, name="home"),
    # what browsers ask for without a <link rel="icon">, e.g. for the API's pages
    path("favicon.ico", views.favicon, name="favicon"),
    path("healthz", views.healthz, name="healthz"),
    path("console/", include((console, "console"))),
]
