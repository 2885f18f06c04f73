from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from runs import services
from runs.models import ApiKey


class Command(BaseCommand):
    help = "Revoke an API key by its prefix (the part before the dot)."

    def add_arguments(self, parser):
        parser.add_argument("prefix")

    def handle(self, *args, prefix: str, **options):
        prefix = prefix.split(".", 1)[0]
        try:
            api_key = ApiKey.objects.select_related("tenant").get(prefix=prefix)
        except ApiKey.DoesNotExist:
            raise CommandError(f"no API key with prefix {prefix!r}") from None
        already = api_key.revoked_at is not None
        # Refused (runs.api.key_cache.AccessChangeUnannounced, a CommandError)
        # where web processes keep the key in a cache this one cannot reach.
        services.api_key_revoke(api_key=api_key, actor=Actor.system("manage.py"))
        state = "was already revoked" if already else "revoked"
        self.stdout.write(f"API key {prefix} ({api_key.tenant.slug}) {state}")
