-- A queue refresh looks for entries to recheck only when it could not lock one of them.
--
-- hookd.endpoint_queue_refresh (migration 0015) leaves a recheck for each entry another
-- transaction holds. It found them with a statement of their own, a probe of the queue per
-- id, after every claim and every outcome batch, although it skips an entry rarely: in a
-- drain of 10,000 endpoints x 1 row the statement ran 177 times, found nothing each time and
-- took 27.8 ms of the drain's 1.25 s of Postgres statements (pg_stat_statements, hookd-bench
-- --only trickle). The ids it is given are distinct, so when it locked as many entries as it
-- was given ids, every one of them is locked and there is nothing to recheck.
--
-- 0034's function with that one condition added.
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
  -- (locked holds distinct ids that are all in ids: as many means all of them)
  IF cardinality(locked) < cardinality(ids) THEN
    -- entries another transaction holds: refreshed again once this one commits
    INSERT INTO hookd.endpoint_rechecks (endpoint_id)
    SELECT q.endpoint_id FROM hookd.endpoint_queue q
    WHERE q.endpoint_id = ANY (ids) AND q.endpoint_id <> ALL (locked);
  END IF;
  IF cardinality(locked) = 0 THEN
    RETURN;
  END IF;
  -- a new statement, so a new snapshot (read committed): see migration 0008
  WITH m AS (
    SELECT l.id, (SELECT d.visible_at FROM hookd.deliveries d
                  WHERE d.endpoint_id = l.id AND d.status IN ('pending', 'in_progress', 'failed')
                    AND d.visible_at < hookd.ordering_waiting()
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
