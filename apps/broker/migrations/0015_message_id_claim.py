"""One message id, one message: the tables that store a message under its id (each unique on its
own) are asked through one function, and a client-chosen id is claimed under a lock before it is
stored (services/client_ids.py, docs/decisions/0040)."""

from django.db import migrations

HELD = """
CREATE OR REPLACE FUNCTION broker_msg_id_held(varchar) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT EXISTS (SELECT 1 FROM broker_commitlogentry c WHERE c.msg_id = $1)
        OR EXISTS (SELECT 1 FROM broker_delayedmessage d WHERE d.msg_id = $1)
        OR EXISTS (SELECT 1 FROM broker_halfmessage h WHERE h.msg_id = $1)
$$;
"""

# VOLATILE: each query in it takes a fresh snapshot (READ COMMITTED), so the check after the lock
# sees a message another transaction stored and committed while this one waited for the lock; in
# the calling statement's own snapshot (taken before the wait) it would be missing.
CLAIM = """
CREATE OR REPLACE FUNCTION broker_msg_ids_claim(VARIADIC ids varchar[]) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    key int;
    one varchar;
BEGIN
    -- Locks in key order: two claims of overlapping ids queue up instead of deadlocking.
    FOR key IN SELECT DISTINCT hashtext(x) FROM unnest(ids) AS x ORDER BY 1 LOOP
        -- The namespace of message ids, 0x74786964 ("txid"): the two-int form cannot meet the
        -- one-bigint locks elsewhere (reconciliation.NIGHTLY_CLAIM_LOCK).
        PERFORM pg_advisory_xact_lock(1954048356, key);
    END LOOP;
    FOREACH one IN ARRAY ids LOOP
        IF broker_msg_id_held(one) THEN
            RAISE unique_violation USING MESSAGE = format('message id %s is held', one);
        END IF;
    END LOOP;
    RETURN true;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0014_claim_caps_each_group_first"),
    ]

    operations = [
        migrations.RunSQL(HELD, "DROP FUNCTION broker_msg_id_held(varchar)"),
        migrations.RunSQL(CLAIM, "DROP FUNCTION broker_msg_ids_claim(varchar[])"),
    ]
