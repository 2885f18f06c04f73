from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle


class PrincipalRateThrottle(SimpleRateThrottle):
    """A request budget per API key (or per logged-in user, or per address)."""

    scope = "principal"

    def get_rate(self) -> str | None:
        # Read per request rather than once at import: the rate is a setting.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request, view) -> str:
        if request.auth is not None and hasattr(request.auth, "prefix"):
            ident = f"key:{request.auth.prefix}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"addr:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
