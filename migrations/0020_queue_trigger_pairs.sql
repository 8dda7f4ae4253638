-- The queue-maintenance trigger pairs each updated delivery's old and new versions by
-- sorting both transition tables by id, not by joining them.
--
-- The planner sizes a transition table as it is on the call that plans the statement, and
-- PL/pgSQL keeps the plan it built on the session's first call (a statement without
-- parameters is never planned again). Planned for a one-row first call,
-- the join of old_rows to new_rows was a nested loop: every claim and outcome batch of N
-- rows compared N x N pairs, twice (15-83 ms for batches of a few hundred rows, logged by
-- auto_explain during `hookd-bench --only dispatch`). A window over the two tables sorted
-- by id costs N log N whatever the plan. Old versions sort before new ones (false < true),
-- so lag() hands each new version its old one.
--
-- Replacing a function's body takes no lock that enqueue, claim or outcome batches wait on.
CREATE OR REPLACE FUNCTION hookd.deliveries_queue_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  ids uuid[];
  dues timestamptz[];
  raise_ids uuid[];
  served_ids uuid[];
BEGIN
  WITH pair AS MATERIALIZED (
    SELECT * FROM (
      SELECT r.is_new, r.endpoint_id, r.status, r.visible_at, r.claim_token,
             lag(r.endpoint_id) OVER w AS old_endpoint_id,
             lag(r.status) OVER w AS old_status,
             lag(r.visible_at) OVER w AS old_visible_at,
             lag(r.claim_token) OVER w AS old_claim_token
      FROM (
        SELECT o.id, o.endpoint_id, o.status, o.visible_at, o.claim_token, false AS is_new
        FROM old_rows o
        UNION ALL
        SELECT n.id, n.endpoint_id, n.status, n.visible_at, n.claim_token, true
        FROM new_rows n
      ) r
      WINDOW w AS (PARTITION BY r.id ORDER BY r.is_new)
    ) x
    WHERE x.is_new
  ), earlier AS (
    -- rows that became claimable or due earlier: the entry must not be later than them
    SELECT p.endpoint_id, min(p.visible_at) AS due
    FROM pair p
    WHERE p.status IN ('pending', 'in_progress', 'failed')
      AND (p.old_status NOT IN ('pending', 'in_progress', 'failed') OR p.visible_at < p.old_visible_at
           OR p.endpoint_id <> p.old_endpoint_id)
    GROUP BY p.endpoint_id
  ), later AS (
    -- rows that left the queue, were claimed, or are due later: the entry may be later now
    SELECT array_agg(DISTINCT p.old_endpoint_id) AS raise_ids,
           array_agg(DISTINCT p.old_endpoint_id) FILTER (
             WHERE p.status = 'in_progress' AND p.claim_token IS DISTINCT FROM p.old_claim_token)
             AS served_ids
    FROM pair p
    WHERE p.old_status IN ('pending', 'in_progress', 'failed')
      AND (p.status NOT IN ('pending', 'in_progress', 'failed') OR p.visible_at > p.old_visible_at
           OR p.claim_token IS DISTINCT FROM p.old_claim_token OR p.endpoint_id <> p.old_endpoint_id)
  )
  SELECT e.ids, e.dues, l.raise_ids, l.served_ids INTO ids, dues, raise_ids, served_ids
  FROM (SELECT array_agg(endpoint_id) AS ids, array_agg(due) AS dues FROM earlier) e, later l;
  IF ids IS NOT NULL THEN
    PERFORM hookd.endpoint_queue_wake(ids, dues);
  END IF;
  IF raise_ids IS NOT NULL THEN
    PERFORM hookd.endpoint_queue_refresh(raise_ids, coalesce(served_ids, '{}'));
  END IF;
  RETURN NULL;
END
$$;
-- CREATE OR REPLACE resets the function's settings; keep migration 0013's.
ALTER FUNCTION hookd.deliveries_queue_update() SET plan_cache_mode = force_generic_plan;
