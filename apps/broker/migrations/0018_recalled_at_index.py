"""The retention sweep deletes recalled messages by their recall time (docs/decisions/0080)."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0017_recalled_message_id_stays_held"),
    ]

    operations = [
        migrations.AlterField(
            model_name="recalledmessage",
            name="recalled_at",
            field=models.DateTimeField(db_index=True, default=django.utils.timezone.now),
        ),
    ]
