from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from runs import services
from runs.api import key_cache
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
        services.api_key_revoke(api_key=api_key, actor=Actor.system("manage.py"))
        state = "was already revoked" if already else "revoked"
        self.stdout.write(f"API key {prefix} ({api_key.tenant.slug}) {state}")
        if not settings.GATEHOUSE_EMBEDDED and not key_cache.enabled():
            # Web processes with Redis as their cache keep verified keys until
            # the access epoch in Redis changes, which only a process with
            # that cache can change: this one cannot tell them.
            self.stderr.write(
                "Warning: this process's CACHE_URL is not Redis. Web processes "
                "that keep verified keys (CACHE_URL=rediscache://...) accept "
                f"this key for up to {key_cache.MAX_AGE_SECONDS} s more. Run "
                "this command with the web processes' CACHE_URL "
                "(docs/configuration.md)."
            )
