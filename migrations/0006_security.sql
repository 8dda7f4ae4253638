-- Security hardening (issue 19): endpoint owners are immutable, and the SQL enqueue path
-- is bound to tenants.

-- ---- An endpoint's tenant never changes ----
-- Deliveries follow the endpoint row (its URL, headers and secrets). If the row's tenant
-- could change, the old tenant's pending deliveries, and anything it replays later, would
-- go to the new owner's receiver. So a row keeps its tenant for life; a declaration that
-- names another tenant retires the old row (disabled, its open deliveries cancelled) and
-- gets a new one (db::endpoints::upsert). This trigger makes that the only way.
CREATE FUNCTION hookd.endpoint_tenant_is_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'hookd: endpoint % belongs to tenant %; its tenant cannot change (a new owner gets a new endpoint)',
    OLD.id, quote_literal(OLD.tenant) USING ERRCODE = '23514';
END
$$;
CREATE TRIGGER endpoints_tenant_immutable
  BEFORE UPDATE OF tenant ON hookd.endpoints
  FOR EACH ROW WHEN (OLD.tenant IS DISTINCT FROM NEW.tenant)
  EXECUTE FUNCTION hookd.endpoint_tenant_is_immutable();

-- Rows whose tenant was changed before this migration: the deliveries of an earlier
-- owner move to a retired copy of the row (disabled, so never claimed, and replays of
-- them stay with it), and those still open are cancelled. The copy keeps the current
-- URL, the only one known; being disabled, it never sends.
WITH plan AS (
    -- materialised once (volatile), so every CTE below sees the same new ids
    SELECT s.endpoint_id AS old_id, s.tenant, hookd.uuid_v7() AS new_id
    FROM (SELECT DISTINCT d.endpoint_id, d.tenant
          FROM hookd.deliveries d JOIN hookd.endpoints e ON e.id = d.endpoint_id
          WHERE d.tenant <> e.tenant) s
), retired AS (
    INSERT INTO hookd.endpoints (id, tenant, k8s_namespace, k8s_name, url, state, state_reason)
    SELECT p.new_id, p.tenant, e.k8s_namespace, e.k8s_name || '/retired/' || p.new_id, e.url,
           'disabled', 'retired: the endpoint now belongs to tenant ' || e.tenant
    FROM plan p JOIN hookd.endpoints e ON e.id = p.old_id
    RETURNING id
), moved AS (
    UPDATE hookd.deliveries d
    SET endpoint_id = p.new_id,
        status = CASE WHEN d.status IN ('pending', 'in_progress', 'failed') THEN 'cancelled' ELSE d.status END,
        completed_at = CASE WHEN d.status IN ('pending', 'in_progress', 'failed') THEN now() ELSE d.completed_at END,
        locked_by = NULL,
        updated_at = now()
    FROM plan p
    WHERE d.endpoint_id = p.old_id AND d.tenant = p.tenant
    RETURNING d.id, p.new_id
)
UPDATE hookd.dead_letters dl SET endpoint_id = m.new_id
FROM moved m WHERE dl.delivery_id = m.id;

-- ---- The SQL enqueue path is bound to tenants ----
-- Which database roles may enqueue for which tenant through hookd.enqueue(). A session
-- may enqueue for `tenant` when its login role (session_user) is a member of a role
-- mapped to it. Roles that can write hookd.events directly (the role hookd itself runs
-- as, superusers) need no row: a binding would not confine them anyway.
CREATE TABLE hookd.producer_roles (
    role_name   text NOT NULL,
    tenant      text NOT NULL CHECK (tenant ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (role_name, tenant)
);
CREATE INDEX producer_roles_tenant ON hookd.producer_roles (tenant);

-- The body of migration 0005 (synchronous commit, advisory-locked keys), unchanged but for
-- the tenant check, and SECURITY DEFINER with a
-- fixed search_path, so a producer needs EXECUTE on this function only (no SELECT or
-- INSERT on any hookd table: it can neither read other tenants' payloads nor write for a
-- tenant it is not bound to), and no object of the caller's schemas can stand in for one
-- the function uses (pg_temp last, as the PostgreSQL documentation advises).
CREATE OR REPLACE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
-- Functions are executable by PUBLIC unless revoked; producers get EXECUTE explicitly.
REVOKE ALL ON FUNCTION hookd.enqueue(text, text, text, text) FROM PUBLIC;
