"""On Postgres, the events and blocks tables refuse UPDATE and DELETE.

The one exception is the audit retention purge (audit.services.purge_before),
which sets the transaction-local `gatehouse.audit_purge` to 'on' first. The
trigger stops accidents and application bugs; the hash chain is what detects
someone with the rights to drop the trigger or set the flag. TRUNCATE is not
a row operation and is not refused (the test suite flushes tables with it);
run the application with a database role that does not own the tables to
take that away too.
"""

from django.db import migrations

TABLES = ("audit_auditevent", "audit_auditblock")

CREATE_FUNCTION = """
CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger AS $$
BEGIN
    IF current_setting('gatehouse.audit_purge', true) = 'on' THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the audit trail is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Only the audit retention purge may remove audit rows.';
END;
$$ LANGUAGE plpgsql;
"""

CREATE_TRIGGER = """
CREATE TRIGGER {table}_append_only
BEFORE UPDATE OR DELETE ON {table}
FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
"""


def install(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    # params=None: the function body has % placeholders of its own.
    schema_editor.execute(CREATE_FUNCTION, params=None)
    for table in TABLES:
        schema_editor.execute(CREATE_TRIGGER.format(table=table), params=None)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
    schema_editor.execute("DROP FUNCTION IF EXISTS audit_refuse_change()")


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_blocks_and_verification")]

    operations = [migrations.RunPython(install, uninstall)]
