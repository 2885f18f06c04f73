"""API key names: unique per tenant and never empty.

Keys named before this rule may share a name or have none. Each tenant's keys
are taken oldest first: the first keeps its (trimmed) name, a later one with
the same name gets its prefix appended ("billing (gh_Ab3dE6gH9)"), and an
empty name becomes "key <prefix>". Prefixes are unique, so the new names are
too; a key is still recognised by its prefix, which the audit trail names.
"""

from django.db import migrations, models


def name_keys_apart(apps, schema_editor):
    ApiKey = apps.get_model("runs", "ApiKey")
    seen: set[tuple[int, str]] = set()
    for key in ApiKey.objects.order_by("tenant_id", "created_at", "pk").iterator():
        name = key.name.strip()
        if not name:
            name = f"key {key.prefix}"
        elif (key.tenant_id, name) in seen:
            name = f"{name[: 200 - len(key.prefix) - 3]} ({key.prefix})"
        seen.add((key.tenant_id, name))
        if name != key.name:
            ApiKey.objects.filter(pk=key.pk).update(name=name)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0012_thread_step_aliases"),
    ]

    operations = [
        migrations.RunPython(name_keys_apart, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.UniqueConstraint(
                fields=("tenant", "name"),
                name="api_key_name_unique_per_tenant",
                violation_error_message="This tenant already has a key of that name.",
            ),
        ),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.CheckConstraint(
                condition=~models.Q(name=""), name="api_key_name_not_empty"
            ),
        ),
    ]
