"""GET /api/v1/audit/events, /threads/{id} and /verify: filters, local days,
pagination, errors, access and tenancy."""

import datetime

import pytest

from audit import events
from audit.sealing import seal_all
from audit.services import Actor, record, thread_tombstone_record
from tests.audit.helpers import add_events
from tests.factories import api_client, make_member, make_tenant, tenant_with_client

pytestmark = pytest.mark.django_db
UTC = datetime.UTC
EVENTS = "/api/v1/audit/events"


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).astimezone(UTC)


def all_pages(client, params: dict) -> list[dict]:
    rows, url = [], EVENTS
    response = client.get(url, {**params, "limit": 500})
    while True:
        assert response.status_code == 200, response.content
        body = response.json()
        rows += body["results"]
        if not body["next"]:
            return rows
        response = client.get(body["next"])


def assert_error(response, status: int, code: str, field: str | None = None):
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == code and body["message"]
    if field:
        assert field in body["fields"], body
    return body


def timed_events(tenant, instants: list[str]) -> dict[str, int]:
    """One event per instant, appended in order; {instant: seq}."""
    result = {}
    for instant in instants:
        when = at(instant)
        (seq,) = add_events(tenant, 1, at=lambda _seq, when=when: when)
        result[instant] = seq
    return result


@pytest.mark.parametrize(
    ("day", "zone", "inside", "outside"),
    [
        # Europe/Paris springs forward on 2026-03-29: a 23-hour day,
        # 2026-03-28T23:00Z to 2026-03-29T22:00Z.
        (
            "2026-03-29",
            "Europe/Paris",
            [
                "2026-03-28T23:00:00+00:00",  # local midnight
                "2026-03-29T00:59:59+00:00",  # 01:59:59 CET
                "2026-03-29T01:00:00+00:00",  # 03:00:00 CEST, an hour later
                "2026-03-29T21:59:59.999999+00:00",  # 23:59:59.999999 CEST
            ],
            ["2026-03-28T22:59:59.999999+00:00", "2026-03-29T22:00:00+00:00"],
        ),
        # And falls back on 2026-10-25: a 25-hour day,
        # 2026-10-24T22:00Z to 2026-10-25T23:00Z.
        (
            "2026-10-25",
            "Europe/Paris",
            [
                "2026-10-24T22:00:00+00:00",
                "2026-10-25T00:30:00+00:00",  # 02:30 CEST
                "2026-10-25T01:30:00+00:00",  # 02:30 CET, the same clock time
                "2026-10-25T22:59:59+00:00",  # 23:59:59 CET
            ],
            ["2026-10-24T21:59:59+00:00", "2026-10-25T23:00:00+00:00"],
        ),
        # New York springs forward on 2026-03-08 at 02:00.
        (
            "2026-03-08",
            "America/New_York",
            ["2026-03-08T05:00:00+00:00", "2026-03-09T03:59:59+00:00"],
            ["2026-03-08T04:59:59+00:00", "2026-03-09T04:00:00+00:00"],
        ),
    ],
)
def test_day_query_with_time_zone_returns_exactly_that_local_day(
    day, zone, inside, outside
):
    tenant, client = tenant_with_client(scopes=["audit"])
    seqs = timed_events(tenant, sorted(inside + outside, key=at))
    rows = all_pages(client, {"date": day, "tz": zone})
    assert [row["seq"] for row in rows] == sorted(seqs[text] for text in inside)
    assert {at(row["occurred_at"]) for row in rows} == {at(text) for text in inside}


def test_day_without_tz_is_the_utc_day():
    tenant, client = tenant_with_client(scopes=["audit"])
    seqs = timed_events(
        tenant,
        [
            "2026-03-28T23:59:59+00:00",
            "2026-03-29T00:00:00+00:00",
            "2026-03-30T00:00:00+00:00",
        ],
    )
    rows = all_pages(client, {"date": "2026-03-29"})
    assert [row["seq"] for row in rows] == [seqs["2026-03-29T00:00:00+00:00"]]


