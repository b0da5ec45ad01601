"""The operators' admin site: Django's, with a second factor (django-otp's TOTP devices).

`gpucloud.apps.AdminConfig` replaces "django.contrib.admin" in INSTALLED_APPS so that
`admin.site` (and every `admin.register`) is this `AdminSite`. Its sign-in asks for the code of the user's
TOTP device when they have one, and its gate (`has_permission`) lets a staff user in only
with a session verified by that device; with REQUIRE_2FA_FOR_STAFF, staff without a device
are kept out too until they set one up (console: Settings → Security). The password check is
Django's `authenticate(request=...)`, so django-axes counts and locks here as everywhere.
"""
from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.http import HttpRequest

from gpucloud.tenancy import selectors, services

STAFF_NEEDS_2FA = (
    "Operators must use two-factor authentication here: turn it on in the console under "
    "Settings → Security (/console/settings/security/), then sign in again."
)


def otp_token_field() -> forms.CharField:
    return forms.CharField(
        label="Two-factor code", required=False, max_length=16,
        help_text="The 6-digit code from your authenticator app, if you turned two-factor on.",
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric"}),
    )


class AdminLoginForm(AdminAuthenticationForm):
    otp_token = otp_token_field()

    def clean(self):
        cleaned = super().clean()  # the password (axes counts it) and is_staff
        user = self.get_user()
        device = selectors.totp_device_for(user=user)
        if device is None:
            if settings.REQUIRE_2FA_FOR_STAFF:
                raise forms.ValidationError(STAFF_NEEDS_2FA, code="otp_required")
            return cleaned
        error = services.totp_check(device=device, token=cleaned.get("otp_token") or "")
        if error:
            raise forms.ValidationError(error, code="otp_invalid")
        user.otp_device = device  # django_otp keeps it in the session at login: is_verified()
        return cleaned


class AdminSite(admin.AdminSite):
    login_form = AdminLoginForm
    login_template = "admin/gpucloud_login.html"

    def has_permission(self, request: HttpRequest) -> bool:
        if not super().has_permission(request):
            return False
        if request.user.is_verified():
            return True
        # Not verified this session: fine only for staff without a device, when not required.
        return not settings.REQUIRE_2FA_FOR_STAFF and selectors.totp_device_for(user=request.user) is None
