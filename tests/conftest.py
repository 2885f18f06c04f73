import pytest


@pytest.fixture(autouse=True)
def _fresh_throttle_cache():
    """Throttle counters live in the cache; one test's requests must not
    throttle the next's."""
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture(scope="session")
def worker(django_db_setup):
    """A real Celery worker process (prefork, two children), shared by the
    session's execution tests; they must use transactional databases."""
    from tests.workers import Worker, purge_broker

    purge_broker()
    process = Worker(name="main")
    yield process
    process.stop()