def test_since_is_inclusive_and_until_exclusive():
    tenant, client = tenant_with_client(scopes=["audit"])
    seqs = timed_events(
        tenant,
        [
            "2026-01-01T10:00:00+00:00",
            "2026-01-01T11:00:00+00:00",
            "2026-01-01T12:00:00+00:00",
        ],
    )
    rows = all_pages(
        client, {"since": "2026-01-01T10:00:00Z", "until": "2026-01-01T12:00:00Z"}
    )
    assert [row["seq"] for row in rows] == [
        seqs["2026-01-01T10:00:00+00:00"],
        seqs["2026-01-01T11:00:00+00:00"],
    ]


def test_events_have_the_documented_shape():
    tenant, client = tenant_with_client(scopes=["audit"])
    record(
        tenant=tenant,
        kind=events.TENANT_CREATED,
        actor=Actor.system("ops"),
        thread_id="case-1",
        run_id="r-1",
        action="refund_order",
        data={"slug": "acme"},
    )
    row = client.get(EVENTS, {"thread_id": "case-1"}).json()["results"][0]
    assert set(row) == {
        "seq", "occurred_at", "kind", "actor", "thread_id", "run_id", "action",
        "summary", "data",
    }  # fmt: skip
    assert row["actor"] == {
        "type": "system", "id": "", "label": "ops", "on_behalf_of": ""
    }  # fmt: skip
    assert row["summary"] == "tenant acme created"
    assert row["occurred_at"].endswith("Z")
    assert (row["kind"], row["run_id"], row["action"]) == (
        "tenant.created", "r-1", "refund_order"
    )  # fmt: skip


def test_filters_by_thread_kind_action_and_actor():
    tenant, client = tenant_with_client(scopes=["audit"])
    agent, system = Actor.agent("refund"), Actor.system("ops")
    record(tenant=tenant, kind=events.TENANT_CREATED, actor=agent,
           thread_id="t-1", action="refund_order", data={"slug": "a"})  # fmt: skip
    record(tenant=tenant, kind=events.THREAD_DELETED, actor=system,
           thread_id="t-1", data={"requested_by": "crm"})  # fmt: skip
    record(tenant=tenant, kind=events.TENANT_CREATED, actor=agent,
           thread_id="t-2", action="notify", data={"slug": "b"})  # fmt: skip

    def seqs(**params):
        return [row["seq"] for row in all_pages(client, params)]

    # Seqs 1 and 2 are the tenant's and its API key's creation.
    assert seqs(thread_id="t-1") == [3, 4]
    assert seqs(kind="thread.deleted") == [4]
    assert seqs(action="notify") == [5]
    assert seqs(actor="agent") == [3, 5]
    assert seqs(actor="agent:refund", thread_id="t-2") == [5]
    assert seqs(actor="system:") == [1, 2, 4]  # the system actor has no id
    assert seqs(actor="agent:other") == []


def test_pages_are_oldest_first_in_a_stable_order_without_gaps():
    tenant, client = tenant_with_client(scopes=["audit"])
    add_events(tenant, 120)
    seen, url, params = [], EVENTS, {"limit": 50}
    while url:
        body = client.get(url, params).json()
        assert len(body["results"]) <= 50
        seen += [row["seq"] for row in body["results"]]
        url, params = body["next"], None
        if len(seen) == 50:  # events recorded meanwhile extend the end only
            add_events(tenant, 5)
    assert seen == list(range(1, 128))  # 2 setup events + 120 + 5


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"date": "2026-02-30"}, "date"),
        ({"date": "last tuesday"}, "date"),
        ({"date": "2026-03-29", "tz": "Mars/Olympus_Mons"}, "tz"),
        ({"date": "2026-03-29", "tz": "../../../etc/passwd"}, "tz"),
        ({"date": "2026-03-29", "tz": "\x00"}, "tz"),
        ({"tz": "Europe/Paris"}, "tz"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-13-01T00:00:00Z"}, "until"),
        ({"since": "2026-03-02T00:00:00Z", "until": "2026-03-01T00:00:00Z"}, "until"),
        ({"actor": "robot"}, "actor"),
        # A reason that quotes the client's text is not a format string.
        ({"date": "2026-03-29", "tz": "%"}, "tz"),
        ({"actor": "%s%(x)s"}, "actor"),
        ({"kind": "k" * 100}, "kind"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"format": "xml"}, "format"),
        ({"format": "csv", "date": "2026-02-30"}, "date"),
        # Issue 16, finding 3: the next day's midnight does not exist.
        ({"date": "9999-12-31", "tz": "Pacific/Kiritimati"}, "date"),
        ({"date": "0001-01-01", "tz": "Etc/GMT+12"}, "date"),
        ({"since": "0001-01-01T00:00:00+14:00"}, "since"),
        ({"until": "9999-12-31T23:59:59-12:00"}, "until"),
    ],
)
def test_bad_filter_values_are_400_naming_the_field(params, field):
    _, client = tenant_with_client(scopes=["audit"])
    assert_error(client.get(EVENTS, params), 400, "invalid", field)


