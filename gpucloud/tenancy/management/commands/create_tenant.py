"""Create a tenant owned by a user (created if missing). With --api-key, the LAST line is the key."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from gpucloud.tenancy.choices import Plan, Scope
from gpucloud.tenancy.selectors import membership_get
from gpucloud.tenancy.services import api_key_create, tenant_create

User = get_user_model()


class Command(BaseCommand):
    help = "Create a tenant with EMAIL as its owner; --api-key prints a new admin key as the last line."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="The tenant's display name")
        parser.add_argument("--email", required=True, help="The owner's email (user created if new)")
        parser.add_argument("--password", help="Password for a new user (default: cannot sign in)")
        parser.add_argument("--plan", choices=Plan.values, default=None)
        parser.add_argument("--api-key", action="store_true", help="Also create an admin-scoped API key")

    @transaction.atomic
    def handle(self, *args, name, email, password, plan, api_key, **options):
        email = User.objects.normalize_email(email).lower()
        if "@" not in email:
            raise CommandError(f"{email!r} is not an email address")
        user = User.objects.filter(email__iexact=email).first()
        if user is None:
            user = User(username=email, email=email)
            if password:
                user.set_password(password)
            else:
                user.set_unusable_password()
            user.save()
        elif password:
            raise CommandError(f"{email} exists already; --password only applies to new users")
        tenant = tenant_create(name=name, owner=user, plan=plan)
        self.stdout.write(f"tenant {tenant.slug} ({tenant.pk}) owned by {email}")
        if api_key:
            _, secret = api_key_create(
                membership=membership_get(user=user, tenant=tenant), name="created by create_tenant",
                scopes=[Scope.ADMIN],
            )
            self.stdout.write(secret)
