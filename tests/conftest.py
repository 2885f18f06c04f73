import pytest


@pytest.fixture(autouse=True)
def _fresh_throttle_cache():
    """Throttle counters live in the cache; one test's requests must not
    throttle the next's."""
    from django.core.cache import cache

    cache.clear()
    yield
