"""Query expressions the trail's bulk readers (sealing, exports) share."""

from django.db import connection
from django.db.models import CharField, Expression, F, Func, TextField
from django.db.models.functions import Cast


class UTCText(Func):
    """A timestamp as ISO 8601 text in UTC with microseconds, printed by
    Postgres: `2026-03-02T09:00:01.000000Z`.

    Django parses timestamps with a pure-Python loader; for the hundreds of
    thousands of rows a seal or an export reads, the database is faster.
    """

    output_field = CharField()
    template = (
        "to_char(%(expressions)s AT TIME ZONE 'UTC', "
        '\'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\')'
    )


def timestamp_text(field: str) -> Expression:
    """UTCText on Postgres; elsewhere the datetime itself, formatted in Python."""
    return UTCText(field) if connection.vendor == "postgresql" else F(field)


def json_text(field: str) -> Expression:
    """A JSON column as its text, so that nothing decodes it only to encode it."""
    return Cast(field, output_field=TextField())
