"""Bearer API keys: `Authorization: Bearer gh_xxxxxxxxx.<secret>`."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

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
        secret = secret.strip()
        prefix, dot, _ = secret.partition(".")
        if not dot or not prefix:
            raise exceptions.AuthenticationFailed("Malformed API key.")
        api_key = ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()
        # The same message for unknown, wrong and revoked keys: a caller learns
        # nothing about which prefixes exist.
        if (
            api_key is None
            or not api_key.matches(secret)
            or not api_key.is_active
            # A personal key lives only as long as its owner's membership.
            or (api_key.is_personal and api_key.owner_membership is None)
        ):
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        now = timezone.now()
        if (
            api_key.last_used_at is None
            or now - api_key.last_used_at > LAST_USED_RESOLUTION
        ):
            ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        return ApiKeyUser(api_key), api_key

    def authenticate_header(self, request) -> str:
        return self.keyword
