"""The console's account pages: sign in (with the second factor), sign up, email confirmation,
password reset, and two-factor settings. `/api/auth/login/` (the browsable API's sign-in)
is the same sign-in with DRF's template.

Every password check is Django's `authenticate(request=...)` inside `AuthenticationForm`,
so django-axes counts failures and refuses locked-out sign-ins here (docs/console.md).
"""
from __future__ import annotations

import base64
import hashlib
import logging
import time

import segno
from axes.utils import reset as axes_reset
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView, redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils.http import url_has_allowed_host_and_scheme
from django_otp import login as otp_login

from frontend.console import Console, account_view, apply_errors, service_error_to_form
from frontend.forms import OtpCodeForm, PasswordResetForm, SetPasswordForm, SignInForm, SignUpForm
from gpucloud.api.throttling import SignupThrottle
from gpucloud.api.views import resolve_tenant
from gpucloud.lib import ratelimit
from gpucloud.lib.errors import ServiceError
from gpucloud.lib.http import client_ip
from gpucloud.tenancy import selectors as tenancy_selectors
from gpucloud.tenancy import services as tenancy_services
from gpucloud.tenancy.api import serializers as tenancy_s
from gpucloud.tenancy.audit import Actor, acting_as
from gpucloud.tenancy.selectors import membership_list_for_user

logger = logging.getLogger(__name__)

# Between the password and the code: who, with which backend, since when, going where.
PENDING = "signin_pending"
PENDING_TTL_S = 300


# ------------------------------------------------------------------ sign in


class SignInView(LoginView):
    """Step one: the password. A user with two-factor on is not signed in yet: the session
    remembers them for PENDING_TTL_S and the code page finishes the sign-in."""

    template_name = "frontend/signin.html"
    authentication_form = SignInForm
    redirect_authenticated_user = True

    def get_default_redirect_url(self):
        return reverse("console:dashboard")

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "open_signup": settings.OPEN_SIGNUP}

    def form_valid(self, form):
        user = form.get_user()
        if tenancy_selectors.totp_device_for(user=user) is None:
            return super().form_valid(form)
        self.request.session[PENDING] = {"user": user.pk, "backend": user.backend, "at": int(time.time()),
                                         "next": self.get_success_url()}
        return redirect("console:signin_code")


class ApiSignInView(SignInView):
    """/api/auth/login/: the browsable API's sign-in (DRF's template, any username)."""

    template_name = "rest_framework/login.html"
    authentication_form = AuthenticationForm


@account_view(methods=("GET", "POST"))
def signin_code(request: HttpRequest) -> HttpResponse:
    """Step two: the code from the user's authenticator app (django-otp's throttling applies)."""
    pending = request.session.get(PENDING)
    if not pending or time.time() - pending.get("at", 0) > PENDING_TTL_S:
        request.session.pop(PENDING, None)
        messages.info(request, "Sign in again: the code step waited too long.")
        return redirect("console:login")
    user = get_user_model().objects.filter(pk=pending["user"], is_active=True).first()
    device = tenancy_selectors.totp_device_for(user=user)
    if user is None or device is None:
        request.session.pop(PENDING, None)
        return redirect("console:login")
    form = OtpCodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        error = tenancy_services.totp_check(device=device, token=form.cleaned_data["code"])
        if error:
            form.add_error("code", error)
        else:
            request.session.pop(PENDING, None)
            user.otp_device = device  # django_otp keeps it in the session: is_verified()
            login(request, user, backend=pending["backend"])
            target = pending.get("next") or ""
            if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                                   require_https=request.is_secure()):
                target = reverse("console:dashboard")
            return redirect(target)
    return render(request, "frontend/signin_code.html", {"form": form},
                  status=400 if form.is_bound and form.errors else 200)


# ------------------------------------------------------------------ sign up


def _verify_url(request: HttpRequest) -> str:
    return request.build_absolute_uri(reverse("console:verify_email"))


def _throttled(request: HttpRequest, form) -> HttpResponse | None:
    """The per-address sign-up limit (the API's `SignupThrottle`, one count for both)."""
    throttle = SignupThrottle()
    if throttle.allow_request(request, None):
        return None
    wait = int(throttle.wait() or 60)
    form.add_error(None, f"Too many sign-ups from your address: try again in {max(1, wait // 60)} minutes.")
    response = render(request, "frontend/signup.html", {"form": form}, status=429)
    response["Retry-After"] = str(wait)
    return response


