"""Prepare the local demo: an operator account and a demo tenant with a user. Idempotent."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from gpucloud.tenancy.models import Membership
from gpucloud.tenancy.services import tenant_create

User = get_user_model()

OPERATOR = ("admin@gpucloud.local", "gpucloud-admin")
DEMO_USER = ("demo@gpucloud.local", "gpucloud-demo")


class Command(BaseCommand):
    help = "Create the demo operator (admin) and demo tenant user, printing their logins."

    @transaction.atomic
    def handle(self, *args, **options):
        email, password = OPERATOR
        if not User.objects.filter(username=email).exists():
            User.objects.create_superuser(username=email, email=email, password=password)
        email, password = DEMO_USER
        user = User.objects.filter(username=email).first()
        if user is None:
            user = User.objects.create_user(username=email, email=email, password=password,
                                            first_name="Demo", last_name="User")
        if not Membership.objects.filter(user=user).exists():
            tenant_create(name="Demo Lab", owner=user)
        self.stdout.write(f"operator login: {OPERATOR[0]} / {OPERATOR[1]}  (admin panel /admin/)")
        self.stdout.write(f"demo login:     {DEMO_USER[0]} / {DEMO_USER[1]}")
