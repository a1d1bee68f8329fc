from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_jobs.session import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark session for the whole suite (starting one costs seconds)."""
    session = build_session("local[2]", shuffle_partitions=2)
    yield session
    session.stop()
