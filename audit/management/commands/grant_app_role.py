"""Give the application's database role what it needs, and no more (Postgres).

Run as the owner role (the one that runs `migrate`), after every `migrate`:
new tables need their grants. The application role then reads and writes
every table, but on the audit trail's tables (events, blocks, verifications)
it may only read and insert; it removes audit rows only through
`audit_purge_through()`, the retention purge (migration audit/0008). It owns
nothing, so it can neither drop nor disable the append-only triggers, nor
TRUNCATE. docs/security.md describes the two roles.
"""

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from audit.models import AuditBlock, AuditEvent, AuditVerification

APPEND_ONLY_MODELS = (AuditEvent, AuditBlock, AuditVerification)


class Command(BaseCommand):
    help = (
        "Grant a Postgres role the privileges the application needs (read and "
        "insert only on the audit tables). Run as the owner after each migrate."
    )

    def add_arguments(self, parser):
        parser.add_argument("role", help="the application's role (it must exist)")

    def handle(self, *args, role: str, **options):
        if connection.vendor != "postgresql":
            raise CommandError("grant_app_role is for Postgres; SQLite has no roles.")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_schema(), current_user, "
                "EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s)",
                [role],
            )
            schema, owner, exists = cursor.fetchone()
        if not exists:
            raise CommandError(f"There is no role {role!r}: create it first.")
        if role == owner:
            raise CommandError(
                f"{role!r} is the role running this command (the owner); the "
                "application must connect as another role."
            )
        quote = connection.ops.quote_name
        grantee, schema = quote(role), quote(schema)
        append_only = ", ".join(
            quote(model._meta.db_table) for model in APPEND_ONLY_MODELS
        )
        statements = [
            f"GRANT USAGE ON SCHEMA {schema} TO {grantee}",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} "
            f"TO {grantee}",
            f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {grantee}",
            f"REVOKE UPDATE, DELETE, TRUNCATE ON {append_only} FROM {grantee}",
            # Migrations are the owner's business.
            f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON django_migrations "
            f"FROM {grantee}",
            f"GRANT EXECUTE ON FUNCTION audit_purge_through(bigint, bigint) "
            f"TO {grantee}",
        ]
        with transaction.atomic(), connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
        self.stdout.write(
            f"{role}: read and write on every table; read and insert only on "
            f"{append_only.replace(chr(34), '')}; the audit purge through "
            "audit_purge_through()."
        )