def test_a_day_that_does_not_exist_is_named_as_such():
    _, client = tenant_with_client(scopes=["audit"])
    body = assert_error(client.get(EVENTS, {"date": "2026-02-30"}), 400, "invalid")
    assert body["fields"]["date"] == [
        "2026-02-30 does not exist: February 2026 has 28 days"
    ]


def test_errors_stay_json_when_an_export_was_asked_for():
    _, client = tenant_with_client(scopes=["audit"])
    assert_error(
        client.get(EVENTS, {"date": "x"}, HTTP_ACCEPT="text/csv"), 400, "invalid"
    )
    assert_error(api_client().get(EVENTS, {"format": "csv"}), 401, "not_authenticated")


def test_the_audit_scope_is_required():
    _, runs_only = tenant_with_client(scopes=["runs", "approvals"])
    assert_error(runs_only.get(EVENTS), 403, "permission_denied")
    assert_error(runs_only.get("/api/v1/audit/verify"), 403, "permission_denied")


@pytest.mark.parametrize(
    ("role", "status"),
    [
        ("auditor", 200),
        ("compliance_officer", 200),
        ("tenant_admin", 200),
        ("reviewer", 403),
    ],
)
def test_roles_with_audit_read_may_query(role, status):
    membership = make_member(make_tenant(), role=role)
    client = api_client()
    client.force_login(membership.user)
    assert client.get(EVENTS).status_code == status
    assert client.get("/api/v1/audit/verify").status_code == status


def test_another_tenants_events_are_never_visible():
    tenant_a, client_a = tenant_with_client(scopes=["audit"])
    tenant_b, client_b = tenant_with_client(scopes=["audit"])
    record(tenant=tenant_a, kind=events.TENANT_CREATED, actor=Actor.system(),
           thread_id="secret-case", data={"slug": "a"})  # fmt: skip
    seal_all()
    assert all_pages(client_b, {"thread_id": "secret-case"}) == []
    assert [row["kind"] for row in all_pages(client_b, {})] == [
        "tenant.created",
        "api_key.created",
    ]
    assert_error(client_b.get("/api/v1/audit/threads/secret-case"), 404, "not_found")
    export = b"".join(client_b.get(EVENTS, {"format": "jsonl"}).streaming_content)
    assert b"secret-case" not in export and export.count(b"\n") == 2
    assert client_b.get("/api/v1/audit/verify").json()["events"] == 2
    assert client_a.get("/api/v1/audit/threads/secret-case").status_code == 200


def test_a_session_user_sees_only_the_tenant_of_their_membership():
    tenant_a, _ = tenant_with_client(scopes=["audit"])
    record(tenant=tenant_a, kind=events.TENANT_CREATED, actor=Actor.system(),
           thread_id="secret-case", data={"slug": "a"})  # fmt: skip
    auditor = make_member(make_tenant(), role="auditor")
    client = api_client()
    client.force_login(auditor.user)
    rows = all_pages(client, {})
    assert all(row["thread_id"] != "secret-case" for row in rows)
    other = client.get(EVENTS, HTTP_X_GATEHOUSE_TENANT=tenant_a.slug)
    assert_error(other, 403, "permission_denied")


# --- Timelines --------------------------------------------------------------