@account_view(methods=("GET", "POST"))
def signup(request: HttpRequest) -> HttpResponse:
    """Create an account and the tenant it owns (the API's sign-up, in a form)."""
    if request.user.is_authenticated:
        return redirect("console:dashboard")
    if not settings.OPEN_SIGNUP:
        return render(request, "frontend/signup.html", {"closed": tenancy_services.SIGNUP_CLOSED},
                      status=403 if request.method == "POST" else 200)
    form = SignUpForm(request.POST or None)
    if request.method == "POST":
        refused = _throttled(request, form)
        if refused is not None:
            return refused
    if request.method == "POST" and form.is_valid():
        ser = tenancy_s.SignupSerializer(data=form.api_data())
        if not ser.is_valid():
            apply_errors(form, ser.errors)
        else:
            data = ser.validated_data
            try:
                with acting_as(Actor(ip=client_ip(request))):
                    user, tenant = tenancy_services.user_signup(
                        email=data["email"], password=data["password"], tenant_name=data["tenant_name"],
                        full_name=data["name"])
            except ServiceError as exc:
                service_error_to_form(form, exc)
            else:
                tenancy_services.email_verification_send(user=user, verify_url=_verify_url(request))
                login(request, user, backend="django.contrib.auth.backends.ModelBackend")
                request.session["tenant_id"] = str(tenant.pk)
                messages.success(request, f"Welcome! We sent a link to {user.email}: open it to confirm your "
                                          f"address, and {tenant.name} receives its starting credit.")
                return redirect("console:dashboard")
    return render(request, "frontend/signup.html", {"form": form})


@account_view(methods=("GET",))
def verify_email(request: HttpRequest) -> HttpResponse:
    """The emailed link: confirms the address and grants the sign-up credit, once."""
    try:
        with acting_as(Actor(ip=client_ip(request))):
            row, newly = tenancy_services.email_verify(token=request.GET.get("token", ""))
    except ServiceError as exc:
        return render(request, "frontend/verify_email.html", {"error": exc.message}, status=400)
    if newly:
        messages.success(request, f"{row.email} is confirmed"
                         + (f": {row.tenant.name} received its sign-up credit." if row.tenant else "."))
    else:
        messages.info(request, f"{row.email} was already confirmed.")
    # Away from the URL with the token in it.
    return redirect("console:dashboard" if request.user.is_authenticated else "console:login")


