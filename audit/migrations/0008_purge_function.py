"""On Postgres: the audit purge becomes a function only the owner role can run
behind, and the verification table becomes append-only too.

Before, the append-only triggers let rows change whenever the transaction-local
`gatehouse.audit_purge` was 'on', and any role can set a custom setting. Now:

- `audit_purge_through(tenant, through_seq)` is a SECURITY DEFINER function
  owned by the role that runs migrations (the owner of the audit tables). It
  deletes one tenant's events and blocks up to the end of a sealed block, and
  nothing else (no UPDATE, no partial block).
- The trigger lets a DELETE through only inside that function: the setting
  must be 'on' (the function's own SET clause turns it on for its duration)
  *and* the current user must be the table's owner, which a non-owner
  application role is only while it runs the function. UPDATE is always
  refused.
- `audit_auditverification` gets the same trigger, with no exception.

`manage.py grant_app_role` gives the application role what it needs (EXECUTE
on the function, SELECT and INSERT on the audit tables); docs/security.md has
the roles.
"""

from django.db import migrations


REFUSE_CHANGE = """
CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND TG_TABLE_NAME IN ('audit_auditevent', 'audit_auditblock')
       AND current_setting('gatehouse.audit_purge', true) = 'on'
       AND current_user = (SELECT pg_get_userbyid(relowner) FROM pg_class
                           WHERE oid = TG_RELID) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit trail is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Only the audit retention purge may remove audit rows.';
END;
$$ LANGUAGE plpgsql;
"""

# The old trigger function, for reversing this migration.
OLD_REFUSE_CHANGE = """
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

# search_path is pinned (a SECURITY DEFINER function must not resolve names
# through a schema the caller controls); {schema} is the migrating schema.
PURGE_FUNCTION = """
CREATE OR REPLACE FUNCTION audit_purge_through(
    p_tenant_id bigint, p_through_seq bigint, OUT events bigint, OUT blocks bigint
) LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {schema}, pg_temp
SET gatehouse.audit_purge = 'on'
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM audit_auditblock
                   WHERE tenant_id = p_tenant_id AND last_seq = p_through_seq) THEN
        RAISE EXCEPTION 'audit purge: no sealed block of tenant % ends at #%',
            p_tenant_id, p_through_seq USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM audit_auditevent
        WHERE tenant_id = p_tenant_id AND seq <= p_through_seq;
    GET DIAGNOSTICS events = ROW_COUNT;
    DELETE FROM audit_auditblock
        WHERE tenant_id = p_tenant_id AND last_seq <= p_through_seq;
    GET DIAGNOSTICS blocks = ROW_COUNT;
END;
$$;
REVOKE ALL ON FUNCTION audit_purge_through(bigint, bigint) FROM PUBLIC;
"""

TRIGGER = """
CREATE TRIGGER {table}_append_only
BEFORE UPDATE OR DELETE ON {table}
FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
"""


def install(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        (schema,) = cursor.fetchone()
    # params=None: the function bodies have % placeholders of their own.
    schema_editor.execute(REFUSE_CHANGE, params=None)
    schema_editor.execute(
        PURGE_FUNCTION.format(schema=connection.ops.quote_name(schema)), params=None
    )
    schema_editor.execute(TRIGGER.format(table="audit_auditverification"), params=None)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "DROP TRIGGER IF EXISTS audit_auditverification_append_only "
        "ON audit_auditverification"
    )
    schema_editor.execute("DROP FUNCTION IF EXISTS audit_purge_through(bigint, bigint)")
    schema_editor.execute(OLD_REFUSE_CHANGE, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0007_keyed_seals")]

    operations = [migrations.RunPython(install, uninstall)]