def test_thread_timeline_reads_like_a_story():
    tenant, client = tenant_with_client(scopes=["audit"])
    key_actor = Actor(type="api_key", id="7", label="key gh_crm (crm)")
    agent = Actor.agent("refund")
    record(tenant=tenant, kind=events.TENANT_CREATED, actor=key_actor,
           thread_id="case-42", data={"slug": "started"})  # fmt: skip
    for _ in range(3):  # repeats fold into one entry
        record(tenant=tenant, kind=events.TENANT_CREATED, actor=agent,
               thread_id="case-42", data={"slug": "working"})  # fmt: skip
    thread_tombstone_record(
        tenant=tenant,
        thread_id="case-42",
        actor=Actor.system("retention"),
        requested_by=key_actor,
        deletion_request_id=5,
        removed={"checkpoints": 12, "runs": 2},
    )
    response = client.get("/api/v1/audit/threads/case-42", {"tz": "Europe/Paris"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["thread_id"] == "case-42"
    assert body["events"] == 5 and body["deleted"] is True
    texts = [entry["text"] for entry in body["entries"]]
    assert texts == [
        "tenant started created, by key gh_crm (crm)",
        "tenant working created",
        "thread case-42 deleted on request of key gh_crm (crm); its content was "
        "destroyed",
    ]
    assert body["entries"][1]["count"] == 3
    assert body["entries"][1]["last_seq"] == body["entries"][1]["seq"] + 2
    assert len(body["story"]) == 3 and body["story"][1].endswith("(x3)")


def test_timeline_folds_a_started_call_into_how_it_ended(monkeypatch):
    tenant, client = tenant_with_client(scopes=["audit"])
    started = events.EventKind("test_call.started", "{action} called")
    ended = events.EventKind("test_call.succeeded", "{action} succeeded")
    quiet = events.EventKind("test_call.read", "state read", timeline=False)
    for kind in (started, ended, quiet):
        monkeypatch.setitem(events.REGISTRY, kind.name, kind)
    agent = Actor.agent("refund")
    for kind, action in (
        (started, "refund_order"),
        (ended, "refund_order"),
        (quiet, ""),
        (started, "notify"),
        (ended, "lookup"),  # another action: not the end of "notify"
    ):
        record(tenant=tenant, kind=kind, actor=agent, thread_id="t", action=action)
    body = client.get("/api/v1/audit/threads/t").json()
    assert [entry["text"] for entry in body["entries"]] == [
        "refund_order succeeded",
        "notify called",
        "lookup succeeded",
    ]
    assert body["hidden"] == 1
    assert (body["entries"][0]["seq"], body["entries"][0]["last_seq"]) == (3, 4)


def test_timeline_is_404_only_for_a_thread_without_events():
    tenant, client = tenant_with_client(scopes=["audit"])
    assert_error(client.get("/api/v1/audit/threads/never-seen"), 404, "not_found")
    record(tenant=tenant, kind=events.TENANT_CREATED, actor=Actor.system(),
           thread_id="seen", data={"slug": "x"})  # fmt: skip
    assert client.get("/api/v1/audit/threads/seen").status_code == 200
    response = client.get("/api/v1/audit/threads/seen", {"tz": "Nowhere/Land"})
    assert_error(response, 400, "invalid", "tz")


def test_tombstone_keeps_what_when_and_who_without_content():
    tenant, client = tenant_with_client(scopes=["audit"])
    requested_at = datetime.datetime(2026, 3, 3, 10, 0, tzinfo=UTC)
    thread_tombstone_record(
        tenant=tenant,
        thread_id="case-7",
        actor=Actor.system("retention"),
        requested_by=Actor(type="user", id="3", label="rita"),
        deletion_request_id=41,
        requested_at=requested_at,
        removed={"checkpoints": 12},
    )
    row = all_pages(client, {"kind": "thread.deleted"})[0]
    assert row["thread_id"] == "case-7"
    assert row["data"] == {
        "requested_by": "rita",
        "requested_by_type": "user",
        "requested_by_id": "3",
        "deletion_request": "41",
        "requested_at": requested_at.isoformat(),
        "removed_checkpoints": 12,
    }


# --- Verification -------------------------------------------------------------


def test_verify_endpoint_reports_the_chain():
    tenant, client = tenant_with_client(scopes=["audit"])
    add_events(tenant, 30)
    seal_all()
    add_events(tenant, 4)
    body = client.get("/api/v1/audit/verify").json()
    assert body["ok"] is True and body["first_bad_seq"] is None
    assert body["blocks"] == 1 and body["events"] == 36 and body["unsealed"] == 4
    assert len(body["head_hash"]) == 64
