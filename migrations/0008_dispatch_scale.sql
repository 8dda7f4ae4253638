-- Issue 13: a claim whose cost does not grow with the number of endpoints.
--
-- Until now a claim walked every active endpoint (one index probe each) and `next_due`
-- probed every active endpoint: 195 ms per claim and 253 ms per next_due at 100,000
-- endpoints with nothing due. This migration adds a small table with one row per
-- endpoint that has open deliveries (pending, failed or in flight), ordered by when the
-- endpoint's turn comes. A claim reads only the entries whose turn has come, in turn
-- order; `next_due` is one probe of its index. Entries are maintained by triggers, so
-- every path that writes deliveries (the API's fan-out, hookd.enqueue in a producer's
-- own transaction, claims, outcomes, releases, replays, cancellations, tests writing SQL)
-- keeps them right without knowing about them.
--
-- Chosen over a global due-time index on deliveries with per-endpoint caps checked on
-- the picked rows: such a claim has to read past every due row of an endpoint it cannot
-- serve (paused, circuit open, at its cap), so one endpoint with 100,000 due rows and an
-- open circuit costs every claim 100,000 index entries. Here a held endpoint is one entry
-- whose turn lies in the future (or at infinity), and its rows are never read.
-- (solid_queue's ready_executions table holds one row per ready job and would give the
-- same problem back: the hot endpoint's 100,000 ready rows sit in front of the others.)

CREATE TABLE hookd.endpoint_queue (
    endpoint_id  uuid PRIMARY KEY REFERENCES hookd.endpoints (id) ON DELETE CASCADE,
    tenant       text NOT NULL,
    -- Never later than the earliest visible_at of the endpoint's open deliveries (a lower
    -- bound: a claim that finds nothing due simply moves on, while a bound that is too
    -- late would strand a delivery). Raised only under the locking protocol below.
    due_at       timestamptz NOT NULL,
    -- From the endpoint row (hookd.endpoint_hold): NULL while it may be sent to; the end
    -- of the circuit's cool-down (or of the half-open probe's lease) while its circuit is
    -- not closed; infinity while it is paused or disabled.
    hold_until   timestamptz,
    -- When a claim last took rows of this endpoint. A served endpoint goes to the back of
    -- the line, behind every endpoint that has been waiting since before: round robin, so
    -- one endpoint with 100,000 due rows cannot starve 999 others.
    served_at    timestamptz NOT NULL DEFAULT '-infinity',
    turn_at      timestamptz GENERATED ALWAYS AS (greatest(due_at, hold_until, served_at)) STORED
) WITH (
    -- every claim and outcome batch rewrites the entries it touched: leave room on each
    -- page and vacuum the dead versions early, whatever the server-wide settings
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.05
);
CREATE INDEX endpoint_queue_turn ON hookd.endpoint_queue (turn_at);

