"""What the wake-up hub's fallback check asks Postgres (apps/broker/wakeups.py): every
TXHUB_LONG_POLL_FALLBACK seconds and after (re)connecting, once for all of a process's waiters,
it finds what no notification announced, or one missed while the hub did not listen."""

from apps.broker import access
from apps.broker.services import fifo

# Which (topic, group) pairs, among those given, have something receivable and how much: new
# offsets, FIFO messages held no longer, in-flight ones whose invisible time is over. The third
# column says whose: NULL, any waiter's; else a tag's, for a pair with a waiter that filters by
# tag (`tagged`): its expired deliveries are counted per tag (decision 0081). A deleted group's
# pairs wake every waiter, whose next try is told (a deletion's NOTIFY missed; decision 0088).
EVERY_WAITER = 2**31 - 1
RECEIVABLE_SQL = f"""
WITH w(topic_id, group_id, tagged) AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bool[]))
SELECT c.topic_id, c.group_id, NULL::text, sum(q.next_offset - c.next_offset)::bigint
FROM w
JOIN broker_consumercursor c ON c.topic_id = w.topic_id AND c.group_id = w.group_id
JOIN broker_messagequeue q ON q.topic_id = c.topic_id AND q.queue_id = c.queue_id
WHERE q.next_offset > c.next_offset
GROUP BY c.topic_id, c.group_id
UNION ALL
SELECT d.topic_id, d.group_id, NULL, count(*)
FROM w
JOIN broker_delivery d ON d.topic_id = w.topic_id AND d.group_id = w.group_id
WHERE NOT w.tagged AND d.state = 'INFLIGHT' AND d.invisible_until <= now()
GROUP BY d.topic_id, d.group_id
UNION ALL
SELECT d.topic_id, d.group_id, m.tags, count(*)
FROM w
JOIN broker_delivery d ON d.topic_id = w.topic_id AND d.group_id = w.group_id
JOIN broker_commitlogentry m ON m.offset = d.message_id
WHERE w.tagged AND d.state = 'INFLIGHT' AND d.invisible_until <= now()
GROUP BY d.topic_id, d.group_id, m.tags
UNION ALL
SELECT h.topic_id, h.group_id, NULL, count(*)
FROM w
JOIN broker_delivery h ON h.topic_id = w.topic_id AND h.group_id = w.group_id
WHERE {fifo.FREE_HELD}
GROUP BY h.topic_id, h.group_id
UNION ALL
SELECT w.topic_id, w.group_id, NULL, {EVERY_WAITER}
FROM w WHERE NOT EXISTS (SELECT 1 FROM broker_consumergroup g WHERE g.id = w.group_id)
"""  # noqa: S608 - composed of constants only

# Which of the given tokens are revoked by now (the fallback's catch-up for revocations).
REVOKED_SQL = (
    f"SELECT id FROM broker_apitoken WHERE id = ANY(%s::bigint[]) AND {access.REVOKED_SQL}"  # noqa: S608
)
