"""Admin login throttling (issue 16, finding 7): wrong passwords lock a
username out from an address; the lockout and its lifting by a compliance
officer of the user's tenant are audited."""

import pytest
from axes.models import AccessAttempt
from django.test import Client

from audit.models import AuditEvent
from tests.factories import make_member, make_tenant

pytestmark = pytest.mark.django_db
LOGIN = "/admin/login/"
PASSWORD = "correct horse battery staple"


def attempt(username: str, password: str, address: str = "203.0.113.7"):
    return Client(REMOTE_ADDR=address).post(
        LOGIN, {"username": username, "password": password, "next": "/admin/"}
    )


@pytest.fixture
def locked_reviewer(settings):
    settings.AXES_FAILURE_LIMIT = 5
    tenant = make_tenant()
    reviewer = make_member(tenant, role="reviewer", password=PASSWORD).user
    for _ in range(5):
        attempt(reviewer.username, "wrong")
    return tenant, reviewer


def test_wrong_passwords_lock_the_username_out_and_are_audited(locked_reviewer):
    tenant, reviewer = locked_reviewer
    assert attempt(reviewer.username, PASSWORD).status_code == 429
    # Another address is not locked out: the lock is per username and address.
    assert attempt(reviewer.username, PASSWORD, "198.51.100.2").status_code == 302
    (event,) = AuditEvent.objects.for_tenant(tenant).filter(kind="login.locked_out")
    assert event.data == {
        "username": reviewer.username,
        "ip_address": "203.0.113.7",
        "failures": 5,
    }


def test_a_compliance_officer_lifts_the_lockout_and_it_is_audited(locked_reviewer):
    tenant, reviewer = locked_reviewer
    officer = make_member(tenant, role="compliance_officer").user
    desk = Client()
    desk.force_login(officer)
    listing = desk.get("/admin/axes/accessattempt/").content.decode()
    assert reviewer.username in listing
    lockout = AccessAttempt.objects.get(username=reviewer.username)
    desk.post(
        "/admin/axes/accessattempt/",
        {"action": "lift", "_selected_action": [lockout.pk]},
    )
    assert attempt(reviewer.username, PASSWORD).status_code == 302
    (event,) = AuditEvent.objects.for_tenant(tenant).filter(kind="login.unlocked")
    assert event.actor_label == officer.username
    assert event.summary == (
        f"admin login lockout of {reviewer.username} lifted by {officer.username}"
    )


def test_only_compliance_officers_of_the_users_tenant_see_lockouts(locked_reviewer):
    tenant, reviewer = locked_reviewer
    other_officer = make_member(make_tenant(), role="compliance_officer").user
    peer = make_member(tenant, role="reviewer").user
    for user, status in ((other_officer, 200), (peer, 403)):
        client = Client()
        client.force_login(user)
        response = client.get("/admin/axes/accessattempt/")
        assert response.status_code == status
        assert reviewer.username not in response.content.decode()
