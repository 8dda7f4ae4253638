-- Consumers (issue 15): the party a webhook is for. Endpoints belong to a tenant and
-- optionally to one consumer; an event addressed to a consumer fans out to that
-- consumer's endpoints only, an event without one to the tenant-wide endpoints only.

CREATE TABLE hookd.consumers (
    tenant      text NOT NULL CHECK (tenant ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    uid         text NOT NULL CHECK (uid ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    name        text CHECK (name IS NULL OR length(name) <= 200),
    metadata    jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, uid)
);

-- Endpoints made through the endpoints API have no Kubernetes identity; `managed_by`
-- says which source owns a row, and the API refuses to change the other's.
ALTER TABLE hookd.endpoints
    ADD COLUMN consumer    text CHECK (consumer IS NULL OR consumer ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    ADD COLUMN managed_by  text NOT NULL DEFAULT 'kubernetes' CHECK (managed_by IN ('kubernetes', 'api')),
    ADD COLUMN description text CHECK (description IS NULL OR length(description) <= 1000),
    ALTER COLUMN k8s_namespace DROP NOT NULL,
    ALTER COLUMN k8s_name DROP NOT NULL,
    ADD CONSTRAINT endpoints_identity CHECK (
        (managed_by = 'kubernetes') = (k8s_namespace IS NOT NULL AND k8s_name IS NOT NULL));
-- keyset pages of the endpoints API: by tenant, and by (tenant, consumer)
CREATE INDEX endpoints_tenant_page ON hookd.endpoints (tenant, id) WHERE removed_at IS NULL;
CREATE INDEX endpoints_consumer_page ON hookd.endpoints (tenant, consumer, id)
    WHERE removed_at IS NULL AND consumer IS NOT NULL;

-- The owner of a row is (tenant, consumer), and it never changes: deliveries follow the
-- row, so a row handed to another consumer would carry the first one's pending deliveries
-- and replays to the second one's receiver (the reason of migration 0006, one level down).
CREATE OR REPLACE FUNCTION hookd.endpoint_tenant_is_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'hookd: endpoint % belongs to tenant % and consumer %; its owner cannot change (a new owner gets a new endpoint)',
    OLD.id, quote_literal(OLD.tenant), coalesce(quote_literal(OLD.consumer), 'none') USING ERRCODE = '23514';
END
$$;
DROP TRIGGER endpoints_tenant_immutable ON hookd.endpoints;
CREATE TRIGGER endpoints_owner_immutable
  BEFORE UPDATE OF tenant, consumer ON hookd.endpoints
  FOR EACH ROW WHEN (OLD.tenant IS DISTINCT FROM NEW.tenant OR OLD.consumer IS DISTINCT FROM NEW.consumer)
  EXECUTE FUNCTION hookd.endpoint_tenant_is_immutable();

-- Events and deliveries carry the consumer they were addressed to, so that what a consumer
-- token may see is a column comparison, not a join.
ALTER TABLE hookd.events ADD COLUMN consumer text;
ALTER TABLE hookd.deliveries ADD COLUMN consumer text;

-- Listing messages newest first, keyset-paged on the UUIDv7 id (time-ordered): one index
-- range scan per page whatever the table's size.
CREATE INDEX events_tenant_page ON hookd.events (tenant, id);
CREATE INDEX events_consumer_page ON hookd.events (tenant, consumer, id) WHERE consumer IS NOT NULL;
CREATE INDEX events_type_page ON hookd.events (tenant, event_type, id);
-- an endpoint's deliveries, newest first
CREATE INDEX deliveries_endpoint_page ON hookd.deliveries (endpoint_id, id);

-- ---- Subscriptions: fan-out by index, not by scanning a tenant's endpoints ----
-- One row per (pattern of a live endpoint). An event of type a.b.c matches the patterns
-- a.b.c, *, a.*, a.b.* (hookd.event_type_keys), so fan-out is a handful of index probes on
-- (tenant, consumer, pattern) however many endpoints the tenant has. '' stands for "no
-- consumer" (a uid is never empty). Kept by the trigger below in the transaction that
-- changes the endpoint; disabled and removed endpoints have no rows.
CREATE TABLE hookd.subscriptions (
    tenant       text NOT NULL,
    consumer     text NOT NULL,
    pattern      text NOT NULL,
    endpoint_id  uuid NOT NULL REFERENCES hookd.endpoints (id) ON DELETE CASCADE,
    PRIMARY KEY (tenant, consumer, pattern, endpoint_id)
);
CREATE INDEX subscriptions_endpoint ON hookd.subscriptions (endpoint_id);

-- The patterns an event type matches, in the syntax of endpoints.event_types (see
-- hookd.event_type_matches, which this must agree with; a test compares them).
CREATE FUNCTION hookd.event_type_keys(event_type text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT ARRAY['*', event_type] || coalesce(
    (SELECT array_agg(array_to_string(p.parts[1:n], '.') || '.*')
     FROM (SELECT string_to_array(event_type, '.') AS parts) p,
          generate_series(1, cardinality(p.parts) - 1) AS n),
    '{}')
$$;

CREATE FUNCTION hookd.sync_subscriptions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    DELETE FROM hookd.subscriptions WHERE endpoint_id = OLD.id;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.state <> 'disabled' AND NEW.removed_at IS NULL THEN
    INSERT INTO hookd.subscriptions (tenant, consumer, pattern, endpoint_id)
    SELECT DISTINCT NEW.tenant, coalesce(NEW.consumer, ''), p, NEW.id
    FROM unnest(CASE WHEN cardinality(NEW.event_types) = 0 THEN ARRAY['*'] ELSE NEW.event_types END) AS p;
  END IF;
  RETURN NULL;
END
$$;
CREATE TRIGGER endpoints_subscriptions_ins
  AFTER INSERT ON hookd.endpoints
  FOR EACH ROW EXECUTE FUNCTION hookd.sync_subscriptions();
-- only when what fan-out depends on changes: circuit and statistics updates pay nothing
CREATE TRIGGER endpoints_subscriptions_upd
  AFTER UPDATE OF event_types, state, removed_at ON hookd.endpoints
  FOR EACH ROW
  WHEN (OLD.event_types IS DISTINCT FROM NEW.event_types
        OR (OLD.state = 'disabled') IS DISTINCT FROM (NEW.state = 'disabled')
        OR OLD.removed_at IS DISTINCT FROM NEW.removed_at)
  EXECUTE FUNCTION hookd.sync_subscriptions();

INSERT INTO hookd.subscriptions (tenant, consumer, pattern, endpoint_id)
SELECT DISTINCT e.tenant, '', p, e.id
FROM hookd.endpoints e,
     unnest(CASE WHEN cardinality(e.event_types) = 0 THEN ARRAY['*'] ELSE e.event_types END) AS p
WHERE e.state <> 'disabled' AND e.removed_at IS NULL;

DROP INDEX hookd.endpoints_tenant;

-- ---- Tokens: the manage scope, and tokens confined to one consumer ----
ALTER TABLE hookd.api_tokens
    DROP CONSTRAINT api_tokens_scopes_check,
    ADD CONSTRAINT api_tokens_scopes_check
        CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['produce', 'read', 'operate', 'manage']),
    ADD COLUMN consumer text CHECK (consumer IS NULL OR consumer ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$');
CREATE INDEX api_tokens_consumer ON hookd.api_tokens (tenant, consumer) WHERE consumer IS NOT NULL;

-- ---- hookd.enqueue with a consumer ----
-- The 5-argument form takes the consumer (NULL: tenant-wide). The 4-argument form stays,
-- with its grants, and calls it. The 5-argument one has no defaults, so a call with 3 or 4
-- arguments is never ambiguous between the two.
CREATE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text, consumer text)
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
  FROM (SELECT DISTINCT s.endpoint_id FROM hookd.subscriptions s
        WHERE s.tenant = enqueue.tenant AND s.consumer = coalesce(enqueue.consumer, '')
          AND s.pattern = ANY (hookd.event_type_keys(enqueue.event_type))) s;

  PERFORM pg_notify('hookd_deliveries', '');
  RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION hookd.enqueue(text, text, text, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text DEFAULT NULL)
RETURNS uuid
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT hookd.enqueue(tenant, event_type, payload, idempotency_key, NULL::text) $$;

-- Whoever may call the 4-argument form may call the 5-argument one.
DO $$
DECLARE r record;
BEGIN
  FOR r IN
    SELECT DISTINCT a.grantee::regrole::text AS role
    FROM pg_proc p, aclexplode(p.proacl) a
    WHERE p.oid = 'hookd.enqueue(text, text, text, text)'::regprocedure
      AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION hookd.enqueue(text, text, text, text, text) TO %s', r.role);
  END LOOP;
END
$$;
