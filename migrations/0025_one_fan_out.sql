-- One fan-out rule: which endpoints an event goes to is `hookd.subscribers`, and both the
-- API's group commit (db::events::insert_with_fanout) and `hookd.enqueue` call it. Before,
-- the rule was written in Rust's statement and again in this function's body.
--
-- It is a plain SQL function (STABLE, not STRICT, no SET, not SECURITY DEFINER) returning a
-- set, so Postgres inlines it into the calling statement: the plan is the one the two
-- copies had, a probe of the subscriptions' primary key per pattern the type matches.
-- OFFSET 0 keeps the planner from flattening the probe into a join it may reorder: the
-- tenant and consumer come from the event row, so it estimates their subscriptions at the
-- average, one row when a tenant has many consumers, and then scanned all of a tenant's
-- tenant-wide subscriptions per event (0.05 x the ingest rate among 10,000 endpoints of
-- distinct types, `hookd-bench --only consumers`). Measured before adopting it: see
-- docs/benchmarks.md ("One fan-out").
CREATE FUNCTION hookd.subscribers(tenant text, consumer text, event_type text)
RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
  SELECT DISTINCT m.endpoint_id
  FROM unnest(hookd.event_type_keys(subscribers.event_type)) AS k(pattern)
  CROSS JOIN LATERAL (
      SELECT s.endpoint_id FROM hookd.subscriptions s
      WHERE s.tenant = subscribers.tenant
        AND s.consumer = coalesce(subscribers.consumer, '')
        AND s.pattern = k.pattern
      OFFSET 0) m
$$;
-- Reading it needs SELECT on hookd.subscriptions anyway (an inlined function is checked
-- as the caller); nobody but hookd's own roles has a reason to call it.
REVOKE ALL ON FUNCTION hookd.subscribers(text, text, text) FROM PUBLIC;

-- hookd.enqueue as in 0011, its fan-out now hookd.subscribers. The SET clauses 0011 added
-- with ALTER FUNCTION are part of the definition here (a replacement would drop them).
-- Planned once per session, like the API's enqueue transaction (db::events::begin_enqueue):
-- with the rule inlined, PL/pgSQL's plan cache judged the generic plan dearer than a custom
-- one and planned the fan-out again on every call, 30 % slower than 0011's body (20,000
-- calls among 10,000 typed endpoints: 12.1-13.6 s against 9.2-10.3 s); planned once,
-- 8.3-8.7 s. Every statement here is a key lookup or an insert whatever the arguments.
CREATE OR REPLACE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text, consumer text)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
  v_id   uuid;
  v_hash bytea;
  v_existing_hash bytea;
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
  FROM hookd.subscribers(enqueue.tenant, enqueue.consumer, enqueue.event_type) AS s(endpoint_id);

  PERFORM pg_notify('hookd_deliveries', '');
  RETURN v_id;
END
$$;
