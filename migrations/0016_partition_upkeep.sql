-- Partition upkeep that never stops the hot path (issue 27, items 3 and 6; DESIGN.md
-- invariant 10). See docs/retention-partitions.md.
--
-- 1. The foreign keys of `hookd.deliveries` move from the parent to the queue partition.
--    A foreign key on the parent is cloned onto every new history partition, and cloning
--    it takes SHARE ROW EXCLUSIVE on `hookd.events` and `hookd.endpoints`: a producer's
--    open transaction that called `hookd.enqueue` (ROW EXCLUSIVE on events) made a day's
--    creation wait, and every enqueue, claim and outcome batch queued behind that wait.
--    Every delivery is inserted into the queue (its status starts `pending`) and reaches
--    the history only by moving out of it, so the queue's keys check every delivery once;
--    what a key's ON DELETE CASCADE did for the history, a statement trigger does below.
-- 2. No default partitions. Attaching a partition locks the parent's default partition
--    ACCESS EXCLUSIVE and scans it, and every statement that is not pruned at plan time
--    (generic plans, lookups by event) holds a lock on it. Days are created 7 days ahead
--    instead (db::retention::HISTORY_DAYS_AHEAD), so every id hookd mints (UUIDv7) has its
--    day waiting for it. Rows in the defaults today are moved into days made for them.
-- 3. A day is created as a free-standing table and attached (SHARE UPDATE EXCLUSIVE on the
--    parent, which no DML conflicts with), with a CHECK constraint equal to its range so
--    that attaching reads nothing.
-- 4. Message listings by delivery status read these indexes instead of walking events.

SET LOCAL enable_seqscan = on;

-- 1. foreign keys on the queue only
ALTER TABLE hookd.deliveries DROP CONSTRAINT deliveries_event_id_fkey;
ALTER TABLE hookd.deliveries DROP CONSTRAINT deliveries_endpoint_id_fkey;
ALTER TABLE hookd.delivery_queue
    ADD CONSTRAINT delivery_queue_event_id_fkey FOREIGN KEY (event_id)
        REFERENCES hookd.events (id) ON DELETE CASCADE,
    ADD CONSTRAINT delivery_queue_endpoint_id_fkey FOREIGN KEY (endpoint_id)
        REFERENCES hookd.endpoints (id) ON DELETE CASCADE;

-- What ON DELETE CASCADE did for the history when an endpoint is deleted. hookd itself
-- never deletes an endpoint (it disables it); this keeps an operator's DELETE from
-- leaving history rows behind. Events need no such trigger: hookd deletes an event only
-- in the statement that finds it has no delivery left (retention), and a trigger there
-- would probe every history day once per deleted event, which the foreign key's cascade
-- did before and which made deleting events slow.
CREATE FUNCTION hookd.history_cascade_endpoints() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM hookd.delivery_history h USING gone g WHERE h.endpoint_id = g.id;
  RETURN NULL;
END
$$;
CREATE TRIGGER endpoints_history_cascade AFTER DELETE ON hookd.endpoints
  REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION hookd.history_cascade_endpoints();

-- 3. one day: three free-standing tables, attached
CREATE OR REPLACE FUNCTION hookd.history_day_create(day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  lo uuid := hookd.uuid_v7_floor((extract(epoch FROM day::timestamp) * 1000)::bigint);
  hi uuid := hookd.uuid_v7_floor((extract(epoch FROM (day + 1)::timestamp) * 1000)::bigint);
  suffix text := to_char(day, 'YYYYMMDD');
  t record;
BEGIN
  IF to_regclass('hookd.delivery_history_' || suffix) IS NOT NULL THEN
    RETURN true;
  END IF;
  FOR t IN SELECT * FROM (VALUES
      ('delivery_history', 'id', $x$AND status IN ('succeeded', 'dead', 'cancelled')$x$),
      ('delivery_attempts', 'delivery_id', ''),
      ('dead_letters', 'delivery_id', '')) AS v(parent, key, extra)
  LOOP
    -- LIKE reads the parent's definition under ACCESS SHARE; no identity (the parent's
    -- sequence numbers attempts), no indexes (attaching creates the parent's)
    EXECUTE format('CREATE TABLE hookd.%I (LIKE hookd.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                   t.parent || '_' || suffix, t.parent);
    -- the partition constraint, proven by this CHECK, so ATTACH does not read the table
    EXECUTE format('ALTER TABLE hookd.%I ADD CONSTRAINT %I CHECK (%I IS NOT NULL AND %I >= %L AND %I < %L %s)',
                   t.parent || '_' || suffix, t.parent || '_' || suffix || '_range',
                   t.key, t.key, lo, t.key, hi, t.extra);
    EXECUTE format('ALTER TABLE hookd.%I ATTACH PARTITION hookd.%I FOR VALUES FROM (%L) TO (%L)',
                   t.parent, t.parent || '_' || suffix, lo, hi);
  END LOOP;
  RETURN true;
END
$$;

-- The days from today (UTC) to `ahead` days later; returns how many exist. One creator at
-- a time: a second caller (another dispatcher) finds the lock taken and leaves the work
-- to the first instead of racing it for the same names.
CREATE OR REPLACE FUNCTION hookd.history_days_ensure(ahead integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  today date := (now() AT TIME ZONE 'UTC')::date;
  n integer := 0;
BEGIN
  IF NOT pg_try_advisory_xact_lock(7526744938421348708) THEN -- "hookdday" + 4
    RETURN 0;
  END IF;
  FOR i IN 0..ahead LOOP
    IF hookd.history_day_create(today + i) THEN
      n := n + 1;
    END IF;
  END LOOP;
  RETURN n;
END
$$;

-- 2. the default partitions go; what they hold moves into days made for it
CREATE FUNCTION pg_temp.uuid_day(id uuid) RETURNS date
LANGUAGE sql IMMUTABLE AS $$
  SELECT (to_timestamp(('x' || lpad(substr(replace(id::text, '-', ''), 1, 12), 16, '0'))::bit(64)::bigint / 1000.0)
          AT TIME ZONE 'UTC')::date
$$;

ALTER TABLE hookd.delivery_history DETACH PARTITION hookd.delivery_history_default;
ALTER TABLE hookd.delivery_attempts DETACH PARTITION hookd.delivery_attempts_default;
ALTER TABLE hookd.dead_letters DETACH PARTITION hookd.dead_letters_default;

SELECT hookd.history_day_create(day) FROM (
    SELECT pg_temp.uuid_day(id) AS day FROM hookd.delivery_history_default
    UNION SELECT pg_temp.uuid_day(delivery_id) FROM hookd.delivery_attempts_default
    UNION SELECT pg_temp.uuid_day(delivery_id) FROM hookd.dead_letters_default) d
ORDER BY day;

INSERT INTO hookd.delivery_history SELECT * FROM hookd.delivery_history_default;
INSERT INTO hookd.delivery_attempts OVERRIDING SYSTEM VALUE
    SELECT * FROM hookd.delivery_attempts_default;
INSERT INTO hookd.dead_letters SELECT * FROM hookd.dead_letters_default;
DROP TABLE hookd.delivery_history_default, hookd.delivery_attempts_default, hookd.dead_letters_default;

-- 4. message listings by status (db::events::list): the newest events with a delivery in
-- a status, per tenant and per consumer, in one ordered index range
CREATE INDEX deliveries_status_page ON hookd.deliveries (tenant, status, event_id);
CREATE INDEX deliveries_consumer_status_page ON hookd.deliveries (tenant, consumer, status, event_id)
    WHERE consumer IS NOT NULL;
