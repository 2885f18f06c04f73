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

from audit.services import Actor
from runs import services
from runs.api import key_cache
from runs.models import ApiKey, Membership
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

    cache.set(key_cache.EPOCH_KEY, key_cache.fresh_epoch())
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


def test_revoking_from_a_process_without_redis_says_the_web_is_not_told(settings):
    """The default cache (locmem) in production: the command cannot replace
    the access epoch the web processes read, and says so."""
    settings.GATEHOUSE_EMBEDDED = False
    api_key, secret = make_api_key(make_tenant())
    err = io.StringIO()
    call_command("revoke_api_key", api_key.prefix, stdout=io.StringIO(), stderr=err)
    assert "CACHE_URL is not Redis" in err.getvalue()
    assert f"up to {key_cache.MAX_AGE_SECONDS} s" in err.getvalue()


def test_revoking_with_redis_as_the_cache_warns_of_nothing(redis_cache, settings):
    settings.GATEHOUSE_EMBEDDED = False
    api_key, _ = make_api_key(make_tenant())
    err = io.StringIO()
    call_command("revoke_api_key", api_key.prefix, stdout=io.StringIO(), stderr=err)
    assert err.getvalue() == ""
    assert ApiKey.objects.get(pk=api_key.pk).revoked_at is not None
