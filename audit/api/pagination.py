"""Keyset pagination of audit events by (occurred_at, seq).

DRF's CursorPagination positions on a single field and counts an offset for
ties; here the position is the last event's (occurred_at, seq), and the next
page is the rows after it in that order: `(occurred_at, seq) > (t, s)`, a row
comparison an index range scan serves. A page costs the same at the end of a
year as at its start, and events recorded meanwhile only extend the end.
"""

from __future__ import annotations

import base64
import binascii
import datetime

from django.db.models import BooleanField, DateTimeField, F, Func, Value
from rest_framework import exceptions
from rest_framework.pagination import BasePagination, _positive_int
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.utils.urls import replace_query_param

from audit.selectors import EVENT_ORDER


class RowAfter(Func):
    """`(a, b) > (c, d)` in SQL (Postgres, and SQLite since 3.15)."""

    arity = 4
    conditional = True
    output_field = BooleanField()

    def as_sql(self, compiler, connection, **extra_context):
        parts, params = [], []
        for expression in self.get_source_expressions():
            sql, expression_params = compiler.compile(expression)
            parts.append(sql)
            params.extend(expression_params)
        return f"(({parts[0]}, {parts[1]}) > ({parts[2]}, {parts[3]}))", params


class AuditEventPagination(BasePagination):
    cursor_query_param = "cursor"
    page_size_query_param = "limit"
    max_page_size = 500

    def __init__(self) -> None:
        self.page_size = api_settings.PAGE_SIZE
        self.request = None
        self.next_position: tuple[datetime.datetime, int] | None = None

    def get_page_size(self, request) -> int:
        try:
            return _positive_int(
                request.query_params[self.page_size_query_param],
                strict=True,
                cutoff=self.max_page_size,
            )
        except (KeyError, ValueError):
            return api_settings.PAGE_SIZE

    def decode_cursor(self, request) -> tuple[datetime.datetime, int] | None:
        encoded = request.query_params.get(self.cursor_query_param)
        if encoded is None:
            return None
        try:
            text = base64.urlsafe_b64decode(encoded.encode("ascii")).decode()
            when, seq = text.split("|")
            position = datetime.datetime.fromisoformat(when), int(seq)
            if position[0].tzinfo is None:
                raise ValueError("naive")
            return position
        except (binascii.Error, UnicodeError, ValueError):
            raise exceptions.ValidationError(
                {"cursor": ["is not a cursor this API handed out."]}
            ) from None

    @staticmethod
    def encode_cursor(position: tuple[datetime.datetime, int]) -> str:
        when, seq = position
        text = f"{when.isoformat()}|{seq}"
        return base64.urlsafe_b64encode(text.encode()).decode("ascii")

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        self.page_size = self.get_page_size(request)
        position = self.decode_cursor(request)
        if position is not None:
            when, seq = position
            queryset = queryset.filter(
                RowAfter(
                    F(EVENT_ORDER[0]),
                    F(EVENT_ORDER[1]),
                    Value(when, output_field=DateTimeField()),
                    Value(seq),
                )
            )
        rows = list(queryset.order_by(*EVENT_ORDER)[: self.page_size + 1])
        page = rows[: self.page_size]
        if len(rows) > self.page_size:
            self.next_position = (page[-1].occurred_at, page[-1].seq)
        return page

    def get_next_link(self) -> str | None:
        if self.next_position is None:
            return None
        url = self.request.build_absolute_uri()
        return replace_query_param(
            url, self.cursor_query_param, self.encode_cursor(self.next_position)
        )

    def get_paginated_response(self, data) -> Response:
        return Response({"results": data, "next": self.get_next_link()})

    def get_paginated_response_schema(self, schema: dict) -> dict:
        return {
            "type": "object",
            "required": ["results", "next"],
            "properties": {
                "results": schema,
                "next": {"type": "string", "nullable": True, "format": "uri"},
            },
        }

    def get_schema_operation_parameters(self, view) -> list[dict]:
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "The `next` link's cursor, to read the next page.",
                "schema": {"type": "string"},
            },
            {
                "name": self.page_size_query_param,
                "required": False,
                "in": "query",
                "description": f"Events per page, up to {self.max_page_size}.",
                "schema": {"type": "integer"},
            },
        ]
