"""Console pages for notifications: the inbox (yours, in this tenant) and what you are told of
how. The same services as /api/v1/notifications and /api/v1/notification-settings."""
from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import redirect, render

from frontend.console import console_view, service_error_to_form
from frontend.forms import ConsoleForm
from gpucloud.lib.errors import ServiceError
from gpucloud.tenancy import permissions as perms
from notifications import selectors, services
from notifications.choices import OPERATOR_EVENTS, Channel, Event, Scope
from notifications.models import NotificationSettings


def email_destination() -> str:
    """Where this deployment's e-mail goes, said plainly (the demo prints it in its terminal)."""
    backend = settings.EMAIL_BACKEND.rsplit(".", 2)[-2]
    return {
        "console": "printed in the terminal running the server (make demo): no mail leaves this machine",
        "locmem": "kept in memory (tests)",
        "filebased": f"written to files in {getattr(settings, 'EMAIL_FILE_PATH', '?')}",
        "dummy": "dropped (EMAIL_BACKEND is the dummy backend)",
    }.get(backend, f"sent through {settings.EMAIL_HOST}:{settings.EMAIL_PORT}")


@console_view(read=perms.NOTIFICATIONS_READ, write=perms.NOTIFICATIONS_MANAGE)
def inbox(request):
    """Your notifications in this tenant; POST marks them read (one, or all)."""
    c = request.console
    if request.method == "POST":
        one = request.POST.get("id")
        ids = [int(one)] if one and one.isdigit() else None
        n = services.notifications_mark_read(user=request.user, tenant=c.tenant, ids=ids)
        messages.success(request, f"Marked {n} read.")
        return redirect("console:inbox")
    unread = request.GET.get("show") == "unread"
    rows = selectors.notification_list(user=request.user, tenant=c.tenant, unread=unread)
    page = Paginator(rows, 50).get_page(request.GET.get("page"))
    return render(request, "frontend/inbox.html", {"page": page, "unread_only": unread,
                                                   "email_to": email_destination()})


class NotificationSettingsForm(ConsoleForm):
    scope = forms.ChoiceField(label="Tell me about", choices=Scope.choices)
    webhook_url = forms.CharField(label="Webhook URL", required=False, max_length=500,
                                  help_text="https, a public address; signed with a secret shown once")

    def __init__(self, *args, current: NotificationSettings | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        current = current or NotificationSettings()  # the defaults
        self.events = [e for e in Event if e not in OPERATOR_EVENTS]
        for e in self.events:
            self.fields[f"ch:{e.value}"] = forms.MultipleChoiceField(
                label=e.label, required=False, choices=Channel.choices, widget=forms.CheckboxSelectMultiple,
                initial=list(selectors.channels_for(current, e)))

    def channels(self) -> dict[str, list[str]]:
        return {e.value: list(self.cleaned_data[f"ch:{e.value}"]) for e in self.events}


@console_view(read=perms.NOTIFICATIONS_READ, write=perms.NOTIFICATIONS_MANAGE)
def notification_settings(request):
    c = request.console
    current = selectors.settings_for(user=request.user, tenant=c.tenant)
    initial = {"scope": current.scope, "webhook_url": current.webhook_url}
    form = NotificationSettingsForm(request.POST or None, current=current, initial=initial)
    secret = None
    if request.method == "POST" and form.is_valid():
        try:
            _, secret = services.notification_settings_update(
                user=request.user, tenant=c.tenant, scope=form.cleaned_data["scope"], channels=form.channels(),
                webhook_url=form.cleaned_data["webhook_url"])
        except ServiceError as e:
            service_error_to_form(form, e)
        else:
            if not secret:
                messages.success(request, "Saved.")
                return redirect("console:notification_settings")
            messages.success(request, "Saved. Your webhook's signing secret is below: it is shown this once.")
    rows = [(e, [form[f"ch:{e.value}"]]) for e in form.events]
    return render(request, "frontend/settings_notifications.html",
                  {"form": form, "rows": rows, "secret": secret, "email_to": email_destination(),
                   "email": request.user.email})
