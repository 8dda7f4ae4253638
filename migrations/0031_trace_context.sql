-- W3C trace context (issue 34, item 5): an event keeps the producer's `traceparent` and
-- `tracestate`, and every delivery of it sends them on, so a receiver's trace joins the
-- producer's. The API takes them from the request's headers; hookd.enqueue from the
-- caller's transaction settings (`SET LOCAL hookd.traceparent = '00-…'`, and
-- `hookd.tracestate`), so its signature does not change. Malformed values are ignored,
-- not refused (W3C: a receiver that cannot parse a traceparent starts a new trace).
--
-- Nullable columns without a default: nothing is rewritten.
ALTER TABLE hookd.events
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate text;

-- hookd.enqueue as in 0025, refusing the reserved `hookd.` prefix (migration 0030) and
-- keeping the caller's trace context: the seventh statement of this function, since a
-- migration cannot edit an earlier one.
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
  v_traceparent text;
  v_tracestate text;
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
  IF hookd.is_reserved_event_type(event_type) THEN
    RAISE EXCEPTION 'hookd.enqueue: event type % is reserved: types under hookd. are hookd''s own (operational events)', quote_literal(event_type)
      USING ERRCODE = '22023';
  END IF;
  IF payload IS NULL THEN
    RAISE EXCEPTION 'hookd.enqueue: payload is required' USING ERRCODE = '22023';
  END IF;
  PERFORM payload::json;  -- validates JSON without re-serializing what is stored
  -- the caller's W3C trace context, if it set one for its transaction (SET LOCAL
  -- hookd.traceparent = '00-…'); one that is not well-formed is ignored, as the W3C
  -- recommendation says of a traceparent it cannot parse
  v_traceparent := nullif(current_setting('hookd.traceparent', true), '');
  IF v_traceparent IS NOT NULL AND (v_traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       OR v_traceparent ~ '^ff-' OR v_traceparent ~ '^[0-9a-f]{2}-0{32}-' OR v_traceparent ~ '-0{16}-[0-9a-f]{2}$') THEN
    v_traceparent := NULL;
  END IF;
  v_tracestate := nullif(current_setting('hookd.tracestate', true), '');
  IF v_traceparent IS NULL OR length(v_tracestate) > 512 OR v_tracestate !~ '^[\x20-\x7e]*$' THEN
    v_tracestate := NULL;
  END IF;
  PERFORM set_config('synchronous_commit', 'on', true);
  -- the consumer is part of what a key stands for: the same key re-sent for another
  -- consumer is different content (the API hashes the same way, outbox::request_hash)
  v_hash := sha256(convert_to(event_type || E'\n' || payload
                              || CASE WHEN consumer IS NULL THEN '' ELSE E'\n' || consumer END, 'UTF8'));

  IF idempotency_key IS NOT NULL THEN
    -- the key's claim, shared with the API's committers (db::events::try_lock_keys)
    PERFORM pg_advisory_xact_lock(hashtextextended(enqueue.tenant || E'\n' || enqueue.idempotency_key, 0));
    INSERT INTO hookd.events (id, tenant, event_type, payload, idempotency_key, request_hash, consumer,
                              traceparent, tracestate)
    VALUES (hookd.uuid_v7(), enqueue.tenant, enqueue.event_type, enqueue.payload, enqueue.idempotency_key, v_hash, enqueue.consumer,
            v_traceparent, v_tracestate)
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
    INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash, consumer,
                              traceparent, tracestate)
    VALUES (hookd.uuid_v7(), enqueue.tenant, enqueue.event_type, enqueue.payload, v_hash, enqueue.consumer,
            v_traceparent, v_tracestate)
    RETURNING id INTO v_id;
  END IF;

  INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, consumer)
  SELECT hookd.uuid_v7(), v_id, s.endpoint_id, enqueue.tenant, enqueue.consumer
  FROM hookd.subscribers(enqueue.tenant, enqueue.consumer, enqueue.event_type) AS s(endpoint_id);

  PERFORM pg_notify('hookd_deliveries', '');
  RETURN v_id;
END
$$;

