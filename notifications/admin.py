from __future__ import annotations

from django.contrib import admin

from notifications.models import Notification, NotificationCursor, NotificationSettings


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ["created_at", "user", "tenant", "event", "subject", "email_status", "webhook_status", "read_at"]
    list_filter = ["event", "email_status", "webhook_status"]
    search_fields = ["subject", "user__email", "key"]
    readonly_fields = [f.name for f in Notification._meta.fields]


@admin.register(NotificationSettings)
class NotificationSettingsAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "scope", "webhook_url", "updated_at"]
    exclude = ["webhook_secret_sealed"]


@admin.register(NotificationCursor)
class NotificationCursorAdmin(admin.ModelAdmin):
    list_display = ["name", "until", "updated_at"]
