-- Issue 27, items 1 and 2: a claim that fills itself from many endpoints with a trickle
-- of due rows each, that never lets one tenant's entries hide another's, and queue
-- entries that cannot go stale.
--
-- 1. The claim reads each tenant's due entries apart (one range scan per tenant with
--    entries, found by a loose scan of this index), so a tenant with thousands of
--    endpoints contributes at most what its share can use, not the whole window.
CREATE INDEX endpoint_queue_tenant_turn ON hookd.endpoint_queue (tenant, turn_at);

-- 2. Stale entries. An entry is recomputed after work leaves it (claim, outcome) under
--    FOR UPDATE SKIP LOCKED, in a statement whose snapshot is taken after the lock. When
--    two transactions changed one endpoint's rows at once, the one that got the lock
--    could not see the other's uncommitted change, and the other skipped the entry: it
--    kept a due time from before (for an endpoint whose last delivery had just finished,
--    an entry with no open delivery at all), at the head of the line, forever. Measured:
--    7 such entries after a drain of 1,000 endpoints x 30 deliveries, which the claim
--    then charged a full quota each and throttled their tenant to one request at a time.
--
--    Now a refresh that skips a locked entry leaves a recheck (no unique key, so nobody
--    waits), visible when its transaction commits; the dispatcher folds rechecks before
--    each claim, like wake-ups, by refreshing the entry again with a snapshot that sees
--    the change. A refresh that is skipped again leaves another recheck, so this ends
--    when the entry is right. The claim also leaves a recheck for any entry whose turn
--    had come but which had no due row (whatever made it so: a row deleted by hand, a
--    version of hookd before this one), so no entry stays early for long.
CREATE TABLE hookd.endpoint_rechecks (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id  uuid NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

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
    WHERE q.endpoint_id = m.id AND m.due IS NULL
  )
  UPDATE hookd.endpoint_queue q
  SET due_at = m.due,
      served_at = CASE WHEN q.endpoint_id = ANY (served) THEN now() ELSE q.served_at END
  FROM m
  WHERE q.endpoint_id = m.id AND m.due IS NOT NULL
    AND (q.due_at IS DISTINCT FROM m.due OR q.endpoint_id = ANY (served));
END
$$;

-- Folds a batch of rechecks (the dispatcher, before each claim). Returns how many.
CREATE FUNCTION hookd.endpoint_queue_recheck(batch int)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  ids uuid[];
  n int;
BEGIN
  WITH r AS (
    DELETE FROM hookd.endpoint_rechecks
    WHERE id IN (SELECT id FROM hookd.endpoint_rechecks ORDER BY id LIMIT batch
                 FOR UPDATE SKIP LOCKED)
    RETURNING endpoint_id
  )
  SELECT coalesce(array_agg(DISTINCT endpoint_id), '{}'), count(*) INTO ids, n FROM r;
  IF cardinality(ids) > 0 THEN
    PERFORM hookd.endpoint_queue_refresh(ids, '{}');
  END IF;
  RETURN n;
END
$$;

-- Entries already stale from before this migration.
INSERT INTO hookd.endpoint_rechecks (endpoint_id)
SELECT q.endpoint_id FROM hookd.endpoint_queue q
WHERE NOT EXISTS (SELECT 1 FROM hookd.deliveries d
                  WHERE d.endpoint_id = q.endpoint_id
                    AND d.status IN ('pending', 'in_progress', 'failed'));
