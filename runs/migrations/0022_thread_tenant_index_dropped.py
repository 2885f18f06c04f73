"""The thread's tenant foreign key loses its own index: `thread_tenant_thread_id`
and `thread_tenant_status` both start with the tenant, and serve every lookup
by tenant alone, so the third index only cost each thread row an entry."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0021_compact_checkpoint_run_ids"),
    ]

    operations = [
        migrations.AlterField(
            model_name="thread",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="threads",
                to="runs.tenant",
            ),
        ),
    ]
