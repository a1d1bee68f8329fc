from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0021_storage_measure_seen_horizon"),
    ]

    operations = [
        migrations.AlterField(
            model_name="grpcclient",
            name="client_id",
            field=models.CharField(max_length=255),
        ),
        migrations.AddConstraint(
            model_name="grpcclient",
            constraint=models.UniqueConstraint(
                fields=("token", "client_id"), name="grpc_client_uq"
            ),
        ),
    ]