-- The queue tables get their own autovacuum settings: at 1,000 deliveries a second the
-- deliveries table makes a few thousand dead versions a second, which the default 20%
-- scale factor lets pile up into millions before a vacuum starts (measured: batch
-- latency doubled within 8 minutes with autovacuum off). fillfactor leaves room for the
-- next version on the same page, which keeps the claim's heap reads local.
ALTER TABLE hookd.deliveries SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE hookd.events SET (
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE hookd.delivery_attempts SET (
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- When an endpoint's deliveries may be sent, from its row.
CREATE FUNCTION hookd.endpoint_hold(state text, circuit_state text, circuit_open_until timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN state <> 'active' THEN 'infinity'::timestamptz
              -- an open circuit without an end is never probed (as before this migration)
              WHEN circuit_state <> 'closed' THEN coalesce(circuit_open_until, 'infinity'::timestamptz)
         END
$$;

-- Work arriving. Whoever makes a delivery claimable, or due earlier (enqueue, retry,
-- release, replay), must leave the endpoint's entry no later than the row. Doing that by
-- writing the entry would make enqueues wait for each other, and for a producer's own
-- open transaction (hookd.enqueue inside a business transaction) holding the new entry
-- of an idle endpoint: invariant 8 forbids that wait. So:
--  * when the entry exists and is no later than the row, it is pinned with FOR KEY SHARE
--    until commit (a shared lock: enqueues never wait for each other or for anyone but a
--    refresher's short FOR UPDATE, below);
--  * otherwise a row goes into hookd.endpoint_wakeups (no unique key, so no waiting),
--    which the dispatcher folds into the entries before each claim. A wake-up becomes
--    visible exactly when its transaction commits, so nothing can be raised past it.
-- Work leaving (after a claim or an outcome): the entry is locked FOR UPDATE SKIP LOCKED
-- (a pin makes it skip) and only then recomputed, in a statement of its own whose snapshot
-- sees every delivery committed before the lock was granted. A skipped entry stays a
-- lower bound, which is safe.

CREATE TABLE hookd.endpoint_wakeups (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id  uuid NOT NULL,
    due_at       timestamptz NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

CREATE FUNCTION hookd.endpoint_queue_wake(ids uuid[], dues timestamptz[])
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  pinned uuid[];
BEGIN
  SELECT coalesce(array_agg(p.endpoint_id), '{}') INTO pinned FROM (
    SELECT q.endpoint_id
    FROM hookd.endpoint_queue q
    JOIN unnest(ids, dues) AS i(id, due) ON q.endpoint_id = i.id
    WHERE q.due_at <= i.due
    ORDER BY q.endpoint_id
    FOR KEY SHARE OF q
  ) p;
  INSERT INTO hookd.endpoint_wakeups (endpoint_id, due_at)
  SELECT i.id, i.due FROM unnest(ids, dues) AS i(id, due)
  WHERE i.id <> ALL (pinned);
END
$$;

CREATE FUNCTION hookd.endpoint_queue_refresh(ids uuid[], served uuid[])
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  locked uuid[];
BEGIN
  SELECT coalesce(array_agg(l.endpoint_id), '{}') INTO locked FROM (
    SELECT q.endpoint_id FROM hookd.endpoint_queue q
    WHERE q.endpoint_id = ANY (ids)
    ORDER BY q.endpoint_id
    FOR UPDATE SKIP LOCKED
  ) l;
  IF cardinality(locked) = 0 THEN
    RETURN;
  END IF;
  -- a new statement, so a new snapshot (read committed): see the comment above
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

CREATE FUNCTION hookd.deliveries_queue_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  ids uuid[];
  dues timestamptz[];
BEGIN
  SELECT array_agg(x.endpoint_id), array_agg(x.due) INTO ids, dues FROM (
    SELECT n.endpoint_id, min(n.visible_at) AS due FROM new_rows n
    WHERE n.status IN ('pending', 'in_progress', 'failed')
    GROUP BY n.endpoint_id
  ) x;
  IF ids IS NOT NULL THEN
    PERFORM hookd.endpoint_queue_wake(ids, dues);
  END IF;
  RETURN NULL;
END
$$;

CREATE FUNCTION hookd.deliveries_queue_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  ids uuid[];
  dues timestamptz[];
  raise_ids uuid[];
  served_ids uuid[];
BEGIN
  -- rows that became claimable or due earlier: the entry must not be later than them
  SELECT array_agg(x.endpoint_id), array_agg(x.due) INTO ids, dues FROM (
    SELECT n.endpoint_id, min(n.visible_at) AS due
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.status IN ('pending', 'in_progress', 'failed')
      AND (o.status NOT IN ('pending', 'in_progress', 'failed') OR n.visible_at < o.visible_at
           OR n.endpoint_id <> o.endpoint_id)
    GROUP BY n.endpoint_id
  ) x;
  IF ids IS NOT NULL THEN
    PERFORM hookd.endpoint_queue_wake(ids, dues);
  END IF;
  -- rows that left the queue, were claimed, or are due later: the entry may be later now
  SELECT array_agg(DISTINCT o.endpoint_id),
         array_agg(DISTINCT o.endpoint_id) FILTER (
           WHERE n.status = 'in_progress' AND n.claim_token IS DISTINCT FROM o.claim_token)
    INTO raise_ids, served_ids
  FROM new_rows n JOIN old_rows o ON o.id = n.id
  WHERE o.status IN ('pending', 'in_progress', 'failed')
    AND (n.status NOT IN ('pending', 'in_progress', 'failed') OR n.visible_at > o.visible_at
         OR n.claim_token IS DISTINCT FROM o.claim_token OR n.endpoint_id <> o.endpoint_id);
  IF raise_ids IS NOT NULL THEN
    PERFORM hookd.endpoint_queue_refresh(raise_ids, coalesce(served_ids, '{}'));
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER deliveries_queue_insert AFTER INSERT ON hookd.deliveries
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION hookd.deliveries_queue_insert();
CREATE TRIGGER deliveries_queue_update AFTER UPDATE ON hookd.deliveries
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION hookd.deliveries_queue_update();
-- Deleted rows (retention deletes only terminal ones) can only make an entry stale-early,
-- which is safe; the next claim or outcome of the endpoint refreshes it.

CREATE FUNCTION hookd.endpoints_queue_hold() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE hookd.endpoint_queue q
  SET hold_until = hookd.endpoint_hold(NEW.state, NEW.circuit_state, NEW.circuit_open_until)
  WHERE q.endpoint_id = NEW.id
    AND q.hold_until IS DISTINCT FROM hookd.endpoint_hold(NEW.state, NEW.circuit_state, NEW.circuit_open_until);
  RETURN NULL;
END
$$;

CREATE TRIGGER endpoints_queue_hold AFTER UPDATE OF state, circuit_state, circuit_open_until ON hookd.endpoints
  FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state
        OR OLD.circuit_state IS DISTINCT FROM NEW.circuit_state
        OR OLD.circuit_open_until IS DISTINCT FROM NEW.circuit_open_until)
  EXECUTE FUNCTION hookd.endpoints_queue_hold();

-- Existing open deliveries.
INSERT INTO hookd.endpoint_queue (endpoint_id, tenant, due_at, hold_until)
SELECT e.id, e.tenant, x.due, hookd.endpoint_hold(e.state, e.circuit_state, e.circuit_open_until)
FROM (SELECT d.endpoint_id, min(d.visible_at) AS due FROM hookd.deliveries d
      WHERE d.status IN ('pending', 'in_progress', 'failed')
      GROUP BY d.endpoint_id) x
JOIN hookd.endpoints e ON e.id = x.endpoint_id;
