from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import validate_slug

from audit.services import Actor
from runs import services
from runs.models import Tenant


class Command(BaseCommand):
    help = "Create a tenant."

    def add_arguments(self, parser):
        parser.add_argument("slug", help="short identifier, e.g. acme")
        parser.add_argument(
            "--name", default="", help="display name (default: the slug)"
        )

    def handle(self, *args, slug: str, name: str, **options):
        try:
            validate_slug(slug)
        except ValidationError:
            raise CommandError(
                f"{slug!r} is not a slug: use letters, digits, - and _"
            ) from None
        if Tenant.objects.filter(slug=slug).exists():
            raise CommandError(f"tenant {slug!r} already exists")
        tenant = services.tenant_create(
            slug=slug, name=name, actor=Actor.system("manage.py")
        )
        self.stdout.write(f"created tenant {tenant.slug} ({tenant.name})")
