"""Times as the admin writes them: in the reader's zone, to the second, with
the zone's name.

The reader's browser names its zone in the `gatehouse_tz` cookie
(runs/static/runs/timezone.js, loaded by the admin's base template); the
middleware makes it the current zone of each request, so Django's templates
and `moment_text` write times in it. Without the cookie (the first page, a
command-line client) times are in UTC. The format is the formats module's
DATETIME_FORMAT (config/formats), the one definition.
"""

from __future__ import annotations

import datetime
import functools
import re
import zoneinfo

from django.utils import formats, timezone

COOKIE = "gatehouse_tz"
ADMIN_PATH = "/admin/"
# IANA names: "Europe/Paris", "America/Argentina/Buenos_Aires", "Etc/GMT+5".
_ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+){0,2}")  # fullmatch


@functools.lru_cache(maxsize=256)
def reader_zone(name: str) -> zoneinfo.ZoneInfo | None:
    """The zone a cookie names, or None for anything that is not one."""
    if len(name) > 64 or not _ZONE_NAME.fullmatch(name):
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return None


class ReaderTimezoneMiddleware:
    """The reader's zone for the admin's pages only: the API's timestamps stay
    in UTC whoever calls it (docs/api.md), a browser session included."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        zone = None
        if request.path.startswith(ADMIN_PATH):
            zone = reader_zone(request.COOKIES.get(COOKIE, ""))
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


def moment_text(moment: datetime.datetime | None) -> str:
    """`2026-11-30 19:02:11 CET`: a time in the current zone, as the admin's
    templates write one; "" for None."""
    if moment is None:
        return ""
    return formats.date_format(timezone.localtime(moment), "DATETIME_FORMAT")
