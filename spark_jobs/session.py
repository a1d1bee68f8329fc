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
        """A one-host URL, or libpq's multi-host form (postgresql://user@h1:p1,h2:p2/db?...,
        docs/decisions/0042): then Spark reads a standby (JDBC's targetServerType), so the
        primary does not pay for the extract, while psycopg (bounds, rechecks, the load) goes
        where the URL's target_session_attrs says, the primary."""
        parts = urlsplit(url)
        userinfo, _, hostlist = parts.netloc.rpartition("@")
        raw_user, _, raw_password = userinfo.partition(":")
        addresses = []
        for item in (hostlist or "127.0.0.1").split(","):
            host, colon, port = item.rpartition(":")
            has_port = bool(colon) and not item.endswith("]")
            addresses.append(f"{host if has_port else item}:{port if has_port else 5432}")
        name = parts.path.lstrip("/")
        standby = "?targetServerType=preferSecondary" if len(addresses) > 1 else ""
        return cls(
            jdbc_url=f"jdbc:postgresql://{','.join(addresses)}/{name}{standby}",
            user=unquote(raw_user),
            password=unquote(raw_password),
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
