"""What the web tier keeps in a shared cache (Redis): verified API keys, revoked
at once in every process, and the request budget, counted in the round trip
that checks the key is still valid."""

import io
import uuid

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEvent
from audit.services import Actor
from runs import epochs, services
from runs.api import key_cache
from runs.models import ApiKey, KeyCacheStore, Membership
from tests.factories import (
    api_client,
    make_api_key,
    make_member,
    make_tenant,
    tenant_with_client,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def redis_cache(settings):
    """The suite's Redis as the cache, under a prefix of this test's own."""
    settings.CACHES = {
        "default": {
            "BACKEND": "runs.cache.RedisCache",
            "LOCATION": django_settings.CELERY_BROKER_URL,
            "KEY_PREFIX": f"test-{uuid.uuid4().hex}",
        }
    }
    key_cache.new_epoch()
    yield
    key_cache.new_epoch()


def _key_queries(queries) -> list[str]:
    return [q["sql"] for q in queries if '"runs_apikey"' in q["sql"].split("WHERE")[0]]


def test_throttle_counts_in_redis(redis_cache, settings):
    _budget(settings, "3/minute")
    _, client = tenant_with_client()
    statuses = [client.get("/api/v1/agents").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    refused = client.get("/api/v1/agents")
    assert refused.json()["code"] == "throttled"
    assert 0 < int(refused["Retry-After"]) <= 60
    _, other = tenant_with_client()
    assert other.get("/api/v1/agents").status_code == 200


def _budget(settings, rate: str) -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"principal": rate},
    }


def test_a_request_with_a_kept_key_is_one_round_trip_to_redis(redis_cache, monkeypatch):
    """The address's failed authentications, the access epoch and the key's
    budget: one script, one command."""
    from django.core.cache import caches

    _, client = tenant_with_client()
    assert client.get("/api/v1/agents").status_code == 200
    redis_client = caches["default"]._cache.get_client(write=True)
    commands = []
    execute = redis_client.execute_command

    def counted(*args, **options):
        commands.append(args[0])
        return execute(*args, **options)

    monkeypatch.setattr(redis_client, "execute_command", counted)
    assert client.get("/api/v1/agents").status_code == 200
    assert commands == ["EVALSHA"]


def test_a_wrong_secret_never_counts_against_the_keys_budget(redis_cache, settings):
    """Someone who knows a key's prefix (it is not secret) but not its secret,
    or holds it revoked, cannot use up its owner's budget."""
    _budget(settings, "3/minute")
    settings.GATEHOUSE_AUTH_FAILURE_RATE = "100/minute"
    tenant = make_tenant()
    api_key, secret = make_api_key(tenant)
    owner = api_client(secret)
    assert owner.get("/api/v1/agents").status_code == 200  # now kept
    guesser = api_client(f"{api_key.prefix}.{'x' * 40}")
    for _ in range(5):
        assert guesser.get("/api/v1/agents").status_code == 401
    assert [owner.get("/api/v1/agents").status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]
    # Revoked in another process (the row changed, the epoch replaced, this
    # process's kept key untouched): its holder is refused without counting.
    other_key, other_secret = make_api_key(tenant)
    holder = api_client(other_secret)
    assert holder.get("/api/v1/agents").status_code == 200
    ApiKey.objects.filter(pk=other_key.pk).update(revoked_at="2026-01-01T00:00Z")
    from django.core.cache import cache, caches

    cache.set(key_cache.EPOCH_KEY, epochs.fresh())
    for _ in range(5):
        assert holder.get("/api/v1/agents").status_code == 401
    backend = caches["default"]
    window = backend.make_and_validate_key(f"throttle_principal_key:{other_key.prefix}")
    assert backend._cache.get_client(write=True).zcard(window) == 1


