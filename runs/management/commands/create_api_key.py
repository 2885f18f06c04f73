from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from runs import services
from runs.management.commands._helpers import tenant_by_slug


class Command(BaseCommand):
    help = "Create an API key; the secret is printed once, on the last line."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument(
            "--scopes",
            required=True,
            help="comma-separated: runs,approvals,audit,time_travel (time_travel: forks and runs from a checkpoint)",
        )
        parser.add_argument("--name", default="cli key")

    def handle(self, *args, tenant: str, scopes: str, name: str, **options):
        tenant_obj = tenant_by_slug(tenant)
        try:
            scope_list = services.parse_scopes(scopes)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        issued = services.api_key_create(
            tenant=tenant_obj,
            name=name,
            scopes=scope_list,
            actor=Actor.system("manage.py"),
        )
        self.stderr.write(
            f"API key {issued.api_key.prefix} for {tenant_obj.slug} with scopes "
            f"{','.join(scope_list)}. Store the secret now: it is not kept."
        )
        self.stdout.write(issued.secret)
