-- hookd schema: Postgres is both the source of truth and the queue.
-- Everything lives in the `hookd` schema so a producer sharing the database can
-- call hookd.enqueue() inside its own transaction without name clashes.
CREATE SCHEMA IF NOT EXISTS hookd;

-- UUIDv7 in SQL (Postgres 15 has no uuidv7()): 48 bits of unix milliseconds over a
-- random v4, with the version bits set to 7. Delivery ids are minted in SQL during
-- fan-out, so the generator has to live here too.
CREATE FUNCTION hookd.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  SELECT encode(
    set_bit(set_bit(
      overlay(uuid_send(gen_random_uuid())
              placing substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
              FROM 1 FOR 6),
      52, 1), 53, 1),
    'hex')::uuid
$$;

CREATE TABLE hookd.endpoints (
    id                  uuid PRIMARY KEY,
    tenant              text NOT NULL,
    -- identity of the declaring object (WebhookEndpoint namespace/name, uid when it came
    -- from a cluster); `hookd apply` and the controller upsert on (namespace, name).
    k8s_namespace       text NOT NULL,
    k8s_name            text NOT NULL,
    k8s_uid             text,
    url                 text NOT NULL,
    event_types         text[] NOT NULL DEFAULT '{}',
    -- active: deliveries created and sent; paused: created and held; disabled: none created.
    state               text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'paused', 'disabled')),
    state_reason        text,
    timeout_ms          integer CHECK (timeout_ms IS NULL OR timeout_ms BETWEEN 100 AND 300000),
    max_attempts        integer CHECK (max_attempts IS NULL OR max_attempts BETWEEN 1 AND 100),
    retry_schedule_secs integer[],
    max_in_flight       integer CHECK (max_in_flight IS NULL OR max_in_flight BETWEEN 1 AND 10000),
    headers             jsonb NOT NULL DEFAULT '{}',
    secret_grace_secs   integer NOT NULL DEFAULT 86400 CHECK (secret_grace_secs >= 0),
    -- sha256 of the declared spec and desired state: an endpoint disabled by a 410 stays
    -- disabled until its declaration changes, rather than being re-enabled by every resync.
    spec_fingerprint    bytea,
    -- circuit breaker, shared by every dispatcher replica; mutated only by single
    -- atomic UPDATEs (never read-modify-write from Rust).
    circuit_state       text NOT NULL DEFAULT 'closed' CHECK (circuit_state IN ('closed', 'open', 'half_open')),
    circuit_failures    integer NOT NULL DEFAULT 0,
    circuit_open_until  timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (k8s_namespace, k8s_name)
);
CREATE INDEX endpoints_tenant ON hookd.endpoints (tenant) WHERE state <> 'disabled';

-- Several secrets per endpoint during a rotation: dispatchers sign with every secret
-- whose not_after is unset or in the future.
CREATE TABLE hookd.endpoint_secrets (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id   uuid NOT NULL REFERENCES hookd.endpoints (id) ON DELETE CASCADE,
    secret        text NOT NULL,
    -- sha256 of the secret, so "is this the secret we already have" needs no plaintext compare
    fingerprint   bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    not_after     timestamptz
);
CREATE INDEX endpoint_secrets_endpoint ON hookd.endpoint_secrets (endpoint_id);

CREATE TABLE hookd.events (
    id               uuid PRIMARY KEY,
    tenant           text NOT NULL,
    event_type       text NOT NULL,
    -- the producer's exact bytes (invariant 6): text, not jsonb, so key order,
    -- whitespace and big integers survive.
    payload          text NOT NULL,
    idempotency_key  text,
    -- sha256 over (event type, payload): a retried key with different content is a 409
    request_hash     bytea NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX events_idempotency ON hookd.events (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE hookd.deliveries (
    id                uuid PRIMARY KEY,
    event_id          uuid NOT NULL REFERENCES hookd.events (id) ON DELETE CASCADE,
    endpoint_id       uuid NOT NULL REFERENCES hookd.endpoints (id) ON DELETE CASCADE,
    tenant            text NOT NULL,
    status            text NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'in_progress', 'failed', 'succeeded', 'dead', 'cancelled')),
    attempts          integer NOT NULL DEFAULT 0,
    -- The single visibility column: when pending/failed it is the due time; while
    -- in_progress it is the lease expiry. A lapsed lease is therefore just a due row,
    -- and one index range scan finds both.
    visible_at        timestamptz NOT NULL DEFAULT now(),
    locked_by         uuid,
    last_status_code  integer,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    completed_at      timestamptz
);
-- The claim index. Its predicate is exactly the claim's status filter, so terminal
-- rows (the history) never enter it and the claim cost does not grow with them.
-- endpoint_id leads because claims walk endpoint by endpoint (per-endpoint caps,
-- open circuits skipped without touching their backlog).
CREATE INDEX deliveries_claimable ON hookd.deliveries (endpoint_id, visible_at)
    WHERE status IN ('pending', 'in_progress', 'failed');
CREATE INDEX deliveries_event ON hookd.deliveries (event_id);
-- replay by endpoint and time window; status pages
CREATE INDEX deliveries_endpoint_created ON hookd.deliveries (endpoint_id, created_at);

CREATE TABLE hookd.delivery_attempts (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id     uuid NOT NULL REFERENCES hookd.deliveries (id) ON DELETE CASCADE,
    attempt         integer NOT NULL,
    started_at      timestamptz NOT NULL,
    duration_ms     integer NOT NULL,
    status_code     integer,
    error_class     text,
    error           text,
    response_snippet text
);
CREATE INDEX delivery_attempts_delivery ON hookd.delivery_attempts (delivery_id, attempt);

CREATE TABLE hookd.dead_letters (
    delivery_id   uuid PRIMARY KEY REFERENCES hookd.deliveries (id) ON DELETE CASCADE,
    endpoint_id   uuid NOT NULL,
    tenant        text NOT NULL,
    reason        text NOT NULL,
    attempts      integer NOT NULL,
    dead_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_tenant ON hookd.dead_letters (tenant, dead_at, delivery_id);
CREATE INDEX dead_letters_endpoint ON hookd.dead_letters (endpoint_id, dead_at, delivery_id);

-- Event-type filter: empty list = every type; `prefix.*` = anything under prefix;
-- `*` = everything; otherwise exact.
CREATE FUNCTION hookd.event_type_matches(patterns text[], event_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT cardinality(patterns) = 0 OR EXISTS (
    SELECT 1 FROM unnest(patterns) AS p
    WHERE p = event_type
       OR p = '*'
       OR (right(p, 2) = '.*' AND starts_with(event_type, left(p, -1)))
  )
$$;

-- The real outbox: a producer sharing this database enqueues inside its own business
-- transaction. If that transaction rolls back, no event and no delivery exist; on
-- commit, the NOTIFY below wakes dispatchers (Postgres delivers it only at commit).
-- Same validation and fan-out rules as the HTTP API.
CREATE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text DEFAULT NULL)
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
  v_hash := sha256(convert_to(event_type || E'\n' || payload, 'UTF8'));

  IF idempotency_key IS NOT NULL THEN
    INSERT INTO hookd.events (id, tenant, event_type, payload, idempotency_key, request_hash)
    VALUES (hookd.uuid_v7(), enqueue.tenant, enqueue.event_type, enqueue.payload, enqueue.idempotency_key, v_hash)
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
      SELECT e.id, e.request_hash INTO v_id, v_existing_hash FROM hookd.events e
      WHERE e.tenant = enqueue.tenant AND e.idempotency_key = enqueue.idempotency_key;
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
