"""Moving the test database to a migration and back, for data migration tests."""

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate_to(targets):
    """Migrate to `targets` ([(app, name)]); the apps as they are there."""
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def migrate_to_latest():
    return migrate_to(MigrationExecutor(connection).loader.graph.leaf_nodes())
