import logging
from collections.abc import Iterator

import pytest
from django.db import connection
from pyspark.sql import SparkSession

from spark_jobs.session import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark session for the whole suite (starting one costs seconds)."""
    session = build_session("local[2]", shuffle_partitions=2)
    yield session
    session.stop()
    # py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
    # pytest closed its capture streams; keep it quiet.
    logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture
def unconstrained(transactional_db: None) -> Iterator[None]:
    """Anomalies 3 and 4 cannot be written while the constraints that prevent them exist; the
    job must still find them (a constraint dropped in a migration, a restore gone wrong)."""
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX one_final_op_per_transaction")
        cursor.execute(
            "ALTER TABLE broker_commitlogentry DROP CONSTRAINT "
            "broker_commitlogentry_transaction_id_key"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE broker_oprecord, broker_commitlogentry CASCADE")
        cursor.execute(
            "CREATE UNIQUE INDEX one_final_op_per_transaction ON broker_oprecord (half_id) "
            "WHERE op IN ('COMMIT', 'ROLLBACK')"
        )
        cursor.execute(
            "ALTER TABLE broker_commitlogentry ADD CONSTRAINT "
            "broker_commitlogentry_transaction_id_key UNIQUE (transaction_id)"
        )
