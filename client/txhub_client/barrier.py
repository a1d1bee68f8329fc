"""A transaction barrier in the spirit of DTM's: the producer records the transaction in its own
database inside its local transaction, so a check-back answers from that record, and a check that
finds nothing leaves a rollback marker that makes a late local commit fail instead of diverging.

Works with any DB-API 2 connection (tested with psycopg on Postgres and sqlite3)."""

import sys
from typing import Any

TABLE = "txhub_barrier"


class BarrierRolledBack(Exception):
    """Check-back already answered ROLLBACK for this transaction: the local transaction must not
    commit (roll it back)."""


class Barrier:
    def __init__(self, table: str = TABLE, paramstyle: str | None = None) -> None:
        if not table.replace("_", "").isalnum():
            raise ValueError("table must be a plain identifier")
        self.table = table
        self.paramstyle = paramstyle

    def _sql(self, connection: Any, template: str) -> str:
        # The table name is checked to be a plain identifier in __init__; values are bound.
        sql = template.format(table=self.table)
        style = self.paramstyle or getattr(
            sys.modules[type(connection).__module__.split(".")[0]], "paramstyle", "format"
        )
        return sql.replace("%s", "?") if style == "qmark" else sql

    INSERT = (
        "INSERT INTO {table} (transaction_id, outcome) VALUES (%s, '{outcome}') "
        "ON CONFLICT (transaction_id) DO NOTHING"
    )

    def create_table(self, connection: Any) -> None:
        cursor = connection.cursor()
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} (transaction_id VARCHAR(64) PRIMARY KEY, "
            "outcome VARCHAR(8) NOT NULL, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP)"
        )
        connection.commit()

    def record_commit(self, connection: Any, transaction_id: str) -> None:
        """Call inside the local transaction, before it commits. Raises BarrierRolledBack if
        check-back already decided ROLLBACK (roll the local transaction back then)."""
        cursor = connection.cursor()
        cursor.execute(
            self._sql(connection, self.INSERT.replace("{outcome}", "COMMIT")),
            (transaction_id,),
        )
        if cursor.rowcount == 0:
            raise BarrierRolledBack(transaction_id)

    def check(self, connection: Any, transaction_id: str) -> str:
        """For check_local_transaction: 'COMMIT' or 'ROLLBACK', never unknown. A transaction with
        no record gets a rollback marker (committed here), so its late local commit will fail;
        one whose local transaction is still running makes this wait for it (row lock)."""
        cursor = connection.cursor()
        cursor.execute(
            self._sql(connection, self.INSERT.replace("{outcome}", "ROLLBACK")),
            (transaction_id,),
        )
        cursor.execute(
            self._sql(connection, "SELECT outcome FROM {table} WHERE transaction_id = %s"),
            (transaction_id,),
        )
        outcome = str(cursor.fetchone()[0])
        connection.commit()
        return outcome
