"""The job's connection details from its DATABASE_URL: one host, or a Patroni cluster's hosts
(docs/decisions/0042), where Spark reads a standby and psycopg the primary."""

from spark_jobs.session import Database


def test_one_host_is_read_as_before() -> None:
    db = Database.from_url("postgresql://txhub:s%40cret@127.0.0.1:54329/txhub")
    assert db.jdbc_url == "jdbc:postgresql://127.0.0.1:54329/txhub"
    assert (db.user, db.password) == ("txhub", "s@cret")
    assert db.conninfo == "postgresql://txhub:s%40cret@127.0.0.1:54329/txhub"


def test_a_cluster_is_read_from_a_standby_and_written_on_the_primary() -> None:
    url = "postgresql://txhub@127.0.0.1:54331,127.0.0.1:54332/txhub?target_session_attrs=read-write"
    db = Database.from_url(url)
    assert db.jdbc_url == (
        "jdbc:postgresql://127.0.0.1:54331,127.0.0.1:54332/txhub?targetServerType=preferSecondary"
    )
    assert db.user == "txhub"
    assert db.conninfo == url  # psycopg: libpq finds the primary
