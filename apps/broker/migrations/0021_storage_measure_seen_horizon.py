from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0020_consumer_group_delete_audited"),
    ]

    operations = [
        migrations.AddField(
            model_name="storagemeasure",
            name="seen_horizon",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="storagemeasure",
            name="pending_to",
            field=models.BigIntegerField(default=0),
        ),
    ]
