-- Issue 12: fences that no reset can repeat, outcomes that cannot hit a newer
-- configuration, and removal that cannot leave a delivery behind.

-- The completion fence. Every claim stamps a fresh random token; an outcome is written
-- only while the row still carries the token of the claim that produced it. `attempts`
-- cannot serve as the fence because replay resets it (the same worker re-claiming a
-- replayed row at attempt 1 would otherwise let the first send's stale outcome through).
ALTER TABLE hookd.deliveries
    ADD COLUMN claim_token uuid,
    -- every send ever made of this delivery, never reset (replay resets `attempts`, the
    -- count the retry policy works on); the attempt log is numbered with it so a replayed
    -- delivery never shows two "attempt 1" entries.
    ADD COLUMN attempt_seq integer NOT NULL DEFAULT 0;
UPDATE hookd.deliveries SET attempt_seq = attempts;

-- Bumped whenever an endpoint's destination changes. Outcomes carry the version they were
-- sent under, so failures at an old URL neither open the circuit of nor disable (410) the
-- new configuration.
ALTER TABLE hookd.endpoints
    ADD COLUMN config_version bigint NOT NULL DEFAULT 1,
    -- when the endpoint's declaration was deleted. An enqueue transaction that read the
    -- endpoint as live just before removal can commit a delivery after removal cancelled
    -- the others; the dispatcher's sweep cancels such stragglers of recently removed
    -- endpoints (see db::deliveries::cancel_stragglers).
    ADD COLUMN removed_at timestamptz;
CREATE INDEX endpoints_removed ON hookd.endpoints (removed_at) WHERE removed_at IS NOT NULL;

-- hookd.enqueue: the 4-argument form keeps its signature. Changes:
--  * commits synchronously whatever the server default (the caller's commit backs an
--    acknowledgement);
--  * a key is claimed with an advisory lock the API's committers try (not wait) for;
--  * an idempotency-key repeat whose original event vanished mid-call (retention) raises
--    instead of returning NULL having written nothing.
CREATE OR REPLACE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_id   uuid;
  v_hash bytea;
  v_existing_hash bytea;
BEGIN
  IF tenant IS NULL OR tenant !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$' THEN
    RAISE EXCEPTION 'hookd.enqueue: invalid tenant %', coalesce(quote_literal(tenant), 'NULL') USING ERRCODE = '22023';
  END IF;
  IF event_type IS NULL OR length(event_type) > 128 OR event_type !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
    RAISE EXCEPTION 'hookd.enqueue: invalid event type %', coalesce(quote_literal(event_type), 'NULL') USING ERRCODE = '22023';
  END IF;
  IF payload IS NULL THEN
    RAISE EXCEPTION 'hookd.enqueue: payload is required' USING ERRCODE = '22023';
  END IF;
  PERFORM payload::json;  -- validates JSON without re-serializing what is stored
  PERFORM set_config('synchronous_commit', 'on', true);
  v_hash := sha256(convert_to(event_type || E'\n' || payload, 'UTF8'));

  IF idempotency_key IS NOT NULL THEN
    -- the key's claim, shared with the API's committers (db::events::try_lock_keys): they
    -- see a key held here without waiting on the unique index
    PERFORM pg_advisory_xact_lock(hashtextextended(enqueue.tenant || E'\n' || enqueue.idempotency_key, 0));
    INSERT INTO hookd.events (id, tenant, event_type, payload, idempotency_key, request_hash)
    VALUES (hookd.uuid_v7(), enqueue.tenant, enqueue.event_type, enqueue.payload, enqueue.idempotency_key, v_hash)
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
    INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash)
    VALUES (hookd.uuid_v7(), enqueue.tenant, enqueue.event_type, enqueue.payload, v_hash)
    RETURNING id INTO v_id;
  END IF;

  INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant)
  SELECT hookd.uuid_v7(), v_id, e.id, e.tenant
  FROM hookd.endpoints e
  WHERE e.tenant = enqueue.tenant AND e.state <> 'disabled'
    AND hookd.event_type_matches(e.event_types, enqueue.event_type);

  PERFORM pg_notify('hookd_deliveries', '');
  RETURN v_id;
END
$$;
