-- Operational events (issue 34): when an endpoint is disabled (its receiver answered 410,
-- an operator or its declaration disabled it), enabled again, its signing secret cannot
-- be opened, or its circuit has been open past a threshold, hookd emits an event of a
-- reserved type to the tenant's own endpoints that subscribe to it, through the same
-- outbox: in the transaction that made the change, signed, retried and replayable like
-- any other. The types, under the reserved `hookd.` prefix:
--
--   hookd.endpoint.disabled, hookd.endpoint.enabled, hookd.endpoint.secret_unreadable,
--   hookd.endpoint.circuit_open
--
-- A `hookd.` type reaches only endpoints that name it (`hookd.endpoint.*`, `hookd.*`, or
-- the type itself): an endpoint of every type (`eventTypes: []`) does not get them, and
-- they are the tenant's (no consumer), so a customer's endpoint never does. Producers
-- cannot enqueue `hookd.` types (the API answers 422; hookd.enqueue raises, migration
-- 0031).

-- When the circuit opened (NULL while closed), and when that opening was reported.
ALTER TABLE hookd.endpoints
    ADD COLUMN circuit_opened_at timestamptz,
    ADD COLUMN circuit_alerted_at timestamptz;
UPDATE hookd.endpoints SET circuit_opened_at = now() WHERE circuit_state <> 'closed';
-- The dispatchers' report of circuits open too long reads this, not every endpoint. Its
-- columns change only when a circuit moves, so the hot path's updates stay HOT.
CREATE INDEX endpoints_open_circuit ON hookd.endpoints (circuit_opened_at)
    WHERE circuit_state <> 'closed' AND circuit_alerted_at IS NULL;

-- Kept by a trigger, not by each statement that moves a circuit. Named to fire after
-- endpoints_new_url (BEFORE triggers fire in name order), which closes the circuit of a
-- new URL; `UPDATE OF` names url for that reason. The WHEN clause is evaluated in C: the
-- outcome batches' circuit updates, which set circuit_state on every row they touch, pay
-- nothing for rows whose circuit did not move.
CREATE FUNCTION hookd.endpoint_circuit_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.circuit_state = 'closed' THEN
        NEW.circuit_opened_at := NULL;
        NEW.circuit_alerted_at := NULL;
    ELSIF OLD.circuit_state = 'closed' THEN
        -- half_open <-> open keeps the time it first opened
        NEW.circuit_opened_at := now();
        NEW.circuit_alerted_at := NULL;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER endpoints_opened_circuit
    BEFORE UPDATE OF circuit_state, url ON hookd.endpoints
    FOR EACH ROW WHEN (OLD.circuit_state IS DISTINCT FROM NEW.circuit_state)
    EXECUTE FUNCTION hookd.endpoint_circuit_moved();

-- The reserved types, in any case (domain::is_reserved_event_type holds the same rule).
CREATE FUNCTION hookd.is_reserved_event_type(event_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT lower(event_type) = 'hookd' OR starts_with(lower(event_type), 'hookd.')
$$;

-- A source's prefix made its events' types; one made `hookd` before this migration (a
-- source named hookd took its name as the prefix) would make reserved types, which a
-- provider that signs no type header lets anyone choose. Such a source gets the prefix
-- `inbound.hookd`, and no source can have a reserved prefix from now on.
UPDATE hookd.sources SET event_type_prefix = 'inbound.' || event_type_prefix
WHERE hookd.is_reserved_event_type(event_type_prefix);
ALTER TABLE hookd.sources ADD CONSTRAINT sources_prefix_not_reserved
    CHECK (NOT hookd.is_reserved_event_type(event_type_prefix));

-- The fan-out rule (migration 0025) with the reserved types: they do not match the
-- all-types pattern `*`. Still inlined (plain SQL, STABLE; the function it calls is
-- IMMUTABLE and inlined in turn).
CREATE OR REPLACE FUNCTION hookd.subscribers(tenant text, consumer text, event_type text)
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
  WHERE k.pattern <> '*' OR NOT hookd.is_reserved_event_type(subscribers.event_type)
$$;

-- One operational event, for the tenant (no consumer), with its deliveries; nothing when
-- no endpoint of the tenant subscribes to the type.
-- `p_about` is the endpoint the event is about, which never gets its own.
CREATE FUNCTION hookd.emit_operational(p_tenant text, p_type text, p_payload jsonb, p_about uuid)
RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_id uuid;
  v_payload text := p_payload::text;
  v_to uuid[];
BEGIN
  SELECT array_agg(s.endpoint_id) INTO v_to
  FROM hookd.subscribers(p_tenant, NULL, p_type) AS s(endpoint_id)
  WHERE s.endpoint_id <> p_about;
  IF v_to IS NULL THEN
    RETURN NULL;
  END IF;
  INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash)
  VALUES (hookd.uuid_v7(), p_tenant, p_type, v_payload,
          sha256(convert_to(p_type || E'\n' || v_payload, 'UTF8')))
  RETURNING id INTO v_id;
  INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant)
  SELECT hookd.uuid_v7(), v_id, t.endpoint_id, p_tenant
  FROM unnest(v_to) AS t(endpoint_id);
  PERFORM pg_notify('hookd_deliveries', '');
  RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION hookd.emit_operational(text, text, jsonb, uuid) FROM PUBLIC;

