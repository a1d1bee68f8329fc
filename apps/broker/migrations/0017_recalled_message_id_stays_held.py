"""A recalled message keeps its id: broker_msg_id_held looks in broker_recalledmessage too, so the
claim (broker_msg_ids_claim, migration 0015) refuses a client's id that a recalled message holds,
as it refuses one any other stored message holds (docs/decisions/0075).

Still PL/pgSQL, which keeps its plans (migration 0016), and still STABLE: the four lookups are one
RETURN expression, one query, read in one snapshot, the snapshot of the query that calls it (the
claim's check after its lock, a fresh one: the claim is VOLATILE). A recall moves the delayed row
to broker_recalledmessage in one transaction, so no snapshot sees the id in neither table."""

from django.db import migrations

HELD = """
CREATE OR REPLACE FUNCTION broker_msg_id_held(msg varchar) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM broker_commitlogentry c WHERE c.msg_id = msg)
        OR EXISTS (SELECT 1 FROM broker_delayedmessage d WHERE d.msg_id = msg)
        OR EXISTS (SELECT 1 FROM broker_halfmessage h WHERE h.msg_id = msg)
        OR EXISTS (SELECT 1 FROM broker_recalledmessage r WHERE r.msg_id = msg);
END
$$;
"""

# Migration 0016's body, as it was.
HELD_WITHOUT_RECALLED = """
CREATE OR REPLACE FUNCTION broker_msg_id_held(msg varchar) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM broker_commitlogentry c WHERE c.msg_id = msg)
        OR EXISTS (SELECT 1 FROM broker_delayedmessage d WHERE d.msg_id = msg)
        OR EXISTS (SELECT 1 FROM broker_halfmessage h WHERE h.msg_id = msg);
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0016_message_id_held_keeps_its_plans"),
    ]

    operations = [
        migrations.RunSQL(HELD, HELD_WITHOUT_RECALLED),
    ]
