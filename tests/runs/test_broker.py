"""The broker's Redis channel publishes with the client it keeps (runs.broker)."""

from celery import current_app

from runs.broker import Channel


def test_a_channel_publishes_with_one_client_on_its_pool():
    with current_app.connection_for_write() as connection:
        channel = connection.default_channel
        assert isinstance(channel, Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
            assert first.connection_pool is channel.pool
            assert first.ping()
        given = object()
        with channel.conn_or_acquire(given) as client:
            assert client is given