-- A storm guard: at most 10 operational events per endpoint per hour. A customer can
-- flap its own endpoint (a receiver answering 410, re-enabled in a loop through the
-- portal), and each flap would otherwise be two events to the tenant's alerting; the
-- 10th says the endpoint goes quiet until its hour is over (`quietUntil`).
CREATE TABLE hookd.operational_budget (
    endpoint_id  uuid PRIMARY KEY REFERENCES hookd.endpoints (id) ON DELETE CASCADE,
    window_start timestamptz NOT NULL,
    sent         integer NOT NULL
);

CREATE FUNCTION hookd.endpoint_operational() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  v_type text;
  v_reason text;
  v_sent integer;
  v_window timestamptz;
BEGIN
  IF NEW.state = 'disabled' AND OLD.state <> 'disabled' THEN
    v_type := 'hookd.endpoint.disabled';
    v_reason := NEW.state_reason;
  ELSIF OLD.state = 'disabled' AND NEW.state <> 'disabled' THEN
    v_type := 'hookd.endpoint.enabled';
  ELSIF NEW.secret_unreadable IS NOT NULL AND OLD.secret_unreadable IS NULL THEN
    v_type := 'hookd.endpoint.secret_unreadable';
    v_reason := NEW.secret_unreadable;
  ELSIF NEW.circuit_alerted_at IS NOT NULL AND OLD.circuit_alerted_at IS NULL THEN
    v_type := 'hookd.endpoint.circuit_open';
    v_reason := 'the circuit has been open since ' || to_char(NEW.circuit_opened_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                || ' after ' || NEW.circuit_failures || ' consecutive failures';
  ELSE
    RETURN NULL;
  END IF;
  INSERT INTO hookd.operational_budget AS b (endpoint_id, window_start, sent)
  VALUES (NEW.id, now(), 1)
  ON CONFLICT (endpoint_id) DO UPDATE
  SET window_start = CASE WHEN b.window_start <= now() - interval '1 hour' THEN now() ELSE b.window_start END,
      sent = CASE WHEN b.window_start <= now() - interval '1 hour' THEN 1 ELSE b.sent + 1 END
  RETURNING b.sent, b.window_start INTO v_sent, v_window;
  IF v_sent > 10 THEN
    RETURN NULL;
  END IF;
  PERFORM hookd.emit_operational(NEW.tenant, v_type, jsonb_build_object(
    'type', v_type,
    'endpointId', NEW.id,
    'consumer', NEW.consumer,
    'url', NEW.url,
    'description', NEW.description,
    'state', NEW.state,
    'reason', v_reason,
    'circuitOpenedAt', NEW.circuit_opened_at,
    'kubernetes', CASE WHEN NEW.k8s_namespace IS NULL THEN NULL
                       ELSE jsonb_build_object('namespace', NEW.k8s_namespace, 'name', NEW.k8s_name) END,
    'quietUntil', CASE WHEN v_sent = 10 THEN v_window + interval '1 hour' END,
    'at', now()), NEW.id);
  RETURN NULL;
END
$$;
-- Deletions (removed_at set) are not operational events: the owner did them.
CREATE TRIGGER endpoints_operational
    AFTER UPDATE ON hookd.endpoints
    FOR EACH ROW WHEN (NEW.removed_at IS NULL AND (
        (OLD.state = 'disabled') <> (NEW.state = 'disabled')
        OR (OLD.secret_unreadable IS NULL AND NEW.secret_unreadable IS NOT NULL)
        OR (OLD.circuit_alerted_at IS NULL AND NEW.circuit_alerted_at IS NOT NULL)))
    EXECUTE FUNCTION hookd.endpoint_operational();

