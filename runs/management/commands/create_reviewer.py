import getpass
import secrets
import sys

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from runs import services
from runs.management.commands._helpers import tenant_by_slug
from runs.models import Role


class Command(BaseCommand):
    help = (
        "Create a staff user with a role in a tenant (or change their role). "
        "Prompts for a password, or generates and prints one with --generate-password "
        "or when there is no terminal."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--username", required=True)
        parser.add_argument("--role", default=Role.REVIEWER, choices=Role.values)
        parser.add_argument("--generate-password", action="store_true")

    def handle(self, *args, tenant, username, role, generate_password, **options):
        tenant_obj = tenant_by_slug(tenant)
        generated = generate_password or not sys.stdin.isatty()
        if generated:
            password = secrets.token_urlsafe(12)
        else:
            password = getpass.getpass(f"Password for {username}: ")
            if password != getpass.getpass("Again: "):
                raise CommandError("the passwords differ")
            try:
                validate_password(password)
            except ValidationError as exc:
                raise CommandError(" ".join(exc.messages)) from None
        services.reviewer_create(
            tenant=tenant_obj,
            username=username,
            password=password,
            role=role,
            actor=Actor.system("manage.py"),
        )
        self.stdout.write(f"{username} is {role} in {tenant_obj.slug}")
        if generated:
            self.stdout.write(f"password: {password}")
