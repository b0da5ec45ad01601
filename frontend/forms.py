"""Console forms. They shape browser input into what the API accepts; they hold no rules.

Each form's `api_data()` is the JSON body the API would receive. The view validates it
with the API's own serializer and hands it to the same service, so a bad value gets the
same message in the console as from `curl`.
"""
from __future__ import annotations

from dataclasses import dataclass

from django import forms
from django.contrib.auth import forms as auth_forms
from django.contrib.auth.forms import AuthenticationForm

from gpucloud.catalogue.selectors import instance_type_list, region_list
from gpucloud.lib import paths
from gpucloud.tenancy.choices import Role, Scope


class ContainerPathFormField(forms.CharField):
    """A path inside the container: the API's one rule (`gpucloud.lib.paths.container_path`), said
    beside the field itself rather than only under the API field it feeds."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("max_length", paths.MAX_LENGTH)
        super().__init__(**kwargs)

    def clean(self, value):
        value = super().clean(value)
        if value in self.empty_values:
            return value
        try:
            return paths.container_path(value)
        except paths.PathError as e:
            raise forms.ValidationError(str(e)) from None


@dataclass(frozen=True)
class ImageTemplate:
    label: str
    image: str
    ports: str = ""
    command: str = ""


# What the launch page offers; "custom" is any image. Ports are the ones each image serves.
IMAGE_TEMPLATES: dict[str, ImageTemplate] = {
    "pytorch": ImageTemplate("PyTorch", "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime", command="sleep infinity"),
    "tensorflow": ImageTemplate("TensorFlow", "tensorflow/tensorflow:2.17.0-gpu", command="sleep infinity"),
    "jax": ImageTemplate("JAX", "nvcr.io/nvidia/jax:24.04-py3", command="sleep infinity"),
    "jupyter": ImageTemplate("Jupyter", "quay.io/jupyter/pytorch-notebook:cuda12-latest", ports="8888"),
    "blender": ImageTemplate("Blender", "linuxserver/blender:4.2.0", ports="3000"),
    "custom": ImageTemplate("Any image", ""),
}


# What a field holding a NUL character says: the API's own words (DRF's CharField).
NUL_REFUSED = "Null characters are not allowed."


def _carries_nul(value) -> bool:
    values = value if isinstance(value, list | tuple) else [value]
    return any(isinstance(v, str) and "\x00" in v for v in values)


class RefuseNul:
    """A form mixin: a field whose input holds a NUL character is refused with a field error
    before its value can go anywhere (PostgreSQL cannot hold a NUL in text, and a choice or a
    lookup built from it was a 500). Django's CharField refuses NUL already; this covers every
    field (choices, numbers, multiple choices) and what a field's own cleaning would do with it.
    Every console form has it (tests/frontend/test_console_forms.py walks them)."""

    def _clean_fields(self) -> None:
        refused = [name for name in self.fields if _carries_nul(self[name].data)]
        if not refused:
            return super()._clean_fields()
        # The other fields are cleaned as usual; these never reach their own cleaning.
        every = self.fields
        self.fields = {name: field for name, field in every.items() if name not in refused}
        try:
            super()._clean_fields()
        finally:
            self.fields = every
        for name in refused:
            self.add_error(name, forms.ValidationError(NUL_REFUSED, code="null_characters_not_allowed"))
        return None


class ConsoleForm(RefuseNul, forms.Form):
    """The base of every console form."""


class SignInForm(RefuseNul, AuthenticationForm):
    username = forms.EmailField(label="E-mail", widget=forms.EmailInput(attrs={"autofocus": True,
                                                                                 "autocomplete": "email"}))
    error_messages = {
        **AuthenticationForm.error_messages,
        # the people signing in know an e-mail address, not a "username"
        "invalid_login": "That e-mail address and password do not match an account. Both are as you typed them "
                         "at sign-up; the password is case-sensitive.",
    }


class PasswordResetForm(RefuseNul, auth_forms.PasswordResetForm):
    """Django's (the address to mail a link to)."""


class SetPasswordForm(RefuseNul, auth_forms.SetPasswordForm):
    """Django's (the new password, twice), behind the mailed link."""


class SignUpForm(ConsoleForm):
    email = forms.EmailField(label="E-mail", max_length=254,
                             widget=forms.EmailInput(attrs={"autocomplete": "email"}))
    name = forms.CharField(label="Your name", max_length=150, required=False,
                           widget=forms.TextInput(attrs={"autocomplete": "name"}))
    tenant_name = forms.CharField(label="Organisation", max_length=100,
                                  help_text="Your team or company; you can invite others later.")
    password = forms.CharField(label="Password", max_length=128,
                               widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
                               help_text="At least 8 characters, not a common password.")

    def api_data(self) -> dict:
        # An empty optional field is left out, as a JSON client would.
        return {k: v for k, v in self.cleaned_data.items() if v or k != "name"}


