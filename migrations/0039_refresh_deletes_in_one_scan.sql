-- A queue refresh deletes the entries left with nothing to send in one scan of the queue.
--
-- hookd.endpoint_queue_refresh (migration 0035) deleted them with a join of the batch to the
-- queue, bounded by `= ANY (locked)` so a plan from statistics that describe an empty queue
-- could not scan all of it (migration 0022). The planner expects one such entry (it cannot
-- know how many of a batch have nothing left), so it chose a nested loop that probes the
-- queue once per entry with that array as part of the probe: the array is sorted again at
-- each probe, or, in another plan the same estimate allows, every probe reads every entry of
-- the batch. Work that grows with the square of the batch, after every outcome batch: with
-- the trickle shape's batches of about 125 endpoints, refreshing 10,000 finished entries
-- took 305-335 ms one way and 33 ms the other (one session, 80 calls). The entries to delete
-- now go as one array to one index scan. The update of the entries that stay is still a join
-- with the batch: a hash join (one scan) in the drains measured, a probe per entry in some
-- test runs, depending on the statistics.
--
-- 0035's function with that one statement changed.
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
    -- an array, not a join: one index scan whatever the estimates (see above)
    DELETE FROM hookd.endpoint_queue q
    WHERE q.endpoint_id = ANY (ARRAY(SELECT m.id FROM m WHERE m.due IS NULL))
  )
  UPDATE hookd.endpoint_queue q
  SET due_at = m.due,
      served_at = CASE WHEN q.endpoint_id = ANY (served) THEN now() ELSE q.served_at END
  FROM m
  WHERE q.endpoint_id = m.id AND q.endpoint_id = ANY (locked) AND m.due IS NOT NULL
    AND (q.due_at IS DISTINCT FROM m.due OR q.endpoint_id = ANY (served));
END
$$;
