"""The Spark session and the Postgres connection details the job needs (no Django here: the job
runs under spark-submit, on one machine or a cluster)."""

import os
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pyspark.sql import SparkSession

# Debian's libpostgresql-jdbc-java; `make test` / `make run` install it.
JDBC_JAR = os.environ.get("TXHUB_JDBC_JAR", "/usr/share/java/postgresql.jar")


@dataclass(frozen=True)
class Database:
    jdbc_url: str
    user: str
    password: str
    conninfo: str  # for psycopg: the driver's own point queries and the load

    @classmethod
    def from_url(cls, url: str) -> "Database":
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 5432
        name = parts.path.lstrip("/")
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        return cls(
            jdbc_url=f"jdbc:postgresql://{host}:{port}/{name}",
            user=user,
            password=password,
            conninfo=url.replace("postgresql+psycopg://", "postgresql://", 1),
        )


def build_session(
    master: str,
    *,
    shuffle_partitions: int = 8,
    driver_memory: str = os.environ.get("TXHUB_SPARK_DRIVER_MEMORY", "2g"),
) -> SparkSession:
    """One session per job; tests share one (getOrCreate returns it)."""
    session = (
        SparkSession.builder.master(master)
        .appName("txhub-reconcile")
        .config("spark.jars", JDBC_JAR)
        .config("spark.driver.memory", driver_memory)  # only before the JVM starts
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    return session
