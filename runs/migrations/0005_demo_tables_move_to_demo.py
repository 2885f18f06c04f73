"""The demo agent's tables move to the `demo` app (demo/migrations/0001).

Their rows stay where they are: the tables are renamed to the demo app's
names, then the models leave this app's state; demo's first migration takes
them into its own state without touching the database.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0004_beat_recover_stalled_runs"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.AlterModelTable("DemoPayment", "demo_demopayment"),
                migrations.AlterModelTable(
                    "DemoOutboxMessage", "demo_demooutboxmessage"
                ),
            ],
            state_operations=[
                migrations.DeleteModel("DemoPayment"),
                migrations.DeleteModel("DemoOutboxMessage"),
            ],
        )
    ]
