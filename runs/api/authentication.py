"""Bearer API keys: `Authorization: Bearer gh_xxxxxxxxx.<secret>`."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.throttling import SimpleRateThrottle

from runs.api import key_cache
from runs.models import ApiKey

# last_used_at is a hint for operators, not an access log; writing it on every
# request would make every read a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiKeyUser:
    """The request.user of a key-authenticated request: a program, not a person."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(self, api_key: ApiKey) -> None:
        self.api_key = api_key
        self.pk = None

    def __str__(self) -> str:
        return f"API key {self.api_key.prefix}"

    def get_username(self) -> str:
        return str(self)


class AuthenticationFailures(SimpleRateThrottle):
    """Failed API authentications per client address.

    Past GATEHOUSE_AUTH_FAILURE_RATE, the address is answered 429 (with
    Retry-After) before any key it sends is even looked up, so that guessing
    secrets costs a window per few tries. Counted in the cache: with several
    web processes, set CACHE_URL to Redis so that they share the count.
    """

    scope = "auth_failures"

    def get_rate(self) -> str:
        return settings.GATEHOUSE_AUTH_FAILURE_RATE

    def get_cache_key(self, request, view=None) -> str:
        return self.cache_format % {
            "scope": self.scope,
            "ident": self.get_ident(request),
        }

    def wait_before_trying(self, request) -> tuple[float | None, str | None]:
        """Seconds the address must wait (None when it may try), and the access
        epoch of `runs.api.key_cache`, read in the same round trip."""
        self.key = self.get_cache_key(request)
        self.now = self.timer()
        values, epoch = key_cache.read([self.key])
        self.history = [
            at for at in values.get(self.key, []) if at > self.now - self.duration
        ]
        wait = self.wait() if len(self.history) >= self.num_requests else None
        return wait, epoch

    def record_failure(self) -> None:
        self.history.insert(0, self.now)
        self.cache.set(self.key, self.history, self.duration)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(
            "latin-1", errors="replace"
        )
        if not header:
            return None
        keyword, _, secret = header.partition(" ")
        if keyword.lower() != self.keyword.lower():
            return None
        return self.authenticate_secret(request, secret.strip())

    def authenticate_secret(self, request, secret: str):
        """The key whose secret this is; the same 401 for any bad one, and a
        429 for an address that failed too often."""
        failures = AuthenticationFailures()
        wait, epoch = failures.wait_before_trying(request)
        if wait is not None:
            raise exceptions.Throttled(
                wait, detail="Too many failed authentications from this address."
            )
        prefix, dot, _ = secret.partition(".")
        if not dot or not prefix:
            failures.record_failure()
            raise exceptions.AuthenticationFailed("Malformed API key.")
        api_key = key_cache.find(prefix, ApiKey.hash_secret(secret), epoch)
        if api_key is None:
            api_key = self._verified(prefix, secret)
            if api_key is None:
                failures.record_failure()
                raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
            key_cache.keep(api_key, epoch)
        now = timezone.now()
        if (
            api_key.last_used_at is None
            or now - api_key.last_used_at > LAST_USED_RESOLUTION
        ):
            ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
            key_cache.touched(api_key.prefix, now)
        return ApiKeyUser(api_key), api_key

    @staticmethod
    def _verified(prefix: str, secret: str) -> ApiKey | None:
        """The key from the database, if this is its secret and it may act.

        None alike for unknown, wrong and revoked keys: a caller learns nothing
        about which prefixes exist.
        """
        api_key = ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()
        if (
            api_key is None
            or not api_key.matches(secret)
            or not api_key.is_active
            # A personal key lives only as long as its owner's membership.
            or (api_key.is_personal and api_key.owner_membership is None)
        ):
            return None
        return api_key

    def authenticate_header(self, request) -> str:
        return self.keyword
