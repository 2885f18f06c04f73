"""The demo tables, moved here from `runs` with their rows (runs 0005 renamed
them); nothing is created in the database. Their content types follow them,
so permissions granted on them stay attached."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

MODELS = ("demopayment", "demooutboxmessage")


def move_content_types(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        if not ContentType.objects.filter(app_label="demo", model=model).exists():
            ContentType.objects.filter(app_label="runs", model=model).update(
                app_label="demo"
            )


def restore_content_types(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        if not ContentType.objects.filter(app_label="runs", model=model).exists():
            ContentType.objects.filter(app_label="demo", model=model).update(
                app_label="runs"
            )


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("runs", "0005_demo_tables_move_to_demo"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="DemoPayment",
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('idempotency_key', models.CharField(max_length=64, unique=True)),
                        ('order_id', models.CharField(max_length=100)),
                        ('amount', models.DecimalField(decimal_places=2, max_digits=12)),
                        ('currency', models.CharField(default='EUR', max_length=3)),
                        ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='runs.tenant')),
                    ],
                ),
                migrations.CreateModel(
                    name="DemoOutboxMessage",
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('idempotency_key', models.CharField(max_length=64, unique=True)),
                        ('kind', models.CharField(max_length=32)),
                        ('body', models.BinaryField()),
                        ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='runs.tenant')),
                        ('thread', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='runs.thread')),
                    ],
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(move_content_types, restore_content_types),
    ]
