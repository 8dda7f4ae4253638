-- The history is separated from the hot queue (issue 13, steady state).
--
-- `hookd.deliveries` becomes a table partitioned by status:
--   hookd.delivery_queue    pending, in_progress, failed: what dispatchers claim; small
--   hookd.delivery_history  succeeded, dead, cancelled: partitioned again by id range,
--                           one partition per UTC day (ids are UUIDv7, so an id range is
--                           a creation-time range), plus a default partition for ids
--                           outside every day (not UUIDv7, or a day not created yet).
-- An UPDATE through `hookd.deliveries` that makes a delivery terminal moves it from the
-- queue into its day's history partition, and a replay moves it back, with the same id:
-- no statement that writes or reads deliveries changes, and the claim (whose status
-- filter is the queue's partition bound) is planned on the queue partition alone.
-- `delivery_attempts` and `dead_letters` are partitioned by the same day ranges of
-- `delivery_id`, so that retention can drop a whole day (three tables) at once instead
-- of deleting its rows one by one (see hookd.history_day_drop).
--
-- Runs in the migration's transaction: existing rows are copied, which holds the queue
-- tables for the time of the copy. Existing history goes to the default partitions,
-- which retention empties row by row as before.

-- hookd's connections price sequential scans out (db::INDEX_PATHS_ONLY); the copies below
-- read whole tables, which only a sequential scan does well.
SET LOCAL enable_seqscan = on;

CREATE FUNCTION hookd.uuid_v7_floor(ms bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT (lpad(to_hex(ms), 12, '0') || '00000000000000000000')::uuid
$$;

ALTER TABLE hookd.deliveries RENAME TO deliveries_old;
ALTER TABLE hookd.delivery_attempts RENAME TO delivery_attempts_old;
ALTER TABLE hookd.dead_letters RENAME TO dead_letters_old;
ALTER INDEX hookd.deliveries_pkey RENAME TO deliveries_old_pkey;
ALTER INDEX hookd.delivery_attempts_pkey RENAME TO delivery_attempts_old_pkey;
ALTER INDEX hookd.dead_letters_pkey RENAME TO dead_letters_old_pkey;
DROP TRIGGER deliveries_queue_insert ON hookd.deliveries_old;
DROP TRIGGER deliveries_queue_update ON hookd.deliveries_old;

CREATE TABLE hookd.deliveries (
    id                uuid NOT NULL,
    event_id          uuid NOT NULL
                      CONSTRAINT deliveries_event_id_fkey REFERENCES hookd.events (id) ON DELETE CASCADE,
    endpoint_id       uuid NOT NULL
                      CONSTRAINT deliveries_endpoint_id_fkey REFERENCES hookd.endpoints (id) ON DELETE CASCADE,
    tenant            text NOT NULL,
    status            text NOT NULL DEFAULT 'pending'
                      CONSTRAINT deliveries_status_check CHECK (status IN ('pending', 'in_progress', 'failed', 'succeeded', 'dead', 'cancelled')),
    attempts          integer NOT NULL DEFAULT 0,
    visible_at        timestamptz NOT NULL DEFAULT now(),
    locked_by         uuid,
    last_status_code  integer,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    completed_at      timestamptz,
    claim_token       uuid,
    attempt_seq       integer NOT NULL DEFAULT 0,
    consumer          text,
    -- A unique index of a partitioned table must hold the partition keys. The id alone
    -- is unique by construction: ids are minted once (UUIDv7), and a row changes
    -- partition only by an UPDATE, which moves it.
    PRIMARY KEY (id, status)
) PARTITION BY LIST (status);

CREATE TABLE hookd.delivery_queue PARTITION OF hookd.deliveries
    FOR VALUES IN ('pending', 'in_progress', 'failed')
    -- 0008's settings, now on the partition that takes every claim and lease update
    WITH (
        fillfactor = 80,
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 5000,
        autovacuum_vacuum_insert_scale_factor = 0.05,
        autovacuum_vacuum_cost_delay = 0,
        autovacuum_analyze_scale_factor = 0.02
    );
CREATE TABLE hookd.delivery_history PARTITION OF hookd.deliveries
    FOR VALUES IN ('succeeded', 'dead', 'cancelled')
    PARTITION BY RANGE (id);
CREATE TABLE hookd.delivery_history_default PARTITION OF hookd.delivery_history DEFAULT;

CREATE TABLE hookd.delivery_attempts (
    id              bigint GENERATED ALWAYS AS IDENTITY,
    delivery_id     uuid NOT NULL,
    attempt         integer NOT NULL,
    started_at      timestamptz NOT NULL,
    duration_ms     integer NOT NULL,
    status_code     integer,
    error_class     text,
    error           text,
    response_snippet text,
    PRIMARY KEY (id, delivery_id)
) PARTITION BY RANGE (delivery_id);
CREATE TABLE hookd.delivery_attempts_default PARTITION OF hookd.delivery_attempts DEFAULT;

CREATE TABLE hookd.dead_letters (
    delivery_id   uuid NOT NULL PRIMARY KEY,
    endpoint_id   uuid NOT NULL,
    tenant        text NOT NULL,
    reason        text NOT NULL,
    attempts      integer NOT NULL,
    dead_at       timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (delivery_id);
CREATE TABLE hookd.dead_letters_default PARTITION OF hookd.dead_letters DEFAULT;

-- One UTC day of history: a partition of each of the three tables over the ids minted
-- that day. Returns whether the day exists afterwards. A day whose ids already sit in a
-- default partition (it was not created in time) cannot be created; its rows stay in the
-- default partitions, where retention deletes them row by row.
CREATE FUNCTION hookd.history_day_create(day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  lo uuid := hookd.uuid_v7_floor((extract(epoch FROM day::timestamp) * 1000)::bigint);
  hi uuid := hookd.uuid_v7_floor((extract(epoch FROM (day + 1)::timestamp) * 1000)::bigint);
  suffix text := to_char(day, 'YYYYMMDD');
BEGIN
  IF to_regclass('hookd.delivery_history_' || suffix) IS NOT NULL THEN
    RETURN true;
  END IF;
  BEGIN
    EXECUTE format('CREATE TABLE hookd.%I PARTITION OF hookd.delivery_history FOR VALUES FROM (%L) TO (%L)',
                   'delivery_history_' || suffix, lo, hi);
    EXECUTE format('CREATE TABLE hookd.%I PARTITION OF hookd.delivery_attempts FOR VALUES FROM (%L) TO (%L)',
                   'delivery_attempts_' || suffix, lo, hi);
    EXECUTE format('CREATE TABLE hookd.%I PARTITION OF hookd.dead_letters FOR VALUES FROM (%L) TO (%L)',
                   'dead_letters_' || suffix, lo, hi);
  EXCEPTION WHEN check_violation THEN
    -- "updated partition constraint for default partition would be violated"
    RAISE WARNING 'hookd: history day % is already in the default partitions; it stays there', day;
    RETURN false;
  END;
  RETURN true;
END
$$;

-- The days from today (UTC) to `ahead` days later; returns how many exist.
CREATE FUNCTION hookd.history_days_ensure(ahead integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  today date := (now() AT TIME ZONE 'UTC')::date;
  n integer := 0;
BEGIN
  FOR i IN 0..ahead LOOP
    IF hookd.history_day_create(today + i) THEN
      n := n + 1;
    END IF;
  END LOOP;
  RETURN n;
END
$$;

SELECT hookd.history_days_ensure(3);
-- Everything minted before today, in one partition that retention drops like a day once
-- all of it has expired; the default partitions keep only ids that are not UUIDv7.
CREATE TABLE hookd.delivery_history_before_0014 PARTITION OF hookd.delivery_history
    FOR VALUES FROM (MINVALUE) TO (hookd.uuid_v7_floor((extract(epoch FROM (now() AT TIME ZONE 'UTC')::date::timestamp) * 1000)::bigint));
CREATE TABLE hookd.delivery_attempts_before_0014 PARTITION OF hookd.delivery_attempts
    FOR VALUES FROM (MINVALUE) TO (hookd.uuid_v7_floor((extract(epoch FROM (now() AT TIME ZONE 'UTC')::date::timestamp) * 1000)::bigint));
CREATE TABLE hookd.dead_letters_before_0014 PARTITION OF hookd.dead_letters
    FOR VALUES FROM (MINVALUE) TO (hookd.uuid_v7_floor((extract(epoch FROM (now() AT TIME ZONE 'UTC')::date::timestamp) * 1000)::bigint));

INSERT INTO hookd.deliveries SELECT id, event_id, endpoint_id, tenant, status, attempts, visible_at,
    locked_by, last_status_code, last_error, created_at, updated_at, completed_at, claim_token,
    attempt_seq, consumer
  FROM hookd.deliveries_old;
INSERT INTO hookd.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code,
    error_class, error, response_snippet)
  SELECT delivery_id, attempt, started_at, duration_ms, status_code, error_class, error, response_snippet
  FROM hookd.delivery_attempts_old ORDER BY id;
INSERT INTO hookd.dead_letters SELECT * FROM hookd.dead_letters_old;
DROP TABLE hookd.dead_letters_old;
DROP TABLE hookd.delivery_attempts_old;
DROP TABLE hookd.deliveries_old;

-- Indexes on the parents reach every partition.
-- The claim index lives on the queue partition alone, with no predicate: every row there
-- is claimable by status, and a history partition has nothing to claim. Without a partial
-- predicate, no statement's status condition can make this index a candidate for a
-- primary-key lookup (the plan flip described in `deliveries::complete`).
CREATE INDEX deliveries_claimable ON hookd.delivery_queue (endpoint_id, visible_at);
CREATE INDEX deliveries_event ON hookd.deliveries (event_id);
CREATE INDEX deliveries_endpoint_created ON hookd.deliveries (endpoint_id, created_at);
CREATE INDEX deliveries_endpoint_page ON hookd.deliveries (endpoint_id, id);
CREATE INDEX delivery_attempts_delivery ON hookd.delivery_attempts (delivery_id, attempt);
CREATE INDEX dead_letters_tenant ON hookd.dead_letters (tenant, dead_at, delivery_id);
CREATE INDEX dead_letters_endpoint ON hookd.dead_letters (endpoint_id, dead_at, delivery_id);
-- Retention asks of a day whether any row is still unexpired (`updated_at` at or past a
-- cutoff); a block-range index answers that without reading the day, and costs next to
-- nothing to keep: history rows are written once, in roughly `updated_at` order.
CREATE INDEX delivery_history_updated ON hookd.delivery_history USING brin (updated_at);


-- 0012's check, NOT VALID for the same reason (rows written by older versions)
ALTER TABLE hookd.delivery_attempts
    ADD CONSTRAINT delivery_attempts_error_class CHECK (error_class IN (
        'timeout', 'connect', 'dns', 'body', 'request', 'destination_forbidden', 'invalid_url',
        'http_status', 'gone', 'no_signing_secret', 'secret_unreadable')) NOT VALID;

CREATE TRIGGER deliveries_queue_insert AFTER INSERT ON hookd.deliveries
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION hookd.deliveries_queue_insert();
-- A row moved between partitions by an UPDATE is in this trigger's transition tables
-- as an update, like any other.
CREATE TRIGGER deliveries_queue_update AFTER UPDATE ON hookd.deliveries
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION hookd.deliveries_queue_update();
