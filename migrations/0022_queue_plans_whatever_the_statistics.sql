-- The queue-maintenance functions find their rows by the ids they are given, whatever the
-- statistics of the queue tables say.
--
-- endpoint_rechecks and endpoint_wakeups are empty most of the time and endpoint_queue
-- churns, so the statistics autovacuum keeps for them often describe an empty table. The
-- semi-joins and joins below were planned from that: a full scan of the table on one side
-- of a nested loop, rescanned for every row on the other, which grows with the square of
-- a burst (the same shape folded 10,000 wake-ups in 8.9 s, hookd-bench). An `= ANY` on the
-- ids bounds every scan of these tables to the batch in whatever join order is chosen.
-- Replacing a function's body takes no lock that enqueue, claim or outcome batches wait on.

CREATE OR REPLACE FUNCTION hookd.endpoint_queue_wake(ids uuid[], dues timestamptz[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  pinned uuid[];
BEGIN
  SELECT coalesce(array_agg(p.endpoint_id), '{}') INTO pinned FROM (
    SELECT q.endpoint_id
    FROM hookd.endpoint_queue q
    JOIN unnest(ids, dues) AS i(id, due) ON q.endpoint_id = i.id
    WHERE q.endpoint_id = ANY (ids) AND q.due_at <= i.due
    ORDER BY q.endpoint_id
    FOR KEY SHARE OF q
  ) p;
  INSERT INTO hookd.endpoint_wakeups (endpoint_id, due_at)
  SELECT i.id, i.due FROM unnest(ids, dues) AS i(id, due)
  WHERE i.id <> ALL (pinned);
END
$$;

CREATE OR REPLACE FUNCTION hookd.endpoint_queue_refresh(ids uuid[], served uuid[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  locked uuid[];
BEGIN
  SELECT coalesce(array_agg(l.endpoint_id), '{}') INTO locked FROM (
    SELECT q.endpoint_id FROM hookd.endpoint_queue q
    WHERE q.endpoint_id = ANY (ids)
    ORDER BY q.endpoint_id
    FOR UPDATE SKIP LOCKED
  ) l;
  -- entries another transaction holds: refreshed again once this one commits
  INSERT INTO hookd.endpoint_rechecks (endpoint_id)
  SELECT q.endpoint_id FROM hookd.endpoint_queue q
  WHERE q.endpoint_id = ANY (ids) AND q.endpoint_id <> ALL (locked);
  IF cardinality(locked) = 0 THEN
    RETURN;
  END IF;
  -- a new statement, so a new snapshot (read committed): see migration 0008
  WITH m AS (
    SELECT l.id, (SELECT d.visible_at FROM hookd.deliveries d
                  WHERE d.endpoint_id = l.id AND d.status IN ('pending', 'in_progress', 'failed')
                  ORDER BY d.visible_at LIMIT 1) AS due
    FROM unnest(locked) AS l(id)
  ), gone AS (
    DELETE FROM hookd.endpoint_queue q USING m
    WHERE q.endpoint_id = m.id AND q.endpoint_id = ANY (locked) AND m.due IS NULL
  )
  UPDATE hookd.endpoint_queue q
  SET due_at = m.due,
      served_at = CASE WHEN q.endpoint_id = ANY (served) THEN now() ELSE q.served_at END
  FROM m
  WHERE q.endpoint_id = m.id AND q.endpoint_id = ANY (locked) AND m.due IS NOT NULL
    AND (q.due_at IS DISTINCT FROM m.due OR q.endpoint_id = ANY (served));
END
$$;

CREATE OR REPLACE FUNCTION hookd.endpoint_queue_recheck(batch int)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  ids uuid[];
  n int;
BEGIN
  WITH r AS (
    DELETE FROM hookd.endpoint_rechecks
    WHERE id = ANY (ARRAY(SELECT id FROM hookd.endpoint_rechecks ORDER BY id LIMIT batch
                          FOR UPDATE SKIP LOCKED))
    RETURNING endpoint_id
  )
  SELECT coalesce(array_agg(DISTINCT endpoint_id), '{}'), count(*) INTO ids, n FROM r;
  IF cardinality(ids) > 0 THEN
    PERFORM hookd.endpoint_queue_refresh(ids, '{}');
  END IF;
  RETURN n;
END
$$;