class OtpCodeForm(ConsoleForm):
    """The second step of signing in, and the confirmation of a new or removed device."""

    code = forms.CharField(label="Code from your authenticator app", max_length=16,
                           widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric",
                                                         "autofocus": True}))


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _as_int(text: str) -> int | str:
    """A number typed into a text box, as the API's JSON wants it; other text is left for it to refuse."""
    try:
        return int(text)
    except ValueError:
        return text


class VolumeSelect(forms.Select):
    """Each volume's option carries its region (`data-region`): the launch page offers only
    the chosen region's volumes."""

    regions: dict[str, str] = {}

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex=subindex, attrs=attrs)
        region = self.regions.get(str(value))
        if region:
            option["attrs"]["data-region"] = region
        return option


class LaunchForm(ConsoleForm):
    kind = forms.ChoiceField(label="What", choices=[("instance", "Instance (runs until you stop it)"),
                                                    ("job", "Batch job (runs to completion)")],
                             initial="instance", widget=forms.RadioSelect)
    name = forms.CharField(label="Name", max_length=100)
    instance_type = forms.ChoiceField(label="Instance type")
    region = forms.ChoiceField(label="Region")
    template = forms.ChoiceField(label="Image template", initial="pytorch", widget=forms.RadioSelect,
                                 choices=[(k, t.label) for k, t in IMAGE_TEMPLATES.items()])
    image = forms.CharField(label="Image", max_length=500, required=False,
                            help_text="Any container image; a template fills this in.")
    command = forms.CharField(label="Command", max_length=8192, required=False,
                              help_text="Run by /bin/sh -c; empty: the image's own.")
    env = forms.CharField(label="Environment", required=False, widget=forms.Textarea(attrs={"rows": 3}),
                          help_text="One KEY=value per line.")
    ssh_keys = forms.CharField(label="SSH public keys", required=False,
                               widget=forms.Textarea(attrs={"rows": 2}),
                               help_text="One per line, e.g. ssh-ed25519 AAAA… you@laptop.")
    saved_ssh_keys = forms.MultipleChoiceField(label="Your saved SSH keys", required=False,
                                               widget=forms.CheckboxSelectMultiple)
    ports = forms.CharField(label="Ports", max_length=200, required=False,
                            help_text="Comma-separated, e.g. 22, 8888.")
    spot = forms.BooleanField(label="Spot (cheaper; may be preempted with notice)", required=False)
    max_price = forms.DecimalField(label="Max spot price per hour", required=False, min_value=0,
                                   decimal_places=4, max_digits=12,
                                   help_text="Spot only; empty: any price up to on-demand.")
    max_retries = forms.IntegerField(label="Retries", required=False, min_value=0, initial=0,
                                     help_text="Batch jobs: how often a failed run starts again.")
    timeout_s = forms.IntegerField(label="Timeout (seconds)", required=False, min_value=1,
                                   help_text="Batch jobs: stop a run that takes longer.")
    auto_stop_idle_minutes = forms.IntegerField(
        label="Stop when idle for (minutes)", required=False, min_value=1,
        help_text="Instances: stop it once every GPU has been under 5 % busy this long; empty: never.")
    volume = forms.ChoiceField(label="Volume", required=False, widget=VolumeSelect,
                               help_text="One of your volumes in the launch's region: its files outlive the "
                                         "instance, and it starts on the volume's host.")
    mount_path = ContainerPathFormField(label="Mount path", required=False, initial="/workspace",
                                        help_text="Where the container sees the volume.")

    # API field -> form field, for errors the serializer or the service reports.
    FIELD_MAP = {"billing": "spot", "volumes": "volume"}

    def __init__(self, *args, saved_keys: list | None = None, volumes: list | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["volume"].choices = [("", "No volume")] + [
            (str(v.pk), f"{v.name} — {v.region.code}, {v.size_gib} GiB") for v in volumes or []]
        self.fields["volume"].widget.regions = {str(v.pk): v.region.code for v in volumes or []}
        self.fields["instance_type"].choices = [
            (it.code, f"{it.code} — {it.name}, {it.vcpus} vCPUs, {it.memory_gib} GiB")
            for it in instance_type_list().order_by("gpu_model__code", "gpu_count", "gpu_share_milli")
        ]
        self.fields["region"].choices = [(r.code, f"{r.code} — {r.name}") for r in region_list().order_by("code")]
        self.saved_keys = {str(k.pk): k for k in saved_keys or []}
        self.fields["saved_ssh_keys"].choices = [(pk, k.name) for pk, k in self.saved_keys.items()]
        if not self.saved_keys:
            del self.fields["saved_ssh_keys"]

    def clean(self):
        data = super().clean()
        template = IMAGE_TEMPLATES.get(data.get("template") or "custom", IMAGE_TEMPLATES["custom"])
        if not data.get("image"):
            if not template.image:
                self.add_error("image", "Choose a template or give an image.")
            data["image"] = template.image
        env: dict[str, str] = {}
        for n, line in enumerate(_lines(data.get("env") or ""), start=1):
            key, sep, value = line.partition("=")
            if not sep:
                self.add_error("env", f"Line {n} is not KEY=value.")
                break
            env[key.strip()] = value
        data["env_dict"] = env
        return data

    def api_data(self) -> dict:
        """The body the API's create serializer validates."""
        d = self.cleaned_data  # also of an invalid form (its valid fields): the API then says the rest at once
        keys = _lines(d.get("ssh_keys") or "")
        keys += [self.saved_keys[pk].public_key for pk in d.get("saved_ssh_keys") or [] if pk in self.saved_keys]
        body = {
            "name": d.get("name", ""), "instance_type": d.get("instance_type", ""), "region": d.get("region", ""),
            "image": d.get("image", ""), "command": d.get("command") or "", "env": d.get("env_dict", {}),
            "ports": [_as_int(p.strip()) for p in (d.get("ports") or "").replace(" ", ",").split(",") if p.strip()],
            "ssh_keys": keys, "billing": "spot" if d.get("spot") else "on_demand",
        }
        if d.get("max_price") is not None:
            body["max_price"] = str(d["max_price"])
        if d.get("volume"):
            body["volumes"] = [{"volume": d["volume"], "mount_path": d.get("mount_path") or "/workspace"}]
        if d.get("kind") != "job" and d.get("auto_stop_idle_minutes"):
            body["auto_stop_idle_minutes"] = d["auto_stop_idle_minutes"]
        if d.get("kind") == "job":
            body["max_retries"] = d.get("max_retries") or 0
            if d.get("timeout_s"):
                body["timeout_s"] = d["timeout_s"]
        return body


class ApiKeyForm(ConsoleForm):
    name = forms.CharField(label="Name", max_length=100, help_text="What uses it, e.g. “CI” or “laptop”.")
    scopes = forms.MultipleChoiceField(label="Scopes", choices=Scope.choices, initial=[Scope.READ],
                                       widget=forms.CheckboxSelectMultiple,
                                       help_text="read: look; write: launch and stop; admin: everything your role may.")
    expires_in_days = forms.IntegerField(label="Expires in (days)", required=False, min_value=1,
                                         help_text="Empty: never.")

    def api_data(self) -> dict:
        d = {"name": self.cleaned_data["name"], "scopes": self.cleaned_data["scopes"]}
        if self.cleaned_data.get("expires_in_days"):
            d["expires_in_days"] = self.cleaned_data["expires_in_days"]
        return d


class SshKeyForm(ConsoleForm):
    name = forms.CharField(label="Name", max_length=100)
    public_key = forms.CharField(label="Public key", widget=forms.Textarea(attrs={"rows": 3}),
                                 help_text="The contents of ~/.ssh/id_ed25519.pub (or another .pub file).")


class InviteForm(ConsoleForm):
    email = forms.EmailField(label="Email")
    role = forms.ChoiceField(label="Role", choices=Role.choices, initial=Role.MEMBER)

    def api_data(self) -> dict:
        return dict(self.cleaned_data)


class InvitationAcceptForm(ConsoleForm):
    token = forms.CharField(label="Invitation token", max_length=200,
                            help_text="The inv_… token an owner or admin sent you.")


class RoleForm(ConsoleForm):
    role = forms.ChoiceField(label="Role", choices=Role.choices)


class TopUpForm(ConsoleForm):
    amount = forms.DecimalField(label="Amount", max_digits=12, decimal_places=2, initial=100,
                                help_text="Added to your credit balance once it is paid or approved.")


class BudgetForm(ConsoleForm):
    name = forms.CharField(label="Name", max_length=100, initial="monthly")
    monthly_amount = forms.DecimalField(label="Monthly amount", max_digits=14, decimal_places=2)
    thresholds = forms.CharField(label="Alert at (%)", initial="50, 80, 100", required=False,
                                 help_text="Comma-separated percentages of the monthly amount.")
    notify_email = forms.BooleanField(label="Email owners and admins", required=False, initial=True)
    webhook_url = forms.URLField(label="Webhook URL", required=False, assume_scheme="https")
    hard_stop = forms.BooleanField(label="Refuse new launches past 100 %", required=False)

    def api_data(self) -> dict:
        d = dict(self.cleaned_data)
        d["monthly_amount"] = str(d["monthly_amount"])
        thresholds = [_as_int(t.strip()) for t in (d.pop("thresholds") or "").split(",") if t.strip()]
        if thresholds:
            d["thresholds"] = thresholds
        return d