@account_view(methods=("POST",))
def verify_email_resend(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return redirect_to_login(reverse("console:dashboard"), reverse("console:login"))
    pending = tenancy_selectors.email_verification_pending(user=request.user)
    if pending is not None:
        if not SignupThrottle().allow_request(request, None):
            messages.error(request, "Too many mails from your address: try again later.")
        elif tenancy_services.email_verification_send(user=request.user, verify_url=_verify_url(request)):
            messages.success(request, f"We sent a new link to {request.user.email}.")
        else:
            messages.error(request, "The mail could not be sent just now: try again in a few minutes.")
    return redirect("console:dashboard")


# ------------------------------------------------------------------ password reset (Django's views)


def password_reset_allowed(request: HttpRequest, *, email: str) -> bool:
    """Whether a reset mail may go out now: per client address (PASSWORD_RESET_RATE_LIMIT_IP),
    then per e-mail address (PASSWORD_RESET_RATE_LIMIT_EMAIL), counted for every address
    asked about, known or not, so the count says nothing about which accounts exist. A
    request refused by its client's limit does not count against the address it names."""
    address = hashlib.sha256(email.strip().lower().encode()).hexdigest()  # no address in Redis keys
    for key, rate in ((f"pwreset:ip:{client_ip(request) or 'unknown'}", settings.PASSWORD_RESET_RATE_LIMIT_IP),
                      (f"pwreset:email:{address}", settings.PASSWORD_RESET_RATE_LIMIT_EMAIL)):
        limit, window_s = ratelimit.parse_rate(rate)
        if not ratelimit.hit(key=key, limit=limit, window_s=window_s).allowed:
            return False
    return True


class PasswordResetView(auth_views.PasswordResetView):
    """Django's, throttled: past a limit the page answers as always ("if an account has this
    address, a mail is on its way") and sends nothing, so nobody can bomb a mailbox with
    reset mails, and the answer tells nobody whether the address has an account."""

    template_name = "frontend/password_reset.html"
    email_template_name = "frontend/email/password_reset.txt"
    subject_template_name = "frontend/email/password_reset_subject.txt"
    success_url = reverse_lazy("console:password_reset_done")
    form_class = PasswordResetForm

    def form_valid(self, form):
        if not password_reset_allowed(self.request, email=form.cleaned_data["email"]):
            logger.warning("password reset refused by its rate limit, from %s", client_ip(self.request))
            return HttpResponseRedirect(self.get_success_url())
        return super().form_valid(form)


class PasswordResetDoneView(auth_views.PasswordResetDoneView):
    template_name = "frontend/password_reset_done.html"


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    """Django's: the link's token goes into the session and the browser is sent on to a URL
    without it (`…/set-password/`), so it leaks through no Referer or history."""

    template_name = "frontend/password_reset_confirm.html"
    success_url = reverse_lazy("console:password_reset_complete")
    form_class = SetPasswordForm

    def form_valid(self, form):
        response = super().form_valid(form)
        # Whoever reads the mailbox may sign in again now: the account's failures are cleared
        # (those of an address stay).
        axes_reset(username=self.user.get_username().lower())
        return response


class PasswordResetCompleteView(auth_views.PasswordResetCompleteView):
    template_name = "frontend/password_reset_complete.html"


# The routes (frontend/urls.py), each declaring its methods (tests/frontend/test_console_routes.py).
sign_in = account_view(methods=("GET", "POST"))(SignInView.as_view())
password_reset = account_view(methods=("GET", "POST"))(PasswordResetView.as_view())
password_reset_done = account_view(methods=("GET",))(PasswordResetDoneView.as_view())
password_reset_confirm = account_view(methods=("GET", "POST"))(PasswordResetConfirmView.as_view())
password_reset_complete = account_view(methods=("GET",))(PasswordResetCompleteView.as_view())


# ------------------------------------------------------------------ two-factor settings


def _console_or_none(request: HttpRequest) -> Console | None:
    """The console context when the user has a tenant (operators may have none): the page
    is about the user, not a tenant, so it works either way."""
    membership = resolve_tenant(request)
    if membership is None:
        return None
    return Console(membership=membership, granted=tenancy_selectors.member_permissions(membership=membership),
                   memberships=list(membership_list_for_user(user=request.user)))


@account_view(methods=("GET", "POST"))
def security(request: HttpRequest) -> HttpResponse:
    """Turn two-factor (TOTP) on: a new secret as a QR code and an otpauth URI, confirmed with
    a code; or off, with a current code."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), reverse("console:login"))
    request.console = _console_or_none(request)  # type: ignore[attr-defined]
    user = request.user
    device = tenancy_selectors.totp_device_for(user=user)
    setup = None if device else tenancy_selectors.totp_device_for(user=user, confirmed=False)
    form = OtpCodeForm(request.POST or None) if request.POST.get("action") != "start" else OtpCodeForm()
    action = request.POST.get("action")
    if request.method == "POST":
        with acting_as(Actor(user=user, ip=client_ip(request))):
            if action == "start" and device is None:
                tenancy_services.totp_device_start(user=user)
                return redirect("console:security")
            if action in ("confirm", "disable") and form.is_valid():
                target = setup if action == "confirm" else device
                if target is None:
                    return redirect("console:security")
                try:
                    if action == "confirm":
                        tenancy_services.totp_device_confirm(user=user, device=target, token=form.cleaned_data["code"])
                        otp_login(request, target)  # this session has just proven the device
                        messages.success(request, "Two-factor authentication is on: sign-ins now ask for a code.")
                    else:
                        tenancy_services.totp_device_remove(user=user, device=target, token=form.cleaned_data["code"])
                        messages.success(request, "Two-factor authentication is off.")
                except ServiceError as exc:
                    service_error_to_form(form, exc)
                else:
                    return redirect("console:security")
    ctx = {"device": device, "setup": setup, "form": form,
           "require_staff": settings.REQUIRE_2FA_FOR_STAFF and user.is_staff}
    if setup is not None:
        uri = setup.config_url
        ctx.update(otpauth_uri=uri, qr_svg=segno.make(uri, error="m").svg_inline(scale=5, dark="#0f172a"),
                   secret=_b32(setup.bin_key))
    return render(request, "frontend/settings_security.html", ctx,
                  status=400 if form.is_bound and form.errors else 200)


def _b32(key: bytes) -> str:
    text = base64.b32encode(key).decode().rstrip("=")
    return " ".join(text[i:i + 4] for i in range(0, len(text), 4))