def test_failed_authentications_are_counted_in_redis(redis_cache, settings):
    settings.GATEHOUSE_AUTH_FAILURE_RATE = "3/minute"
    tenant = make_tenant()
    _, secret = make_api_key(tenant)
    guesser = api_client("gh_XXXXXXXXX.wrong")
    statuses = [
        guesser.get("/api/v1/agents", REMOTE_ADDR="203.0.113.9").status_code
        for _ in range(4)
    ]
    assert statuses == [401, 401, 401, 429]
    right = api_client(secret)
    refused = right.get("/api/v1/agents", REMOTE_ADDR="203.0.113.9")
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 60
    assert right.get("/api/v1/agents", REMOTE_ADDR="198.51.100.9").status_code == 200


def test_the_epoch_lost_from_redis_is_started_again(redis_cache):
    """A flushed or restarted Redis: a new epoch, under which no process has
    kept anything, so the key is read again."""
    from django.core.cache import cache

    _, client = tenant_with_client()
    assert client.get("/api/v1/agents").status_code == 200
    cache.delete(key_cache.EPOCH_KEY)
    with CaptureQueriesContext(connection) as again:
        assert client.get("/api/v1/agents").status_code == 200
    assert len(_key_queries(again.captured_queries)) >= 1
    assert cache.get(key_cache.EPOCH_KEY) is not None


def test_a_verified_key_is_not_read_again(redis_cache):
    _, client = tenant_with_client()
    with CaptureQueriesContext(connection) as first:
        assert client.get("/api/v1/agents").status_code == 200
    with CaptureQueriesContext(connection) as second:
        assert client.get("/api/v1/agents").status_code == 200
    assert len(_key_queries(first.captured_queries)) >= 1
    assert _key_queries(second.captured_queries) == []


def test_a_wrong_secret_for_a_kept_key_is_refused(redis_cache):
    tenant = make_tenant()
    api_key, secret = make_api_key(tenant)
    assert api_client(secret).get("/api/v1/agents").status_code == 200
    wrong = api_client(f"{api_key.prefix}.{'x' * 40}")
    assert wrong.get("/api/v1/agents").status_code == 401


def test_revocation_is_immediate(redis_cache):
    tenant = make_tenant()
    api_key, secret = make_api_key(tenant)
    client = api_client(secret)
    assert client.get("/api/v1/agents").status_code == 200
    services.api_key_revoke(api_key=api_key, actor=Actor.system("tests"))
    assert client.get("/api/v1/agents").status_code == 401


def test_another_process_changing_access_is_seen_at_the_next_request(redis_cache):
    """What another process does: change the row, then replace the epoch in
    Redis (its signal handler). This process's kept key is not used again."""
    tenant = make_tenant()
    api_key, secret = make_api_key(tenant)
    client = api_client(secret)
    assert client.get("/api/v1/agents").status_code == 200
    # No signal here: this process's own kept keys stay as they were.
    ApiKey.objects.filter(pk=api_key.pk).update(revoked_at="2026-01-01T00:00Z")
    assert client.get("/api/v1/agents").status_code == 200
    from django.core.cache import cache

    cache.set(key_cache.EPOCH_KEY, uuid.uuid4().hex)
    assert client.get("/api/v1/agents").status_code == 401


def test_a_personal_key_goes_with_its_owners_membership(redis_cache):
    membership = make_member(make_tenant(), role="reviewer")
    _, secret = make_api_key(
        membership.tenant, scopes=["approvals"], user=membership.user
    )
    client = api_client(secret)
    assert client.get("/api/v1/approvals").status_code == 200
    Membership.objects.get(pk=membership.pk).delete()
    assert client.get("/api/v1/approvals").status_code == 401


def test_the_cache_reuses_one_redis_client(redis_cache):
    from django.core.cache import cache, caches

    client = caches["default"]._cache
    assert client.get_client("a") is client.get_client("b", write=True)
    cache.set("reused", {"n": 1})
    assert cache.get("reused") == {"n": 1}


