"""Deleting a consumer group leaves an audit record (docs/decisions/0088): a new action."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0019_storage_usage"),
    ]

    operations = [
        migrations.AlterField(
            model_name="auditrecord",
            name="action",
            field=models.CharField(
                choices=[
                    ("token_create", "Token Create"),
                    ("token_revoke", "Token Revoke"),
                    ("check_url_change", "Check URL change"),
                    ("secret_rotate", "Secret Rotate"),
                    ("topic_bindings_change", "Topic Bindings Change"),
                    ("dlq_resend", "DLQ resend"),
                    ("consumer_group_delete", "Consumer Group Delete"),
                ],
                max_length=32,
            ),
        ),
    ]
