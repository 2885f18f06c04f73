"""The Redis log of run stream events: a reader blocks as long as it asks."""

import asyncio
import uuid

from django.conf import settings

from runs.streaming import START, RedisLog


def test_a_blocked_read_outlasts_redis_pys_default_read_timeout():
    """XREAD BLOCK for longer than redis-py's 5 s default socket timeout ends
    empty, not in a TimeoutError (runs.join on a run that takes its time)."""
    log = RedisLog(settings.CELERY_BROKER_URL)

    async def read():
        return await log.read(f"missing-{uuid.uuid4()}", START, 6.0)

    assert asyncio.run(read()) == []