def test_settings_put_the_reusing_backend_in_place_of_djangos():
    from tests.deployment.processes import production_env, settings_in_process

    env = {**production_env(), "CACHE_URL": "rediscache://127.0.0.1:6379/8"}
    caches = settings_in_process(env, "CACHES")["CACHES"]
    assert caches["default"]["BACKEND"] == "runs.cache.RedisCache"


def test_one_redis_connection_serves_every_request_of_a_web_process(transactional_db):
    """Under ASGI each request has a `caches` of its own: the cache's pool is
    the process's, so sequential requests reuse one connection to Redis rather
    than opening one each (what every request did: a pool per instance)."""
    import httpx
    import redis

    from tests.servers import LiveServer

    name = f"gh-test-{uuid.uuid4().hex[:12]}"
    location = django_settings.CELERY_BROKER_URL.replace("redis://", "rediscache://")
    server = LiveServer(
        workers=1, env={"CACHE_URL": f"{location}?client_name={name}"}, name=name
    )
    admin = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    try:
        tenant = make_tenant()
        _, secret = make_api_key(tenant)
        seen: set[int] = set()
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {secret}"}
        ) as http:
            for _ in range(12):
                assert http.get("/api/v1/agents").status_code == 200
                seen |= {c["id"] for c in admin.client_list() if c["name"] == name}
        # The key was read and its budget counted through Redis, by a
        # connection that stayed open from the first request to the last.
        assert len(seen) == 1, seen
    finally:
        admin.close()
        server.stop()


def _os_env(**variables: str) -> dict[str, str]:
    """A shell as the suite's processes have it (the test database and
    broker), without CACHE_URL unless given."""
    import os

    from tests.workers import suite_database_url

    env = {k: v for k, v in os.environ.items() if k != "CACHE_URL"}
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": suite_database_url(),
        "CELERY_BROKER_URL": django_settings.CELERY_BROKER_URL,
        **variables,
    }


def test_a_revocation_that_cannot_reach_the_web_processes_is_refused(
    transactional_db,
):
    """Review finding MED 1, with real processes: a web process (gunicorn,
    Redis as its cache) keeps a key; `manage.py revoke_api_key` in a shell
    without its CACHE_URL (locmem) could not replace the epoch it reads, and
    refuses, changing nothing (another Redis: the test of every path); with the web's
    CACHE_URL the key is refused by the web at its next request."""
    import httpx

    from tests.deployment.processes import manage
    from tests.servers import LiveServer

    location = django_settings.CELERY_BROKER_URL.replace("redis://", "rediscache://")
    webs = location
    server = LiveServer(workers=1, env={"CACHE_URL": webs}, name="h5-keep")
    try:
        tenant = make_tenant()
        api_key, secret = make_api_key(tenant)
        member = make_member(tenant, role="reviewer")
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {secret}"}
        ) as http:
            assert http.get("/api/v1/agents").status_code == 200
            assert http.get("/api/v1/agents").status_code == 200  # kept
            assert KeyCacheStore.objects.count() == 1
            refused = manage("revoke_api_key", api_key.prefix, env=_os_env())
            assert refused.returncode == 1, refused.stderr
            assert "Refused, nothing changed" in refused.stderr
            assert "Traceback" not in refused.stderr
            assert ApiKey.objects.get(pk=api_key.pk).revoked_at is None
            assert not AuditEvent.objects.filter(
                kind="api_key.revoked", data__prefix=api_key.prefix
            ).exists()
            assert http.get("/api/v1/agents").status_code == 200
            # Any command that takes access away: a reviewer made an auditor.
            demoted = manage(
                "create_reviewer",
                f"--tenant={tenant.slug}",
                f"--username={member.user.username}",
                "--role=auditor",
                "--generate-password",
                env=_os_env(),
            )
            assert demoted.returncode == 1, demoted.stderr
            assert "Refused, nothing changed" in demoted.stderr
            assert "Traceback" not in demoted.stderr
            assert Membership.objects.get(pk=member.pk).role == "reviewer"
            done = manage("revoke_api_key", api_key.prefix, env=_os_env(CACHE_URL=webs))
            assert done.returncode == 0, done.stderr
            assert http.get("/api/v1/agents").status_code == 401
    finally:
        server.stop()


