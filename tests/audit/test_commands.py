"""audit_report: one local day of a tenant, for a person to read."""

import datetime
import io

import pytest
from django.core.management import CommandError, call_command

from audit.services import Actor, thread_tombstone_record
from tests.audit.helpers import add_events, event_fields
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db
UTC = datetime.UTC


def report(*args) -> str:
    out = io.StringIO()
    call_command("audit_report", *args, stdout=out)
    return out.getvalue()


def test_report_covers_the_local_day_in_its_time_zone():
    tenant = make_tenant("acme")
    times = {
        2: datetime.datetime(2026, 3, 28, 22, 59, tzinfo=UTC),  # 23:59 in Paris, 28th
        3: datetime.datetime(2026, 3, 28, 23, 0, tzinfo=UTC),  # 00:00 on the 29th
        4: datetime.datetime(2026, 3, 29, 9, 30, tzinfo=UTC),  # 11:30 CEST
        5: datetime.datetime(2026, 3, 29, 22, 0, tzinfo=UTC),  # 00:00 on the 30th
    }
    add_events(tenant, 4, at=times.__getitem__)
    text = report("--tenant", "acme", "--date", "2026-03-29", "--tz", "Europe/Paris")
    assert "Sunday 29 March 2026 in Europe/Paris: 23 hours" in text
    assert "2 event(s), #3 to #4." in text
    assert "00:00:00  #3" in text and "11:30:00  #4" in text
    assert "#2 " not in text and "#5 " not in text
    assert event_fields(3)["summary"] in text
    assert "agent refund (agent)" in text


def test_report_names_deletions_and_what_people_did():
    tenant = make_tenant("acme")
    thread_tombstone_record(
        tenant=tenant,
        thread_id="case-9",
        actor=Actor(type="user", id="4", label="rita"),
        requested_by=Actor(type="user", id="4", label="rita"),
    )
    today = datetime.datetime.now(UTC).date().isoformat()
    text = report("--tenant", "acme", "--date", today)
    assert "Deletions" in text and "Done by people and API keys" in text
    assert "thread case-9 deleted on request of rita" in text


def test_a_quiet_day_says_so():
    make_tenant("acme")
    assert "Nothing was recorded" in report("--tenant", "acme", "--date", "2001-01-01")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "ghost", "--date", "2026-03-29"], "no tenant"),
        (["--tenant", "acme", "--date", "29/03/2026"], "YYYY-MM-DD"),
        (
            ["--tenant", "acme", "--date", "2026-02-30"],
            "2026-02-30 does not exist: February 2026 has 28 days",
        ),
        (["--tenant", "acme", "--date", "2026-13-01"], "there is no month 13"),
        (["--tenant", "acme", "--date", "2026-03-29", "--tz", "Paris"], "IANA"),
    ],
)
def test_bad_arguments_are_clear_errors(args, message):
    make_tenant("acme")
    with pytest.raises(CommandError, match=message):
        report(*args)
