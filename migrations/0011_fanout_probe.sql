-- Fan-out by pattern probe (issue 15, found by `hookd-bench --only consumers`). Migration
-- 0007's hookd.enqueue matched with `pattern = ANY (hookd.event_type_keys(...))` as a
-- filter, the function run once per subscription row of the tenant (18 events/s among
-- 10,000 endpoints of distinct types). This replaces it here rather than in migration
-- 0009, which had already been applied as it stands.
-- Here the patterns an event type matches are computed once and drive the lookup, one
-- probe of the subscriptions' primary key per pattern. The tenant and consumer of a probe
-- are parameters, so the planner estimates their subscriptions at the average, one row
-- when a tenant has many consumers; free to reorder the probe into a join, it then read
-- all of a tenant's tenant-wide subscriptions for every event (0.05 x the ingest rate;
-- PL/pgSQL's generic plan after five calls did the same). OFFSET 0 keeps the probe a
-- subquery of its own. The API's statement (db::events::insert_with_fanout) is written the
-- same way. The body is migration 0007's otherwise; its privileges are kept by CREATE OR
-- REPLACE.
CREATE OR REPLACE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text, consumer text)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_id   uuid;
  v_hash bytea;
  v_existing_hash bytea;
  v_keys text[];
BEGIN
  IF tenant IS NULL OR tenant !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$' THEN
    RAISE EXCEPTION 'hookd.enqueue: invalid tenant %', coalesce(quote_literal(tenant), 'NULL') USING ERRCODE = '22023';
  END IF;
  IF consumer IS NOT NULL AND consumer !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$' THEN
    RAISE EXCEPTION 'hookd.enqueue: invalid consumer %', quote_literal(consumer) USING ERRCODE = '22023';
  END IF;
  IF NOT has_table_privilege(session_user, 'hookd.events', 'INSERT')
     AND NOT EXISTS (
       SELECT 1 FROM hookd.producer_roles r
       WHERE r.tenant = enqueue.tenant
         AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles pr WHERE pr.rolname = r.role_name)
         AND pg_has_role(session_user, r.role_name, 'MEMBER'))
  THEN
    RAISE EXCEPTION 'hookd.enqueue: role % may not enqueue for tenant %', quote_ident(session_user), quote_literal(tenant)
      USING ERRCODE = '42501',
            HINT = 'map the role to the tenant: INSERT INTO hookd.producer_roles (role_name, tenant) VALUES (...)';
  END IF;
  IF event_type IS NULL OR length(event_type) > 128 OR event_type !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
    RAISE EXCEPTION 'hookd.enqueue: invalid event type %', coalesce(quote_literal(event_type), 'NULL') USING ERRCODE = '22023';
  END IF;
  IF payload IS NULL THEN
    RAISE EXCEPTION 'hookd.enqueue: payload is required' USING ERRCODE = '22023';
  END IF;
  PERFORM payload::json;  -- validates JSON without re-serializing what is stored
  v_keys := hookd.event_type_keys(event_type);
  PERFORM set_config('synchronous_commit', 'on', true);
  -- the consumer is part of what a key stands for: the same key re-sent for another
  -- consumer is different content (the API hashes the same way, outbox::request_hash)
  v_hash := sha256(convert_to(event_type || E'\n' || payload
                              || CASE WHEN consumer IS NULL THEN '' ELSE E'\n' || consumer END, 'UTF8'));

  IF idempotency_key IS NOT NULL THEN
    -- the key's claim, shared with the API's committers (db::events::try_lock_keys)
    PERFORM pg_advisory_xact_lock(hashtextextended(enqueue.tenant || E'\n' || enqueue.idempotency_key, 0));
    INSERT INTO hookd.events (id, tenant, event_type, payload, idempotency_key, request_hash, consumer)
    VALUES (hookd.uuid_v7(), enqueue.tenant, enqueue.event_type, enqueue.payload, enqueue.idempotency_key, v_hash, enqueue.consumer)
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
      SELECT e.id, e.request_hash INTO v_id, v_existing_hash FROM hookd.events e
      WHERE e.tenant = enqueue.tenant AND e.idempotency_key = enqueue.idempotency_key;
      IF v_id IS NULL THEN
        RAISE EXCEPTION 'hookd.enqueue: the event holding idempotency key % was deleted while this call ran; retry', quote_literal(idempotency_key)
          USING ERRCODE = '40001';
      END IF;
      IF v_existing_hash <> v_hash THEN
        RAISE EXCEPTION 'hookd.enqueue: idempotency key % was already used with different content', quote_literal(idempotency_key)
          USING ERRCODE = '23505';
      END IF;
      RETURN v_id;
    END IF;
  ELSE
    INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash, consumer)
    VALUES (hookd.uuid_v7(), enqueue.tenant, enqueue.event_type, enqueue.payload, v_hash, enqueue.consumer)
    RETURNING id INTO v_id;
  END IF;

  INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, consumer)
  SELECT hookd.uuid_v7(), v_id, s.endpoint_id, enqueue.tenant, enqueue.consumer
  FROM (SELECT DISTINCT m.endpoint_id
        FROM unnest(v_keys) AS k(pattern)
        CROSS JOIN LATERAL (
            SELECT s.endpoint_id FROM hookd.subscriptions s
            WHERE s.tenant = enqueue.tenant AND s.consumer = coalesce(enqueue.consumer, '')
              AND s.pattern = k.pattern
            OFFSET 0) m) s;

  PERFORM pg_notify('hookd_deliveries', '');
  RETURN v_id;
END
$$;

-- And whatever the estimate: with 100,000 consumers subscribed to `*` in one tenant the
-- planner estimated a probe at 233,000 rows, chose a sequential scan and JIT-compiled it
-- (0.8 s per call, `hookd-bench --only consumers` at 300,000 endpoints). Every statement
-- here is a key lookup or an insert, so neither is ever the better choice.
ALTER FUNCTION hookd.enqueue(text, text, text, text, text) SET enable_seqscan = off;
ALTER FUNCTION hookd.enqueue(text, text, text, text, text) SET jit = off;