def test_without_web_processes_keeping_keys_a_revocation_needs_no_redis(settings):
    """The per-process cache (the embedded mode's, and production's with one
    web process): no key is kept, nothing registered, a revocation anywhere
    is seen at the next request."""
    # Whatever CACHE_URL the shell running the suite exports.
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": f"test-{uuid.uuid4().hex}",
        }
    }
    settings.GATEHOUSE_EMBEDDED = False
    api_key, secret = make_api_key(make_tenant())
    client = api_client(secret)
    assert client.get("/api/v1/agents").status_code == 200
    assert not KeyCacheStore.objects.exists()
    out, err = io.StringIO(), io.StringIO()
    call_command("revoke_api_key", api_key.prefix, stdout=out, stderr=err)
    assert err.getvalue() == ""
    assert ApiKey.objects.get(pk=api_key.pk).revoked_at is not None
    assert client.get("/api/v1/agents").status_code == 401


def test_a_web_process_keeping_keys_registers_its_cache_once(redis_cache):
    _, client = tenant_with_client()
    with CaptureQueriesContext(connection) as first:
        assert client.get("/api/v1/agents").status_code == 200
    with CaptureQueriesContext(connection) as second:
        assert client.get("/api/v1/agents").status_code == 200
    [store] = KeyCacheStore.objects.all()
    from django.core.cache import cache

    assert store.store == cache.get(key_cache.STORE_KEY)
    registered = [q for q in first.captured_queries if "runs_keycachestore" in q["sql"]]
    assert len(registered) == 1
    assert not [q for q in second.captured_queries if "runs_keycachestore" in q["sql"]]
    assert _key_queries(second.captured_queries) == []


def test_a_change_the_web_processes_would_not_see_is_refused_on_every_path(
    redis_cache, settings
):
    """Web processes keep keys in a cache that is not this process's (another
    Redis, registered): REST answers 503 and every other path raises, before
    anything is written, the audit event with it."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from tests.approvals.helpers import logged_in

    settings.GATEHOUSE_EMBEDDED = False
    tenant, client = tenant_with_client()
    assert client.get("/api/v1/agents").status_code == 200
    member = make_member(tenant, role="reviewer")
    target, _ = make_api_key(tenant, scopes=["approvals"], user=member.user)
    session = logged_in(member.user)
    KeyCacheStore.objects.create(store="another-redis", seen_at=timezone.now())
    events = AuditEvent.objects.count()
    url = f"/admin/runs/apikey/personal/{target.pk}/revoke/"
    answer = session.post(url)
    assert answer.status_code == 503, answer.content
    assert "Refused, nothing changed" in answer.content.decode()
    assert ApiKey.objects.get(pk=target.pk).revoked_at is None
    assert AuditEvent.objects.count() == events
    with pytest.raises(key_cache.AccessChangeUnannounced):
        services.api_key_revoke(api_key=target, actor=Actor.system("tests"))
    with pytest.raises(key_cache.AccessChangeUnannounced):
        services.membership_remove(membership=member, actor=Actor.system("tests"))
    assert Membership.objects.filter(pk=member.pk).exists()
    user = get_user_model().objects.get(pk=member.user_id)
    user.is_active = False
    with pytest.raises(key_cache.AccessChangeUnannounced):
        user.save()
    # A grant takes nothing away: allowed.
    make_api_key(tenant)
    # A registration older than any key kept under it: no longer in the way.
    KeyCacheStore.objects.filter(store="another-redis").update(
        seen_at=timezone.now() - timezone.timedelta(seconds=key_cache.LIVE_SECONDS + 1)
    )
    assert session.post(url).status_code == 302
    assert ApiKey.objects.get(pk=target.pk).revoked_at is not None


def test_a_registration_does_not_wait_out_a_change_of_access_in_progress(
    redis_cache,
):
    """A web process registering while a change reads the registrations
    (holding their lock to its commit) gives up after REGISTER_LOCK_TIMEOUT:
    the key is read and not kept, the request not held for the whole change
    (nor, once it gave up, the next change queued behind it)."""
    import psycopg

    from tests.workers import suite_database_url

    with psycopg.connect(suite_database_url(), autocommit=False) as other:
        other.execute("LOCK TABLE runs_keycachestore IN SHARE MODE")
        assert key_cache.register() is False
        other.rollback()
    assert key_cache.register()


def test_a_cache_that_lost_its_token_gets_it_back_and_access_changes_go_on(
    redis_cache, settings
):
    """A Redis restarted empty (here: its keys deleted) loses the token the
    web processes registered: the first of them to look puts it back, so the
    registration in the database names the cache again and a revocation made
    there is not refused for LIVE_SECONDS."""
    from django.core.cache import cache

    settings.GATEHOUSE_EMBEDDED = False
    tenant, client = tenant_with_client()
    assert client.get("/api/v1/agents").status_code == 200
    [registered] = KeyCacheStore.objects.values_list("store", flat=True)
    target, secret = make_api_key(tenant)
    assert api_client(secret).get("/api/v1/agents").status_code == 200
    cache.delete_many([key_cache.STORE_KEY, key_cache.EPOCH_KEY])

    services.api_key_revoke(api_key=target, actor=Actor.system("tests"))

    assert ApiKey.objects.get(pk=target.pk).revoked_at is not None
    assert cache.get(key_cache.STORE_KEY) == registered
    assert list(KeyCacheStore.objects.values_list("store", flat=True)) == [registered]
    assert api_client(secret).get("/api/v1/agents").status_code == 401


def test_after_a_flush_a_new_process_registering_first_refuses_nothing_for_long(
    redis_cache, settings, monkeypatch
):
    """The cache restarted empty and a process that never registered (a new
    web worker) gave it a new token first: a process that had the old one
    counts both as its cache's, and its next registration removes the old
    one, after which no change of access is refused."""
    from django.core.cache import cache

    settings.GATEHOUSE_EMBEDDED = False
    tenant, client = tenant_with_client()
    assert client.get("/api/v1/agents").status_code == 200
    old = key_cache._store
    target, _ = make_api_key(tenant)
    cache.delete_many([key_cache.STORE_KEY, key_cache.EPOCH_KEY])
    # A new process: nothing registered, nothing held.
    monkeypatch.setattr(key_cache, "_store", None)
    monkeypatch.setattr(key_cache, "_held", set())
    monkeypatch.setattr(key_cache, "_registered_at", None)
    assert key_cache.register()
    new = key_cache._store
    assert new != old
    assert set(KeyCacheStore.objects.values_list("store", flat=True)) == {old, new}
    # ...which cannot yet tell the old registration from another Redis's.
    with pytest.raises(key_cache.AccessChangeUnannounced):
        services.api_key_revoke(api_key=target, actor=Actor.system("tests"))
    # The process that registered the old token: both are its cache's.
    monkeypatch.setattr(key_cache, "_store", old)
    monkeypatch.setattr(key_cache, "_held", {old})
    monkeypatch.setattr(key_cache, "_registered_at", None)
    member = make_member(tenant, role="reviewer")
    services.membership_remove(membership=member, actor=Actor.system("tests"))
    # Its next registration removes the old one: nobody is refused.
    assert key_cache.register()
    assert list(KeyCacheStore.objects.values_list("store", flat=True)) == [new]
    monkeypatch.setattr(key_cache, "_held", {new})
    services.api_key_revoke(api_key=target, actor=Actor.system("tests"))
    assert ApiKey.objects.get(pk=target.pk).revoked_at is not None
