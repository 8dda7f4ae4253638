-- hookd's schema after every migration in migrations/, as pg_dump (PostgreSQL 15)
-- prints it from a freshly migrated database, without the history days (named by date).
-- Generated, do not edit: HOOKD_UPDATE_DOCS=1 cargo nextest run -E 'test(schema_snapshot)'
-- rewrites it; a test fails when it and the migrations differ.
--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: hookd; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA hookd;


--
-- Name: deliveries_queue_insert(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.deliveries_queue_insert() RETURNS trigger
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
  ids uuid[];
  dues timestamptz[];
BEGIN
  SELECT array_agg(x.endpoint_id), array_agg(x.due) INTO ids, dues FROM (
    SELECT n.endpoint_id, min(n.visible_at) AS due FROM new_rows n
    WHERE n.status IN ('pending', 'in_progress', 'failed')
      AND n.visible_at < hookd.ordering_waiting()
    GROUP BY n.endpoint_id
  ) x;
  IF ids IS NOT NULL THEN
    PERFORM hookd.endpoint_queue_wake(ids, dues);
  END IF;
  INSERT INTO hookd.ordering_advances (endpoint_id, ordering_key)
  SELECT DISTINCT n.endpoint_id, n.ordering_key FROM new_rows n
  WHERE n.ordering_key IS NOT NULL AND n.visible_at = hookd.ordering_waiting();
  RETURN NULL;
END
$$;


--
-- Name: deliveries_queue_update(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.deliveries_queue_update() RETURNS trigger
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
  ids uuid[];
  dues timestamptz[];
  raise_ids uuid[];
  served_ids uuid[];
  keyed boolean;
BEGIN
  WITH pair AS MATERIALIZED (
    SELECT * FROM (
      SELECT r.id, r.is_new, r.endpoint_id, r.status, r.visible_at, r.claim_token, r.ordering_key,
             lag(r.endpoint_id) OVER w AS old_endpoint_id,
             lag(r.status) OVER w AS old_status,
             lag(r.visible_at) OVER w AS old_visible_at,
             lag(r.claim_token) OVER w AS old_claim_token
      FROM (
        SELECT o.id, o.endpoint_id, o.status, o.visible_at, o.claim_token, o.ordering_key, false AS is_new
        FROM old_rows o
        UNION ALL
        SELECT n.id, n.endpoint_id, n.status, n.visible_at, n.claim_token, n.ordering_key, true
        FROM new_rows n
      ) r
      WINDOW w AS (PARTITION BY r.id ORDER BY r.is_new)
    ) x
    WHERE x.is_new
  ), earlier AS (
    -- rows that became claimable or due earlier: the entry must not be later than them
    -- (a row waiting in its key's line is neither)
    SELECT p.endpoint_id, min(p.visible_at) AS due
    FROM pair p
    WHERE p.status IN ('pending', 'in_progress', 'failed')
      AND p.visible_at < hookd.ordering_waiting()
      AND (p.old_status NOT IN ('pending', 'in_progress', 'failed') OR p.visible_at < p.old_visible_at
           OR p.endpoint_id <> p.old_endpoint_id)
    GROUP BY p.endpoint_id
  ), later AS (
    -- rows that left the queue, were claimed, or are due later: the entry may be later now
    SELECT array_agg(DISTINCT p.old_endpoint_id) AS raise_ids,
           array_agg(DISTINCT p.old_endpoint_id) FILTER (
             WHERE p.status = 'in_progress' AND p.claim_token IS DISTINCT FROM p.old_claim_token)
             AS served_ids
    FROM pair p
    WHERE p.old_status IN ('pending', 'in_progress', 'failed')
      AND (p.status NOT IN ('pending', 'in_progress', 'failed') OR p.visible_at > p.old_visible_at
           OR p.claim_token IS DISTINCT FROM p.old_claim_token OR p.endpoint_id <> p.old_endpoint_id)
  ), ordered AS MATERIALIZED (
    SELECT * FROM pair p WHERE p.ordering_key IS NOT NULL
  ), held AS (
    -- a keyed delivery that died holds its key where the endpoint says so; the first
    -- dead one keeps the hold
    INSERT INTO hookd.ordering_holds (endpoint_id, ordering_key, delivery_id)
    SELECT DISTINCT ON (o.endpoint_id, o.ordering_key) o.endpoint_id, o.ordering_key, o.id
    FROM ordered o JOIN hookd.endpoints e ON e.id = o.endpoint_id
    WHERE o.status = 'dead' AND o.old_status <> 'dead'
      AND e.ordering = 'perKey' AND e.on_dead_letter = 'hold'
    ORDER BY o.endpoint_id, o.ordering_key, o.id
    ON CONFLICT (endpoint_id, ordering_key) DO NOTHING
  ), released AS (
    -- replaying the dead delivery that holds its key releases it
    DELETE FROM hookd.ordering_holds h USING ordered o
    WHERE o.old_status = 'dead' AND o.status <> 'dead'
      AND h.endpoint_id = o.endpoint_id AND h.ordering_key = o.ordering_key AND h.delivery_id = o.id
  ), advanced AS (
    INSERT INTO hookd.ordering_advances (endpoint_id, ordering_key)
    SELECT DISTINCT o.endpoint_id, o.ordering_key FROM ordered o
    WHERE (o.old_status IN ('pending', 'in_progress', 'failed')
           AND o.status NOT IN ('pending', 'in_progress', 'failed'))
       OR (o.visible_at = hookd.ordering_waiting()
           AND (o.old_visible_at <> hookd.ordering_waiting()
                OR o.old_status NOT IN ('pending', 'in_progress', 'failed')))
  )
  SELECT e.ids, e.dues, l.raise_ids, l.served_ids INTO ids, dues, raise_ids, served_ids
  FROM (SELECT array_agg(endpoint_id) AS ids, array_agg(due) AS dues FROM earlier) e, later l;
  IF ids IS NOT NULL THEN
    PERFORM hookd.endpoint_queue_wake(ids, dues);
  END IF;
  IF raise_ids IS NOT NULL THEN
    PERFORM hookd.endpoint_queue_refresh(raise_ids, coalesce(served_ids, '{}'));
  END IF;
  RETURN NULL;
END
$$;


--
-- Name: emit_operational(text, text, jsonb, uuid); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.emit_operational(p_tenant text, p_type text, p_payload jsonb, p_about uuid) RETURNS uuid
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: endpoint_circuit_moved(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_circuit_moved() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: endpoint_hold(text, text, timestamp with time zone); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_hold(state text, circuit_state text, circuit_open_until timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
  SELECT CASE WHEN state <> 'active' THEN 'infinity'::timestamptz
              -- an open circuit without an end is never probed (as before this migration)
              WHEN circuit_state <> 'closed' THEN coalesce(circuit_open_until, 'infinity'::timestamptz)
         END
$$;


--
-- Name: endpoint_hold(text, text, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_hold(state text, circuit_state text, circuit_open_until timestamp with time zone, rate_wait_until timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
  SELECT greatest(hookd.endpoint_hold(state, circuit_state, circuit_open_until), rate_wait_until)
$$;


--
-- Name: endpoint_new_url(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_new_url() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.circuit_state := 'closed';
    NEW.circuit_failures := 0;
    NEW.circuit_open_until := NULL;
    NEW.config_version := OLD.config_version + 1;
    RETURN NEW;
END
$$;


--
-- Name: endpoint_operational(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_operational() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: endpoint_ordering_changed(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_ordering_changed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  IF NEW.ordering = 'none' THEN
    UPDATE hookd.deliveries d SET visible_at = now(), updated_at = now()
    WHERE d.endpoint_id = NEW.id AND d.status IN ('pending', 'in_progress', 'failed')
      AND d.ordering_key IS NOT NULL AND d.visible_at = hookd.ordering_waiting();
    DELETE FROM hookd.ordering_holds WHERE endpoint_id = NEW.id;
  ELSIF NEW.on_dead_letter = 'continue' THEN
    WITH h AS (
      DELETE FROM hookd.ordering_holds WHERE endpoint_id = NEW.id
      RETURNING endpoint_id, ordering_key
    )
    INSERT INTO hookd.ordering_advances (endpoint_id, ordering_key)
    SELECT endpoint_id, ordering_key FROM h;
  END IF;
  RETURN NULL;
END
$$;


--
-- Name: endpoint_ordering_gone(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_ordering_gone() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  DELETE FROM hookd.ordering_holds h USING old_rows o WHERE h.endpoint_id = o.id;
  RETURN NULL;
END
$$;


--
-- Name: endpoint_queue_recheck(integer); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_queue_recheck(batch integer) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
  ids uuid[];
  n int;
BEGIN
  WITH r AS (
    DELETE FROM hookd.endpoint_rechecks
    WHERE id = ANY (ARRAY(SELECT id FROM hookd.endpoint_rechecks ORDER BY id LIMIT batch
                          FOR UPDATE SKIP LOCKED))
    RETURNING endpoint_id
  )
  SELECT coalesce(array_agg(DISTINCT endpoint_id), '{}'), count(*) INTO ids, n FROM r;
  IF cardinality(ids) > 0 THEN
    PERFORM hookd.endpoint_queue_refresh(ids, '{}');
  END IF;
  RETURN n;
END
$$;


--
-- Name: endpoint_queue_refresh(uuid[], uuid[]); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_queue_refresh(ids uuid[], served uuid[]) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
  locked uuid[];
BEGIN
  SELECT coalesce(array_agg(l.endpoint_id), '{}') INTO locked FROM (
    SELECT q.endpoint_id FROM hookd.endpoint_queue q
    WHERE q.endpoint_id = ANY (ids)
    ORDER BY q.endpoint_id
    FOR UPDATE SKIP LOCKED
  ) l;
  -- (locked holds distinct ids that are all in ids: as many means all of them)
  IF cardinality(locked) < cardinality(ids) THEN
    -- entries another transaction holds: refreshed again once this one commits
    INSERT INTO hookd.endpoint_rechecks (endpoint_id)
    SELECT q.endpoint_id FROM hookd.endpoint_queue q
    WHERE q.endpoint_id = ANY (ids) AND q.endpoint_id <> ALL (locked);
  END IF;
  IF cardinality(locked) = 0 THEN
    RETURN;
  END IF;
  -- a new statement, so a new snapshot (read committed): see migration 0008
  WITH m AS (
    SELECT l.id, (SELECT d.visible_at FROM hookd.deliveries d
                  WHERE d.endpoint_id = l.id AND d.status IN ('pending', 'in_progress', 'failed')
                    AND d.visible_at < hookd.ordering_waiting()
                  ORDER BY d.visible_at LIMIT 1) AS due
    FROM unnest(locked) AS l(id)
  ), gone AS (
    -- an array, not a join: one index scan whatever the estimates (see above)
    DELETE FROM hookd.endpoint_queue q
    WHERE q.endpoint_id = ANY (ARRAY(SELECT m.id FROM m WHERE m.due IS NULL))
  )
  UPDATE hookd.endpoint_queue q
  SET due_at = m.due,
      served_at = CASE WHEN q.endpoint_id = ANY (served) THEN now() ELSE q.served_at END
  FROM m
  WHERE q.endpoint_id = m.id AND q.endpoint_id = ANY (locked) AND m.due IS NOT NULL
    AND (q.due_at IS DISTINCT FROM m.due OR q.endpoint_id = ANY (served));
END
$$;


--
-- Name: endpoint_queue_tenants(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_queue_tenants() RETURNS SETOF text
    LANGUAGE sql STABLE
    AS $$
  WITH RECURSIVE t AS (
    (SELECT q.tenant FROM hookd.endpoint_queue q ORDER BY q.tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT q.tenant FROM hookd.endpoint_queue q
            WHERE q.tenant > t.tenant ORDER BY q.tenant LIMIT 1)
    FROM t WHERE t.tenant IS NOT NULL
  )
  SELECT t.tenant FROM t WHERE t.tenant IS NOT NULL
$$;


--
-- Name: endpoint_queue_wake(uuid[], timestamp with time zone[]); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_queue_wake(ids uuid[], dues timestamp with time zone[]) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
  pinned uuid[];
BEGIN
  SELECT coalesce(array_agg(p.endpoint_id), '{}') INTO pinned FROM (
    SELECT q.endpoint_id
    FROM hookd.endpoint_queue q
    JOIN unnest(ids, dues) AS i(id, due) ON q.endpoint_id = i.id
    WHERE q.endpoint_id = ANY (ids) AND q.due_at <= i.due
    ORDER BY q.endpoint_id
    FOR KEY SHARE OF q
  ) p;
  INSERT INTO hookd.endpoint_wakeups (endpoint_id, due_at)
  SELECT i.id, i.due FROM unnest(ids, dues) AS i(id, due)
  WHERE i.id <> ALL (pinned);
END
$$;


--
-- Name: endpoint_tenant_is_immutable(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoint_tenant_is_immutable() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  RAISE EXCEPTION 'hookd: endpoint % belongs to tenant % and consumer %; its owner cannot change (a new owner gets a new endpoint)',
    OLD.id, quote_literal(OLD.tenant), coalesce(quote_literal(OLD.consumer), 'none') USING ERRCODE = '23514';
END
$$;


--
-- Name: endpoints_queue_gone(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoints_queue_gone() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  DELETE FROM hookd.endpoint_queue q USING gone g WHERE q.endpoint_id = g.id;
  RETURN NULL;
END
$$;


--
-- Name: endpoints_queue_hold(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.endpoints_queue_hold() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  IF OLD.state IS NOT DISTINCT FROM NEW.state
     AND OLD.circuit_state IS NOT DISTINCT FROM NEW.circuit_state
     AND OLD.circuit_open_until IS NOT DISTINCT FROM NEW.circuit_open_until
     AND OLD.rate_per_second IS NOT DISTINCT FROM NEW.rate_per_second
     AND OLD.rate_burst IS NOT DISTINCT FROM NEW.rate_burst THEN
    UPDATE hookd.endpoint_queue q
    SET hold_until = hookd.endpoint_hold(NEW.state, NEW.circuit_state, NEW.circuit_open_until,
                                         NEW.rate_wait_until)
    WHERE q.endpoint_id = (SELECT l.endpoint_id FROM hookd.endpoint_queue l
                           WHERE l.endpoint_id = NEW.id FOR UPDATE SKIP LOCKED);
    RETURN NULL;
  END IF;
  UPDATE hookd.endpoint_queue q
  SET hold_until = hookd.endpoint_hold(NEW.state, NEW.circuit_state, NEW.circuit_open_until,
                                       NEW.rate_wait_until)
  WHERE q.endpoint_id = NEW.id
    AND q.hold_until IS DISTINCT FROM hookd.endpoint_hold(NEW.state, NEW.circuit_state,
                                                          NEW.circuit_open_until,
                                                          NEW.rate_wait_until);
  RETURN NULL;
END
$$;


--
-- Name: enqueue(text, text, text, text); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text DEFAULT NULL::text) RETURNS uuid
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT hookd.enqueue(tenant, event_type, payload, idempotency_key, NULL::text) $$;


--
-- Name: enqueue(text, text, text, text, text); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text, consumer text) RETURNS uuid
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT hookd.enqueue(tenant, event_type, payload, idempotency_key, consumer, NULL::text) $$;


--
-- Name: enqueue(text, text, text, text, text, text); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text, consumer text, ordering_key text) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $_$
#variable_conflict use_column
DECLARE
  v_id   uuid;
  v_hash bytea;
  v_existing_hash bytea;
  v_traceparent text;
  v_tracestate text;
  v_seq bigint;
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
  -- the API's rule (domain::validate_ordering_key)
  IF ordering_key IS NOT NULL AND (length(ordering_key) NOT BETWEEN 1 AND 256 OR ordering_key ~ '[[:cntrl:]]') THEN
    RAISE EXCEPTION 'hookd.enqueue: invalid ordering key %: 1-256 characters, no control characters', quote_literal(left(ordering_key, 300))
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
  -- the consumer and the ordering key are part of what a key stands for (the API hashes
  -- the same way, outbox::request_hash; a consumer never starts with '#')
  v_hash := sha256(convert_to(event_type || E'\n' || payload
                              || CASE WHEN consumer IS NULL THEN '' ELSE E'\n' || consumer END
                              || CASE WHEN ordering_key IS NULL THEN '' ELSE E'\n#' || ordering_key END, 'UTF8'));

  IF ordering_key IS NOT NULL THEN
    -- the key's line, shared with the API's committers and replays (db::events::lock_keys)
    PERFORM pg_advisory_xact_lock(hookd.ordering_lock_id(enqueue.tenant, enqueue.ordering_key));
    v_seq := nextval('hookd.ordering_seq');
  END IF;

  IF idempotency_key IS NOT NULL THEN
    -- the key's claim, shared with the API's committers (db::events::try_lock_keys)
    PERFORM pg_advisory_xact_lock(hashtextextended(enqueue.tenant || E'\n' || enqueue.idempotency_key, 0));
    INSERT INTO hookd.events (id, tenant, event_type, payload, idempotency_key, request_hash, consumer,
                              traceparent, tracestate, ordering_key, ordering_seq)
    VALUES (hookd.uuid_v7(), enqueue.tenant, enqueue.event_type, enqueue.payload, enqueue.idempotency_key, v_hash, enqueue.consumer,
            v_traceparent, v_tracestate, enqueue.ordering_key, v_seq)
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
                              traceparent, tracestate, ordering_key, ordering_seq)
    VALUES (hookd.uuid_v7(), enqueue.tenant, enqueue.event_type, enqueue.payload, v_hash, enqueue.consumer,
            v_traceparent, v_tracestate, enqueue.ordering_key, v_seq)
    RETURNING id INTO v_id;
  END IF;

  IF ordering_key IS NULL THEN
    INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, consumer)
    SELECT hookd.uuid_v7(), v_id, s.endpoint_id, enqueue.tenant, enqueue.consumer
    FROM hookd.subscribers(enqueue.tenant, enqueue.consumer, enqueue.event_type) AS s(endpoint_id);
  ELSE
    INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, consumer, ordering_key, ordering_seq, visible_at)
    SELECT hookd.uuid_v7(), v_id, s.endpoint_id, enqueue.tenant, enqueue.consumer, o.k, CASE WHEN o.k IS NOT NULL THEN v_seq END,
           CASE WHEN o.k IS NOT NULL AND hookd.ordering_blocked(s.endpoint_id, o.k)
                THEN hookd.ordering_waiting() ELSE now() END
    FROM hookd.subscribers(enqueue.tenant, enqueue.consumer, enqueue.event_type) AS s(endpoint_id)
    LEFT JOIN LATERAL (SELECT enqueue.ordering_key AS k FROM hookd.endpoints e
                       WHERE e.id = s.endpoint_id AND e.ordering = 'perKey') o ON true;
  END IF;

  PERFORM pg_notify('hookd_deliveries', '');
  RETURN v_id;
END
$_$;


--
-- Name: event_type_keys(text); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.event_type_keys(event_type text) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
  SELECT ARRAY['*', event_type] || coalesce(
    (SELECT array_agg(array_to_string(p.parts[1:n], '.') || '.*')
     FROM (SELECT string_to_array(event_type, '.') AS parts) p,
          generate_series(1, cardinality(p.parts) - 1) AS n),
    '{}')
$$;


--
-- Name: event_type_matches(text[], text); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.event_type_matches(patterns text[], event_type text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
  SELECT cardinality(patterns) = 0 OR EXISTS (
    SELECT 1 FROM unnest(patterns) AS p
    WHERE p = event_type
       OR p = '*'
       OR (right(p, 2) = '.*' AND starts_with(event_type, left(p, -1)))
  )
$$;


--
-- Name: event_type_new_version(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.event_type_new_version() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.version := nextval('hookd.event_type_versions');
    RETURN NEW;
END
$$;


--
-- Name: history_cascade_endpoints(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.history_cascade_endpoints() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  DELETE FROM hookd.delivery_history h USING gone g WHERE h.endpoint_id = g.id;
  RETURN NULL;
END
$$;


--
-- Name: history_day_create(date); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.history_day_create(day date) RETURNS boolean
    LANGUAGE plpgsql
    AS $_$
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
$_$;


--
-- Name: history_days_ensure(integer); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.history_days_ensure(ahead integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: is_reserved_event_type(text); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.is_reserved_event_type(event_type text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
  SELECT lower(event_type) = 'hookd' OR starts_with(lower(event_type), 'hookd.')
$$;


--
-- Name: ordering_advance(integer); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.ordering_advance(batch integer) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
  n int;
  eps uuid[];
  keys text[];
  moved bigint;
BEGIN
  WITH a AS (
    DELETE FROM hookd.ordering_advances
    WHERE id = ANY (ARRAY(SELECT id FROM hookd.ordering_advances ORDER BY id LIMIT batch
                          FOR UPDATE SKIP LOCKED))
    RETURNING endpoint_id, ordering_key
  ), k AS MATERIALIZED (
    SELECT endpoint_id, ordering_key,
           pg_try_advisory_xact_lock(hashtextextended(endpoint_id::text || E'\n' || ordering_key, 2)) AS mine
    FROM (SELECT DISTINCT endpoint_id, ordering_key FROM a ORDER BY 1, 2) d
  ), busy AS (
    -- a line another call is moving: look again at the next call
    INSERT INTO hookd.ordering_advances (endpoint_id, ordering_key)
    SELECT endpoint_id, ordering_key FROM k WHERE NOT mine
  )
  SELECT coalesce(array_agg(endpoint_id) FILTER (WHERE mine), '{}'),
         coalesce(array_agg(ordering_key) FILTER (WHERE mine), '{}'),
         (SELECT count(*) FROM a)
    INTO eps, keys, n
  FROM k;
  IF cardinality(eps) = 0 THEN
    RETURN n;
  END IF;
  -- a new statement, so a new snapshot (read committed), taken with the lines locked
  WITH k AS (
    SELECT * FROM unnest(eps, keys) AS k(endpoint_id, ordering_key)
  ), cand AS MATERIALIZED (
    SELECT k.endpoint_id, k.ordering_key,
           (SELECT d.id FROM hookd.deliveries d
            WHERE d.endpoint_id = k.endpoint_id AND d.ordering_key = k.ordering_key
              AND d.status IN ('pending', 'in_progress', 'failed')
              AND d.visible_at = hookd.ordering_waiting()
            -- one delivery per event and endpoint, so the sequence alone orders a line
            ORDER BY d.ordering_seq LIMIT 1) AS id
    FROM k
    WHERE NOT EXISTS (SELECT 1 FROM hookd.deliveries d
                      WHERE d.endpoint_id = k.endpoint_id AND d.ordering_key = k.ordering_key
                        AND d.status IN ('pending', 'in_progress', 'failed')
                        AND d.visible_at < hookd.ordering_waiting())
      AND NOT EXISTS (SELECT 1 FROM hookd.ordering_holds h
                      WHERE h.endpoint_id = k.endpoint_id AND h.ordering_key = k.ordering_key
                        -- an endpoint that no longer holds keys is not held
                        AND EXISTS (SELECT 1 FROM hookd.endpoints e
                                    WHERE e.id = h.endpoint_id AND e.on_dead_letter = 'hold'))
  ), locked AS (
    -- Locked without waiting, and checked again on the latest version: a row cancelled
    -- meanwhile is no longer waiting and is left.
    SELECT d.id FROM hookd.deliveries d
    WHERE d.id = ANY (ARRAY(SELECT id FROM cand WHERE id IS NOT NULL))
      AND d.status IN ('pending', 'in_progress', 'failed')
      AND d.visible_at = hookd.ordering_waiting()
    ORDER BY d.id
    FOR UPDATE OF d SKIP LOCKED
  ), promoted AS (
    UPDATE hookd.deliveries d SET visible_at = now(), updated_at = now()
    WHERE d.id = ANY (ARRAY(SELECT id FROM locked)) AND d.status IN ('pending', 'in_progress', 'failed')
    RETURNING d.id
  ), again AS (
    -- a candidate someone else holds (a replay, a cancellation): look again next time
    INSERT INTO hookd.ordering_advances (endpoint_id, ordering_key)
    SELECT c.endpoint_id, c.ordering_key FROM cand c
    WHERE c.id IS NOT NULL AND c.id <> ALL (ARRAY(SELECT id FROM locked))
  )
  SELECT count(*) INTO moved FROM promoted;
  RETURN n;
END
$$;


--
-- Name: ordering_blocked(uuid, text); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.ordering_blocked(p_endpoint uuid, p_key text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
  SELECT EXISTS (SELECT 1 FROM hookd.deliveries d
                 WHERE d.endpoint_id = p_endpoint AND d.ordering_key = p_key
                   AND d.status IN ('pending', 'in_progress', 'failed')
                   AND d.visible_at < hookd.ordering_waiting())
      OR EXISTS (SELECT 1 FROM hookd.deliveries d
                 WHERE d.endpoint_id = p_endpoint AND d.ordering_key = p_key
                   AND d.status IN ('pending', 'in_progress', 'failed')
                   AND d.visible_at = hookd.ordering_waiting())
      OR EXISTS (SELECT 1 FROM hookd.ordering_holds h
                 WHERE h.endpoint_id = p_endpoint AND h.ordering_key = p_key)
$$;


--
-- Name: ordering_lock_id(text, text); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.ordering_lock_id(p_tenant text, p_key text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT hashtextextended(p_tenant || E'\n' || p_key, 1) $$;


--
-- Name: ordering_replay_at(uuid, text); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.ordering_replay_at(p_endpoint uuid, p_key text) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    AS $$
  SELECT CASE WHEN p_key IS NOT NULL
                   AND EXISTS (SELECT 1 FROM hookd.endpoints e
                               WHERE e.id = p_endpoint AND e.ordering = 'perKey')
              THEN hookd.ordering_waiting() ELSE now() END
$$;


--
-- Name: ordering_waiting(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.ordering_waiting() RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT timestamptz '9999-12-31 00:00:00+00' $$;


--
-- Name: rate_tokens(double precision, integer, double precision, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.rate_tokens(per_second double precision, burst integer, tokens double precision, since timestamp with time zone, at_time timestamp with time zone) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
  SELECT least(burst::double precision,
               coalesce(tokens, burst::double precision)
               + greatest(0, extract(epoch FROM at_time - coalesce(since, at_time)))::double precision
                 * per_second)
$$;


--
-- Name: rate_wait(double precision, integer, double precision, timestamp with time zone); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.rate_wait(per_second double precision, burst integer, "left" double precision, at_time timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
  SELECT CASE WHEN "left" >= 1 THEN NULL
              ELSE at_time + make_interval(secs =>
                     (least(burst::double precision, greatest(1, per_second * 0.05)) - "left")
                     / per_second + 0.001)
         END
$$;


--
-- Name: revoke_sessions(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.revoke_sessions() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    -- one level here; the UPDATE fires this trigger again for sessions of sessions
    UPDATE hookd.api_tokens SET revoked_at = NEW.revoked_at
    WHERE parent_id = NEW.id AND revoked_at IS NULL;
    RETURN NULL;
END
$$;


--
-- Name: sources_changed(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.sources_changed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('hookd_sources', '');
    RETURN NULL;
END
$$;


--
-- Name: subscribers(text, text, text); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.subscribers(tenant text, consumer text, event_type text) RETURNS SETOF uuid
    LANGUAGE sql STABLE
    AS $$
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


--
-- Name: sync_subscriptions(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.sync_subscriptions() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: uuid_v7(); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.uuid_v7() RETURNS uuid
    LANGUAGE sql PARALLEL SAFE
    AS $$
  SELECT encode(
    set_bit(set_bit(
      overlay(uuid_send(gen_random_uuid())
              placing substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
              FROM 1 FOR 6),
      52, 1), 53, 1),
    'hex')::uuid
$$;


--
-- Name: uuid_v7_floor(bigint); Type: FUNCTION; Schema: hookd; Owner: -
--

CREATE FUNCTION hookd.uuid_v7_floor(ms bigint) RETURNS uuid
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
  SELECT (lpad(to_hex(ms), 12, '0') || '00000000000000000000')::uuid
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: api_tokens; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.api_tokens (
    id uuid NOT NULL,
    token_hash bytea NOT NULL,
    prefix text NOT NULL,
    tenant text NOT NULL,
    scopes text[] NOT NULL,
    name text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone,
    revoked_at timestamp with time zone,
    consumer text,
    consumer_generation bigint,
    parent_id uuid,
    CONSTRAINT api_tokens_consumer_check CHECK (((consumer IS NULL) OR (consumer ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'::text))),
    CONSTRAINT api_tokens_name_check CHECK (((name IS NULL) OR (length(name) <= 200))),
    CONSTRAINT api_tokens_scopes_check CHECK (((cardinality(scopes) > 0) AND (scopes <@ ARRAY['produce'::text, 'read'::text, 'operate'::text, 'manage'::text]))),
    CONSTRAINT api_tokens_tenant_check CHECK ((tenant ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'::text)),
    CONSTRAINT api_tokens_token_hash_check CHECK ((length(token_hash) = 32))
);


--
-- Name: consumer_deletions; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.consumer_deletions (
    id uuid NOT NULL,
    tenant text NOT NULL,
    uid text NOT NULL,
    generation bigint NOT NULL,
    phase text DEFAULT 'endpoints'::text NOT NULL,
    cursor_id uuid,
    tokens_revoked bigint DEFAULT 0 NOT NULL,
    endpoints_disabled bigint DEFAULT 0 NOT NULL,
    deliveries_cancelled bigint DEFAULT 0 NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    completed_at timestamp with time zone,
    CONSTRAINT consumer_deletions_phase_check CHECK ((phase = ANY (ARRAY['endpoints'::text, 'deliveries'::text, 'done'::text])))
);


--
-- Name: consumer_generations; Type: SEQUENCE; Schema: hookd; Owner: -
--

CREATE SEQUENCE hookd.consumer_generations
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: consumers; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.consumers (
    tenant text NOT NULL,
    uid text NOT NULL,
    name text,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    generation bigint DEFAULT nextval('hookd.consumer_generations'::regclass) NOT NULL,
    CONSTRAINT consumers_metadata_check CHECK ((jsonb_typeof(metadata) = 'object'::text)),
    CONSTRAINT consumers_name_check CHECK (((name IS NULL) OR (length(name) <= 200))),
    CONSTRAINT consumers_tenant_check CHECK ((tenant ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'::text)),
    CONSTRAINT consumers_uid_check CHECK ((uid ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'::text))
);


--
-- Name: dead_letters; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.dead_letters (
    delivery_id uuid NOT NULL,
    endpoint_id uuid NOT NULL,
    tenant text NOT NULL,
    reason text NOT NULL,
    attempts integer NOT NULL,
    dead_at timestamp with time zone DEFAULT now() NOT NULL
)
PARTITION BY RANGE (delivery_id);


--
-- Name: dead_letters_before_0014; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.dead_letters_before_0014 (
    delivery_id uuid NOT NULL,
    endpoint_id uuid NOT NULL,
    tenant text NOT NULL,
    reason text NOT NULL,
    attempts integer NOT NULL,
    dead_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: deliveries; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.deliveries (
    id uuid NOT NULL,
    event_id uuid NOT NULL,
    endpoint_id uuid NOT NULL,
    tenant text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    visible_at timestamp with time zone DEFAULT now() NOT NULL,
    locked_by uuid,
    last_status_code integer,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    completed_at timestamp with time zone,
    claim_token uuid,
    attempt_seq integer DEFAULT 0 NOT NULL,
    consumer text,
    ordering_key text,
    ordering_seq bigint,
    CONSTRAINT deliveries_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'in_progress'::text, 'failed'::text, 'succeeded'::text, 'dead'::text, 'cancelled'::text])))
)
PARTITION BY LIST (status);


--
-- Name: delivery_attempts; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.delivery_attempts (
    id bigint NOT NULL,
    delivery_id uuid NOT NULL,
    attempt integer NOT NULL,
    started_at timestamp with time zone NOT NULL,
    duration_ms integer NOT NULL,
    status_code integer,
    error_class text,
    error text,
    response_snippet text
)
PARTITION BY RANGE (delivery_id);


--
-- Name: delivery_attempts_before_0014; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.delivery_attempts_before_0014 (
    id bigint NOT NULL,
    delivery_id uuid NOT NULL,
    attempt integer NOT NULL,
    started_at timestamp with time zone NOT NULL,
    duration_ms integer NOT NULL,
    status_code integer,
    error_class text,
    error text,
    response_snippet text
);


--
-- Name: delivery_attempts_id_seq1; Type: SEQUENCE; Schema: hookd; Owner: -
--

ALTER TABLE hookd.delivery_attempts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME hookd.delivery_attempts_id_seq1
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: delivery_history; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.delivery_history (
    id uuid NOT NULL,
    event_id uuid NOT NULL,
    endpoint_id uuid NOT NULL,
    tenant text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    visible_at timestamp with time zone DEFAULT now() NOT NULL,
    locked_by uuid,
    last_status_code integer,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    completed_at timestamp with time zone,
    claim_token uuid,
    attempt_seq integer DEFAULT 0 NOT NULL,
    consumer text,
    ordering_key text,
    ordering_seq bigint,
    CONSTRAINT deliveries_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'in_progress'::text, 'failed'::text, 'succeeded'::text, 'dead'::text, 'cancelled'::text])))
)
PARTITION BY RANGE (id);


--
-- Name: delivery_history_before_0014; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.delivery_history_before_0014 (
    id uuid NOT NULL,
    event_id uuid NOT NULL,
    endpoint_id uuid NOT NULL,
    tenant text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    visible_at timestamp with time zone DEFAULT now() NOT NULL,
    locked_by uuid,
    last_status_code integer,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    completed_at timestamp with time zone,
    claim_token uuid,
    attempt_seq integer DEFAULT 0 NOT NULL,
    consumer text,
    ordering_key text,
    ordering_seq bigint,
    CONSTRAINT deliveries_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'in_progress'::text, 'failed'::text, 'succeeded'::text, 'dead'::text, 'cancelled'::text])))
);


--
-- Name: delivery_queue; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.delivery_queue (
    id uuid NOT NULL,
    event_id uuid NOT NULL,
    endpoint_id uuid NOT NULL,
    tenant text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    visible_at timestamp with time zone DEFAULT now() NOT NULL,
    locked_by uuid,
    last_status_code integer,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    completed_at timestamp with time zone,
    claim_token uuid,
    attempt_seq integer DEFAULT 0 NOT NULL,
    consumer text,
    ordering_key text,
    ordering_seq bigint,
    CONSTRAINT deliveries_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'in_progress'::text, 'failed'::text, 'succeeded'::text, 'dead'::text, 'cancelled'::text])))
)
WITH (fillfactor='80', autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='5000', autovacuum_vacuum_insert_scale_factor='0.05', autovacuum_vacuum_cost_delay='0', autovacuum_analyze_scale_factor='0.02');


--
-- Name: endpoint_queue; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.endpoint_queue (
    endpoint_id uuid NOT NULL,
    tenant text NOT NULL,
    due_at timestamp with time zone NOT NULL,
    hold_until timestamp with time zone,
    served_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    turn_at timestamp with time zone GENERATED ALWAYS AS (GREATEST(due_at, hold_until, served_at)) STORED
)
WITH (fillfactor='50', autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_cost_delay='0', autovacuum_analyze_scale_factor='0.05');


--
-- Name: endpoint_rechecks; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.endpoint_rechecks (
    id bigint NOT NULL,
    endpoint_id uuid NOT NULL
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_cost_delay='0');


--
-- Name: endpoint_rechecks_id_seq; Type: SEQUENCE; Schema: hookd; Owner: -
--

ALTER TABLE hookd.endpoint_rechecks ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME hookd.endpoint_rechecks_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: endpoint_secrets; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.endpoint_secrets (
    id bigint NOT NULL,
    endpoint_id uuid NOT NULL,
    plaintext_secret text,
    fingerprint bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    not_after timestamp with time zone,
    key_id text,
    ciphertext bytea,
    CONSTRAINT endpoint_secrets_one_form CHECK ((((ciphertext IS NOT NULL) AND (key_id IS NOT NULL) AND (plaintext_secret IS NULL)) OR ((ciphertext IS NULL) AND (key_id IS NULL) AND (plaintext_secret IS NOT NULL))))
);


--
-- Name: endpoint_secrets_id_seq; Type: SEQUENCE; Schema: hookd; Owner: -
--

ALTER TABLE hookd.endpoint_secrets ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME hookd.endpoint_secrets_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: endpoint_wakeups; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.endpoint_wakeups (
    id bigint NOT NULL,
    endpoint_id uuid NOT NULL,
    due_at timestamp with time zone NOT NULL
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_cost_delay='0');


--
-- Name: endpoint_wakeups_id_seq; Type: SEQUENCE; Schema: hookd; Owner: -
--

ALTER TABLE hookd.endpoint_wakeups ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME hookd.endpoint_wakeups_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: endpoints; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.endpoints (
    id uuid NOT NULL,
    tenant text NOT NULL,
    k8s_namespace text,
    k8s_name text,
    k8s_uid text,
    url text NOT NULL,
    event_types text[] DEFAULT '{}'::text[] NOT NULL,
    state text DEFAULT 'active'::text NOT NULL,
    state_reason text,
    timeout_ms integer,
    max_attempts integer,
    retry_schedule_secs integer[],
    max_in_flight integer,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    secret_grace_secs integer DEFAULT 86400 NOT NULL,
    spec_fingerprint bytea,
    circuit_state text DEFAULT 'closed'::text NOT NULL,
    circuit_failures integer DEFAULT 0 NOT NULL,
    circuit_open_until timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    last_success_at timestamp with time zone,
    last_failure_at timestamp with time zone,
    config_version bigint DEFAULT 1 NOT NULL,
    removed_at timestamp with time zone,
    consumer text,
    managed_by text DEFAULT 'kubernetes'::text NOT NULL,
    description text,
    consumer_deleted_at timestamp with time zone,
    secret_unreadable text,
    secret_unreadable_since timestamp with time zone,
    consumer_generation bigint,
    circuit_opened_at timestamp with time zone,
    circuit_alerted_at timestamp with time zone,
    rate_per_second double precision,
    rate_burst integer,
    rate_tokens double precision,
    rate_at timestamp with time zone,
    rate_wait_until timestamp with time zone,
    ordering text DEFAULT 'none'::text NOT NULL,
    on_dead_letter text DEFAULT 'continue'::text NOT NULL,
    CONSTRAINT endpoints_circuit_state_check CHECK ((circuit_state = ANY (ARRAY['closed'::text, 'open'::text, 'half_open'::text]))),
    CONSTRAINT endpoints_consumer_check CHECK (((consumer IS NULL) OR (consumer ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'::text))),
    CONSTRAINT endpoints_description_check CHECK (((description IS NULL) OR (length(description) <= 1000))),
    CONSTRAINT endpoints_identity CHECK (((managed_by = 'kubernetes'::text) = ((k8s_namespace IS NOT NULL) AND (k8s_name IS NOT NULL)))),
    CONSTRAINT endpoints_managed_by_check CHECK ((managed_by = ANY (ARRAY['kubernetes'::text, 'api'::text]))),
    CONSTRAINT endpoints_max_attempts_check CHECK (((max_attempts IS NULL) OR ((max_attempts >= 1) AND (max_attempts <= 100)))),
    CONSTRAINT endpoints_max_in_flight_check CHECK (((max_in_flight IS NULL) OR ((max_in_flight >= 1) AND (max_in_flight <= 10000)))),
    CONSTRAINT endpoints_on_dead_letter CHECK ((on_dead_letter = ANY (ARRAY['continue'::text, 'hold'::text]))),
    CONSTRAINT endpoints_ordering CHECK ((ordering = ANY (ARRAY['none'::text, 'perKey'::text]))),
    CONSTRAINT endpoints_rate_limit CHECK ((((rate_per_second IS NULL) = (rate_burst IS NULL)) AND ((rate_per_second IS NULL) OR ((rate_per_second >= (0.01)::double precision) AND (rate_per_second <= (100000)::double precision))) AND ((rate_burst IS NULL) OR ((rate_burst >= 1) AND (rate_burst <= 100000))) AND ((rate_burst IS NULL) OR ((rate_burst)::double precision >= (rate_per_second * (0.05)::double precision))))),
    CONSTRAINT endpoints_secret_grace_secs_check CHECK ((secret_grace_secs >= 0)),
    CONSTRAINT endpoints_state_check CHECK ((state = ANY (ARRAY['active'::text, 'paused'::text, 'disabled'::text]))),
    CONSTRAINT endpoints_timeout_ms_check CHECK (((timeout_ms IS NULL) OR ((timeout_ms >= 100) AND (timeout_ms <= 300000))))
)
WITH (fillfactor='80');


--
-- Name: COLUMN endpoints.last_success_at; Type: COMMENT; Schema: hookd; Owner: -
--

COMMENT ON COLUMN hookd.endpoints.last_success_at IS 'unused since migration 0036 (read from the newest succeeded delivery); dropped in a later release';


--
-- Name: event_type_versions; Type: SEQUENCE; Schema: hookd; Owner: -
--

CREATE SEQUENCE hookd.event_type_versions
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: event_types; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.event_types (
    tenant text NOT NULL,
    name text NOT NULL,
    description text,
    schema jsonb,
    example text,
    deprecated boolean DEFAULT false NOT NULL,
    deprecation_note text,
    managed_by text DEFAULT 'api'::text NOT NULL,
    k8s_namespace text,
    k8s_name text,
    version bigint DEFAULT nextval('hookd.event_type_versions'::regclass) NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT event_types_description_length CHECK ((char_length(description) <= 1000)),
    CONSTRAINT event_types_example_size CHECK ((octet_length(example) <= 65536)),
    CONSTRAINT event_types_k8s_object CHECK (((managed_by = 'kubernetes'::text) = ((k8s_namespace IS NOT NULL) AND (k8s_name IS NOT NULL)))),
    CONSTRAINT event_types_managed_by CHECK ((managed_by = ANY (ARRAY['kubernetes'::text, 'api'::text]))),
    CONSTRAINT event_types_name_syntax CHECK (((length(name) <= 128) AND (name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'::text))),
    CONSTRAINT event_types_not_reserved CHECK ((NOT hookd.is_reserved_event_type(name))),
    CONSTRAINT event_types_note_length CHECK ((char_length(deprecation_note) <= 1000)),
    CONSTRAINT event_types_schema_size CHECK ((octet_length((schema)::text) <= 131072))
);


--
-- Name: events; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.events (
    id uuid NOT NULL,
    tenant text NOT NULL,
    event_type text NOT NULL,
    payload text NOT NULL,
    idempotency_key text,
    request_hash bytea NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    consumer text,
    source text,
    source_event_id text,
    source_headers jsonb,
    traceparent text,
    tracestate text,
    ordering_key text,
    ordering_seq bigint
)
WITH (autovacuum_vacuum_insert_scale_factor='0.05', autovacuum_analyze_scale_factor='0.02');


--
-- Name: operational_budget; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.operational_budget (
    endpoint_id uuid NOT NULL,
    window_start timestamp with time zone NOT NULL,
    sent integer NOT NULL
);


--
-- Name: ordering_advances; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.ordering_advances (
    id bigint NOT NULL,
    endpoint_id uuid NOT NULL,
    ordering_key text NOT NULL
);


--
-- Name: ordering_advances_id_seq; Type: SEQUENCE; Schema: hookd; Owner: -
--

ALTER TABLE hookd.ordering_advances ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME hookd.ordering_advances_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: ordering_holds; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.ordering_holds (
    endpoint_id uuid NOT NULL,
    ordering_key text NOT NULL,
    delivery_id uuid NOT NULL,
    held_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: ordering_seq; Type: SEQUENCE; Schema: hookd; Owner: -
--

CREATE SEQUENCE hookd.ordering_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: producer_roles; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.producer_roles (
    role_name text NOT NULL,
    tenant text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT producer_roles_tenant_check CHECK ((tenant ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'::text))
);


--
-- Name: sign_in_codes; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.sign_in_codes (
    code_hash bytea NOT NULL,
    token_id uuid NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT sign_in_codes_code_hash_check CHECK ((length(code_hash) = 32))
);


--
-- Name: source_requests; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.source_requests (
    source_id uuid NOT NULL,
    hour timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    count bigint NOT NULL,
    last_at timestamp with time zone NOT NULL
);


--
-- Name: source_secrets; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.source_secrets (
    source_id uuid NOT NULL,
    version integer NOT NULL,
    key_id text NOT NULL,
    ciphertext bytea NOT NULL,
    not_after timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: sources; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.sources (
    id uuid NOT NULL,
    name text NOT NULL,
    tenant text NOT NULL,
    consumer text,
    provider text NOT NULL,
    hmac jsonb,
    event_type_prefix text NOT NULL,
    max_body_bytes integer NOT NULL,
    description text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    managed_by text DEFAULT 'api'::text NOT NULL,
    k8s_namespace text,
    k8s_name text,
    CONSTRAINT sources_hmac_scheme CHECK (((provider = 'hmac'::text) = (hmac IS NOT NULL))),
    CONSTRAINT sources_k8s_object CHECK (((managed_by = 'kubernetes'::text) = ((k8s_namespace IS NOT NULL) AND (k8s_name IS NOT NULL)))),
    CONSTRAINT sources_managed_by CHECK ((managed_by = ANY (ARRAY['kubernetes'::text, 'api'::text]))),
    CONSTRAINT sources_max_body CHECK (((max_body_bytes >= 1) AND (max_body_bytes <= 16777216))),
    CONSTRAINT sources_name_label CHECK ((name ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'::text)),
    CONSTRAINT sources_prefix_not_reserved CHECK ((NOT hookd.is_reserved_event_type(event_type_prefix))),
    CONSTRAINT sources_provider CHECK ((provider = ANY (ARRAY['standard-webhooks'::text, 'stripe'::text, 'github'::text, 'shopify'::text, 'slack'::text, 'hmac'::text])))
);


--
-- Name: subscriptions; Type: TABLE; Schema: hookd; Owner: -
--

CREATE TABLE hookd.subscriptions (
    tenant text NOT NULL,
    consumer text NOT NULL,
    pattern text NOT NULL,
    endpoint_id uuid NOT NULL
);


--
-- Name: dead_letters_before_0014; Type: TABLE ATTACH; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.dead_letters ATTACH PARTITION hookd.dead_letters_before_0014 FOR VALUES FROM (MINVALUE) TO ('<the day of migration 0014>');


--
-- Name: delivery_attempts_before_0014; Type: TABLE ATTACH; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.delivery_attempts ATTACH PARTITION hookd.delivery_attempts_before_0014 FOR VALUES FROM (MINVALUE) TO ('<the day of migration 0014>');


--
-- Name: delivery_history; Type: TABLE ATTACH; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.deliveries ATTACH PARTITION hookd.delivery_history FOR VALUES IN ('succeeded', 'dead', 'cancelled');


--
-- Name: delivery_history_before_0014; Type: TABLE ATTACH; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.delivery_history ATTACH PARTITION hookd.delivery_history_before_0014 FOR VALUES FROM (MINVALUE) TO ('<the day of migration 0014>');


--
-- Name: delivery_queue; Type: TABLE ATTACH; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.deliveries ATTACH PARTITION hookd.delivery_queue FOR VALUES IN ('pending', 'in_progress', 'failed');


--
-- Name: api_tokens api_tokens_consumer_never_produces; Type: CHECK CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE hookd.api_tokens
    ADD CONSTRAINT api_tokens_consumer_never_produces CHECK (((consumer IS NULL) OR (NOT ('produce'::text = ANY (scopes))))) NOT VALID;


--
-- Name: api_tokens api_tokens_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.api_tokens
    ADD CONSTRAINT api_tokens_pkey PRIMARY KEY (id);


--
-- Name: consumer_deletions consumer_deletions_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.consumer_deletions
    ADD CONSTRAINT consumer_deletions_pkey PRIMARY KEY (id);


--
-- Name: consumers consumers_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.consumers
    ADD CONSTRAINT consumers_pkey PRIMARY KEY (tenant, uid);


--
-- Name: dead_letters dead_letters_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.dead_letters
    ADD CONSTRAINT dead_letters_pkey PRIMARY KEY (delivery_id);


--
-- Name: dead_letters_before_0014 dead_letters_before_0014_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.dead_letters_before_0014
    ADD CONSTRAINT dead_letters_before_0014_pkey PRIMARY KEY (delivery_id);


--
-- Name: deliveries deliveries_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.deliveries
    ADD CONSTRAINT deliveries_pkey PRIMARY KEY (id, status);


--
-- Name: delivery_attempts delivery_attempts_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.delivery_attempts
    ADD CONSTRAINT delivery_attempts_pkey PRIMARY KEY (id, delivery_id);


--
-- Name: delivery_attempts_before_0014 delivery_attempts_before_0014_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.delivery_attempts_before_0014
    ADD CONSTRAINT delivery_attempts_before_0014_pkey PRIMARY KEY (id, delivery_id);


--
-- Name: delivery_attempts delivery_attempts_error_class; Type: CHECK CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE hookd.delivery_attempts
    ADD CONSTRAINT delivery_attempts_error_class CHECK ((error_class = ANY (ARRAY['timeout'::text, 'connect'::text, 'dns'::text, 'body'::text, 'request'::text, 'destination_forbidden'::text, 'invalid_url'::text, 'http_status'::text, 'gone'::text, 'no_signing_secret'::text, 'secret_unreadable'::text]))) NOT VALID;


--
-- Name: delivery_history delivery_history_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.delivery_history
    ADD CONSTRAINT delivery_history_pkey PRIMARY KEY (id, status);


--
-- Name: delivery_history_before_0014 delivery_history_before_0014_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.delivery_history_before_0014
    ADD CONSTRAINT delivery_history_before_0014_pkey PRIMARY KEY (id, status);


--
-- Name: delivery_queue delivery_queue_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.delivery_queue
    ADD CONSTRAINT delivery_queue_pkey PRIMARY KEY (id, status);


--
-- Name: endpoint_queue endpoint_queue_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.endpoint_queue
    ADD CONSTRAINT endpoint_queue_pkey PRIMARY KEY (endpoint_id);


--
-- Name: endpoint_rechecks endpoint_rechecks_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.endpoint_rechecks
    ADD CONSTRAINT endpoint_rechecks_pkey PRIMARY KEY (id);


--
-- Name: endpoint_secrets endpoint_secrets_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.endpoint_secrets
    ADD CONSTRAINT endpoint_secrets_pkey PRIMARY KEY (id);


--
-- Name: endpoint_wakeups endpoint_wakeups_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.endpoint_wakeups
    ADD CONSTRAINT endpoint_wakeups_pkey PRIMARY KEY (id);


--
-- Name: endpoints endpoints_k8s_namespace_k8s_name_key; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.endpoints
    ADD CONSTRAINT endpoints_k8s_namespace_k8s_name_key UNIQUE (k8s_namespace, k8s_name);


--
-- Name: endpoints endpoints_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.endpoints
    ADD CONSTRAINT endpoints_pkey PRIMARY KEY (id);


--
-- Name: event_types event_types_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.event_types
    ADD CONSTRAINT event_types_pkey PRIMARY KEY (tenant, name);


--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (id);


--
-- Name: operational_budget operational_budget_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.operational_budget
    ADD CONSTRAINT operational_budget_pkey PRIMARY KEY (endpoint_id);


--
-- Name: ordering_advances ordering_advances_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.ordering_advances
    ADD CONSTRAINT ordering_advances_pkey PRIMARY KEY (id);


--
-- Name: ordering_holds ordering_holds_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.ordering_holds
    ADD CONSTRAINT ordering_holds_pkey PRIMARY KEY (endpoint_id, ordering_key);


--
-- Name: producer_roles producer_roles_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.producer_roles
    ADD CONSTRAINT producer_roles_pkey PRIMARY KEY (role_name, tenant);


--
-- Name: sign_in_codes sign_in_codes_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.sign_in_codes
    ADD CONSTRAINT sign_in_codes_pkey PRIMARY KEY (code_hash);


--
-- Name: source_requests source_requests_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.source_requests
    ADD CONSTRAINT source_requests_pkey PRIMARY KEY (source_id, hour, outcome);


--
-- Name: source_secrets source_secrets_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.source_secrets
    ADD CONSTRAINT source_secrets_pkey PRIMARY KEY (source_id, version);


--
-- Name: sources sources_name_unique; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.sources
    ADD CONSTRAINT sources_name_unique UNIQUE (name);


--
-- Name: sources sources_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.sources
    ADD CONSTRAINT sources_pkey PRIMARY KEY (id);


--
-- Name: subscriptions subscriptions_pkey; Type: CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.subscriptions
    ADD CONSTRAINT subscriptions_pkey PRIMARY KEY (tenant, consumer, pattern, endpoint_id);


--
-- Name: api_tokens_consumer; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX api_tokens_consumer ON hookd.api_tokens USING btree (tenant, consumer) WHERE (consumer IS NOT NULL);


--
-- Name: api_tokens_hash; Type: INDEX; Schema: hookd; Owner: -
--

CREATE UNIQUE INDEX api_tokens_hash ON hookd.api_tokens USING btree (token_hash);


--
-- Name: api_tokens_parent; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX api_tokens_parent ON hookd.api_tokens USING btree (parent_id) WHERE (parent_id IS NOT NULL);


--
-- Name: api_tokens_tenant_page; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX api_tokens_tenant_page ON hookd.api_tokens USING btree (tenant, id);


--
-- Name: consumer_deletions_open; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX consumer_deletions_open ON hookd.consumer_deletions USING btree (requested_at) WHERE (completed_at IS NULL);


--
-- Name: consumer_deletions_tenant; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX consumer_deletions_tenant ON hookd.consumer_deletions USING btree (tenant, uid, requested_at);


--
-- Name: dead_letters_endpoint; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX dead_letters_endpoint ON ONLY hookd.dead_letters USING btree (endpoint_id, dead_at, delivery_id);


--
-- Name: dead_letters_before_0014_endpoint_id_dead_at_delivery_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX dead_letters_before_0014_endpoint_id_dead_at_delivery_id_idx ON hookd.dead_letters_before_0014 USING btree (endpoint_id, dead_at, delivery_id);


--
-- Name: dead_letters_tenant; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX dead_letters_tenant ON ONLY hookd.dead_letters USING btree (tenant, dead_at, delivery_id);


--
-- Name: dead_letters_before_0014_tenant_dead_at_delivery_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX dead_letters_before_0014_tenant_dead_at_delivery_id_idx ON hookd.dead_letters_before_0014 USING btree (tenant, dead_at, delivery_id);


--
-- Name: deliveries_claimable; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX deliveries_claimable ON hookd.delivery_queue USING btree (endpoint_id, visible_at);


--
-- Name: deliveries_consumer_status_page; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX deliveries_consumer_status_page ON ONLY hookd.deliveries USING btree (tenant, consumer, status, event_id) WHERE (consumer IS NOT NULL);


--
-- Name: deliveries_endpoint_page; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX deliveries_endpoint_page ON ONLY hookd.deliveries USING btree (endpoint_id, id);


--
-- Name: deliveries_event; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX deliveries_event ON ONLY hookd.deliveries USING btree (event_id);


--
-- Name: deliveries_ordering_head; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX deliveries_ordering_head ON hookd.delivery_queue USING btree (endpoint_id, ordering_key) WHERE ((ordering_key IS NOT NULL) AND (visible_at < hookd.ordering_waiting()));


--
-- Name: deliveries_ordering_waiting; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX deliveries_ordering_waiting ON hookd.delivery_queue USING btree (endpoint_id, ordering_key, ordering_seq) WHERE ((ordering_key IS NOT NULL) AND (visible_at = hookd.ordering_waiting()));


--
-- Name: deliveries_status_page; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX deliveries_status_page ON ONLY hookd.deliveries USING btree (tenant, status, event_id);


--
-- Name: delivery_attempts_delivery; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_attempts_delivery ON ONLY hookd.delivery_attempts USING btree (delivery_id, attempt);


--
-- Name: delivery_attempts_before_0014_delivery_id_attempt_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_attempts_before_0014_delivery_id_attempt_idx ON hookd.delivery_attempts_before_0014 USING btree (delivery_id, attempt);


--
-- Name: delivery_history_endpoint_id_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_history_endpoint_id_id_idx ON ONLY hookd.delivery_history USING btree (endpoint_id, id);


--
-- Name: delivery_history_before_0014_endpoint_id_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_history_before_0014_endpoint_id_id_idx ON hookd.delivery_history_before_0014 USING btree (endpoint_id, id);


--
-- Name: delivery_history_event_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_history_event_id_idx ON ONLY hookd.delivery_history USING btree (event_id);


--
-- Name: delivery_history_before_0014_event_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_history_before_0014_event_id_idx ON hookd.delivery_history_before_0014 USING btree (event_id);


--
-- Name: delivery_history_tenant_consumer_status_event_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_history_tenant_consumer_status_event_id_idx ON ONLY hookd.delivery_history USING btree (tenant, consumer, status, event_id) WHERE (consumer IS NOT NULL);


--
-- Name: delivery_history_before_0014_tenant_consumer_status_event_i_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_history_before_0014_tenant_consumer_status_event_i_idx ON hookd.delivery_history_before_0014 USING btree (tenant, consumer, status, event_id) WHERE (consumer IS NOT NULL);


--
-- Name: delivery_history_tenant_status_event_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_history_tenant_status_event_id_idx ON ONLY hookd.delivery_history USING btree (tenant, status, event_id);


--
-- Name: delivery_history_before_0014_tenant_status_event_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_history_before_0014_tenant_status_event_id_idx ON hookd.delivery_history_before_0014 USING btree (tenant, status, event_id);


--
-- Name: delivery_history_updated; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_history_updated ON ONLY hookd.delivery_history USING brin (updated_at);


--
-- Name: delivery_history_before_0014_updated_at_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_history_before_0014_updated_at_idx ON hookd.delivery_history_before_0014 USING brin (updated_at);


--
-- Name: delivery_queue_endpoint_id_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_queue_endpoint_id_id_idx ON hookd.delivery_queue USING btree (endpoint_id, id);


--
-- Name: delivery_queue_event_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_queue_event_id_idx ON hookd.delivery_queue USING btree (event_id);


--
-- Name: delivery_queue_tenant_consumer_status_event_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_queue_tenant_consumer_status_event_id_idx ON hookd.delivery_queue USING btree (tenant, consumer, status, event_id) WHERE (consumer IS NOT NULL);


--
-- Name: delivery_queue_tenant_status_event_id_idx; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX delivery_queue_tenant_status_event_id_idx ON hookd.delivery_queue USING btree (tenant, status, event_id);


--
-- Name: endpoint_queue_tenant_turn; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX endpoint_queue_tenant_turn ON hookd.endpoint_queue USING btree (tenant, turn_at);


--
-- Name: endpoint_secrets_endpoint; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX endpoint_secrets_endpoint ON hookd.endpoint_secrets USING btree (endpoint_id);


--
-- Name: endpoints_api_live; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX endpoints_api_live ON hookd.endpoints USING btree (tenant) WHERE ((managed_by = 'api'::text) AND (removed_at IS NULL) AND (consumer_deleted_at IS NULL));


--
-- Name: endpoints_consumer_deleted; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX endpoints_consumer_deleted ON hookd.endpoints USING btree (consumer_deleted_at) WHERE (consumer_deleted_at IS NOT NULL);


--
-- Name: endpoints_consumer_generation; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX endpoints_consumer_generation ON hookd.endpoints USING btree (tenant, consumer, consumer_generation, id) WHERE ((removed_at IS NULL) AND (consumer IS NOT NULL));


--
-- Name: endpoints_consumer_page; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX endpoints_consumer_page ON hookd.endpoints USING btree (tenant, consumer, id) WHERE ((removed_at IS NULL) AND (consumer IS NOT NULL));


--
-- Name: endpoints_open_circuit; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX endpoints_open_circuit ON hookd.endpoints USING btree (circuit_opened_at) WHERE ((circuit_state <> 'closed'::text) AND (circuit_alerted_at IS NULL));


--
-- Name: endpoints_removed; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX endpoints_removed ON hookd.endpoints USING btree (removed_at) WHERE (removed_at IS NOT NULL);


--
-- Name: endpoints_tenant_page; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX endpoints_tenant_page ON hookd.endpoints USING btree (tenant, id) WHERE (removed_at IS NULL);


--
-- Name: event_types_k8s_object_key; Type: INDEX; Schema: hookd; Owner: -
--

CREATE UNIQUE INDEX event_types_k8s_object_key ON hookd.event_types USING btree (k8s_namespace, k8s_name) WHERE (managed_by = 'kubernetes'::text);


--
-- Name: events_consumer_page; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX events_consumer_page ON hookd.events USING btree (tenant, consumer, id) WHERE (consumer IS NOT NULL);


--
-- Name: events_idempotency; Type: INDEX; Schema: hookd; Owner: -
--

CREATE UNIQUE INDEX events_idempotency ON hookd.events USING btree (tenant, idempotency_key) WHERE (idempotency_key IS NOT NULL);


--
-- Name: events_source_page; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX events_source_page ON hookd.events USING btree (tenant, source, id) WHERE (source IS NOT NULL);


--
-- Name: events_tenant_page; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX events_tenant_page ON hookd.events USING btree (tenant, id);


--
-- Name: events_type_page; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX events_type_page ON hookd.events USING btree (tenant, event_type, id);


--
-- Name: producer_roles_tenant; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX producer_roles_tenant ON hookd.producer_roles USING btree (tenant);


--
-- Name: sign_in_codes_expiry; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX sign_in_codes_expiry ON hookd.sign_in_codes USING btree (expires_at);


--
-- Name: source_requests_hour; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX source_requests_hour ON hookd.source_requests USING btree (hour);


--
-- Name: sources_k8s_object_key; Type: INDEX; Schema: hookd; Owner: -
--

CREATE UNIQUE INDEX sources_k8s_object_key ON hookd.sources USING btree (k8s_namespace, k8s_name) WHERE (managed_by = 'kubernetes'::text);


--
-- Name: sources_tenant_name; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX sources_tenant_name ON hookd.sources USING btree (tenant, name);


--
-- Name: subscriptions_endpoint; Type: INDEX; Schema: hookd; Owner: -
--

CREATE INDEX subscriptions_endpoint ON hookd.subscriptions USING btree (endpoint_id);


--
-- Name: dead_letters_before_0014_endpoint_id_dead_at_delivery_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.dead_letters_endpoint ATTACH PARTITION hookd.dead_letters_before_0014_endpoint_id_dead_at_delivery_id_idx;


--
-- Name: dead_letters_before_0014_pkey; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.dead_letters_pkey ATTACH PARTITION hookd.dead_letters_before_0014_pkey;


--
-- Name: dead_letters_before_0014_tenant_dead_at_delivery_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.dead_letters_tenant ATTACH PARTITION hookd.dead_letters_before_0014_tenant_dead_at_delivery_id_idx;


--
-- Name: delivery_attempts_before_0014_delivery_id_attempt_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.delivery_attempts_delivery ATTACH PARTITION hookd.delivery_attempts_before_0014_delivery_id_attempt_idx;


--
-- Name: delivery_attempts_before_0014_pkey; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.delivery_attempts_pkey ATTACH PARTITION hookd.delivery_attempts_before_0014_pkey;


--
-- Name: delivery_history_before_0014_endpoint_id_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.delivery_history_endpoint_id_id_idx ATTACH PARTITION hookd.delivery_history_before_0014_endpoint_id_id_idx;


--
-- Name: delivery_history_before_0014_event_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.delivery_history_event_id_idx ATTACH PARTITION hookd.delivery_history_before_0014_event_id_idx;


--
-- Name: delivery_history_before_0014_pkey; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.delivery_history_pkey ATTACH PARTITION hookd.delivery_history_before_0014_pkey;


--
-- Name: delivery_history_before_0014_tenant_consumer_status_event_i_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.delivery_history_tenant_consumer_status_event_id_idx ATTACH PARTITION hookd.delivery_history_before_0014_tenant_consumer_status_event_i_idx;


--
-- Name: delivery_history_before_0014_tenant_status_event_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.delivery_history_tenant_status_event_id_idx ATTACH PARTITION hookd.delivery_history_before_0014_tenant_status_event_id_idx;


--
-- Name: delivery_history_before_0014_updated_at_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.delivery_history_updated ATTACH PARTITION hookd.delivery_history_before_0014_updated_at_idx;


--
-- Name: delivery_history_endpoint_id_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.deliveries_endpoint_page ATTACH PARTITION hookd.delivery_history_endpoint_id_id_idx;


--
-- Name: delivery_history_event_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.deliveries_event ATTACH PARTITION hookd.delivery_history_event_id_idx;


--
-- Name: delivery_history_pkey; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.deliveries_pkey ATTACH PARTITION hookd.delivery_history_pkey;


--
-- Name: delivery_history_tenant_consumer_status_event_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.deliveries_consumer_status_page ATTACH PARTITION hookd.delivery_history_tenant_consumer_status_event_id_idx;


--
-- Name: delivery_history_tenant_status_event_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.deliveries_status_page ATTACH PARTITION hookd.delivery_history_tenant_status_event_id_idx;


--
-- Name: delivery_queue_endpoint_id_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.deliveries_endpoint_page ATTACH PARTITION hookd.delivery_queue_endpoint_id_id_idx;


--
-- Name: delivery_queue_event_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.deliveries_event ATTACH PARTITION hookd.delivery_queue_event_id_idx;


--
-- Name: delivery_queue_pkey; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.deliveries_pkey ATTACH PARTITION hookd.delivery_queue_pkey;


--
-- Name: delivery_queue_tenant_consumer_status_event_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.deliveries_consumer_status_page ATTACH PARTITION hookd.delivery_queue_tenant_consumer_status_event_id_idx;


--
-- Name: delivery_queue_tenant_status_event_id_idx; Type: INDEX ATTACH; Schema: hookd; Owner: -
--

ALTER INDEX hookd.deliveries_status_page ATTACH PARTITION hookd.delivery_queue_tenant_status_event_id_idx;


--
-- Name: api_tokens api_tokens_revoke_sessions; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER api_tokens_revoke_sessions AFTER UPDATE OF revoked_at ON hookd.api_tokens FOR EACH ROW WHEN (((old.revoked_at IS NULL) AND (new.revoked_at IS NOT NULL))) EXECUTE FUNCTION hookd.revoke_sessions();


--
-- Name: deliveries deliveries_queue_insert; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER deliveries_queue_insert AFTER INSERT ON hookd.deliveries REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION hookd.deliveries_queue_insert();


--
-- Name: deliveries deliveries_queue_update; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER deliveries_queue_update AFTER UPDATE ON hookd.deliveries REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION hookd.deliveries_queue_update();


--
-- Name: endpoints endpoints_history_cascade; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_history_cascade AFTER DELETE ON hookd.endpoints REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION hookd.history_cascade_endpoints();


--
-- Name: endpoints endpoints_new_url; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_new_url BEFORE UPDATE OF url ON hookd.endpoints FOR EACH ROW WHEN ((new.url IS DISTINCT FROM old.url)) EXECUTE FUNCTION hookd.endpoint_new_url();


--
-- Name: endpoints endpoints_opened_circuit; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_opened_circuit BEFORE UPDATE OF circuit_state, url ON hookd.endpoints FOR EACH ROW WHEN ((old.circuit_state IS DISTINCT FROM new.circuit_state)) EXECUTE FUNCTION hookd.endpoint_circuit_moved();


--
-- Name: endpoints endpoints_operational; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_operational AFTER UPDATE ON hookd.endpoints FOR EACH ROW WHEN (((new.removed_at IS NULL) AND (((old.state = 'disabled'::text) <> (new.state = 'disabled'::text)) OR ((old.secret_unreadable IS NULL) AND (new.secret_unreadable IS NOT NULL)) OR ((old.circuit_alerted_at IS NULL) AND (new.circuit_alerted_at IS NOT NULL))))) EXECUTE FUNCTION hookd.endpoint_operational();


--
-- Name: endpoints endpoints_ordering; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_ordering AFTER UPDATE OF ordering, on_dead_letter ON hookd.endpoints FOR EACH ROW WHEN (((old.ordering IS DISTINCT FROM new.ordering) OR (old.on_dead_letter IS DISTINCT FROM new.on_dead_letter))) EXECUTE FUNCTION hookd.endpoint_ordering_changed();


--
-- Name: endpoints endpoints_ordering_gone; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_ordering_gone AFTER DELETE ON hookd.endpoints REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION hookd.endpoint_ordering_gone();


--
-- Name: endpoints endpoints_owner_immutable; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_owner_immutable BEFORE UPDATE OF tenant, consumer ON hookd.endpoints FOR EACH ROW WHEN (((old.tenant IS DISTINCT FROM new.tenant) OR (old.consumer IS DISTINCT FROM new.consumer))) EXECUTE FUNCTION hookd.endpoint_tenant_is_immutable();


--
-- Name: endpoints endpoints_queue_gone; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_queue_gone AFTER DELETE ON hookd.endpoints REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION hookd.endpoints_queue_gone();


--
-- Name: endpoints endpoints_queue_hold; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_queue_hold AFTER UPDATE OF state, circuit_state, circuit_open_until, url, rate_wait_until ON hookd.endpoints FOR EACH ROW WHEN (((old.state IS DISTINCT FROM new.state) OR (old.circuit_state IS DISTINCT FROM new.circuit_state) OR (old.circuit_open_until IS DISTINCT FROM new.circuit_open_until) OR (old.rate_wait_until IS DISTINCT FROM new.rate_wait_until))) EXECUTE FUNCTION hookd.endpoints_queue_hold();


--
-- Name: endpoints endpoints_subscriptions_ins; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_subscriptions_ins AFTER INSERT ON hookd.endpoints FOR EACH ROW EXECUTE FUNCTION hookd.sync_subscriptions();


--
-- Name: endpoints endpoints_subscriptions_upd; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER endpoints_subscriptions_upd AFTER UPDATE OF event_types, state, removed_at ON hookd.endpoints FOR EACH ROW WHEN (((old.event_types IS DISTINCT FROM new.event_types) OR ((old.state = 'disabled'::text) IS DISTINCT FROM (new.state = 'disabled'::text)) OR (old.removed_at IS DISTINCT FROM new.removed_at))) EXECUTE FUNCTION hookd.sync_subscriptions();


--
-- Name: event_types event_types_version; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER event_types_version BEFORE UPDATE ON hookd.event_types FOR EACH ROW EXECUTE FUNCTION hookd.event_type_new_version();


--
-- Name: source_secrets source_secrets_changed; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER source_secrets_changed AFTER INSERT OR DELETE OR UPDATE OR TRUNCATE ON hookd.source_secrets FOR EACH STATEMENT EXECUTE FUNCTION hookd.sources_changed();


--
-- Name: sources sources_changed; Type: TRIGGER; Schema: hookd; Owner: -
--

CREATE TRIGGER sources_changed AFTER INSERT OR DELETE OR UPDATE OR TRUNCATE ON hookd.sources FOR EACH STATEMENT EXECUTE FUNCTION hookd.sources_changed();


--
-- Name: api_tokens api_tokens_parent_id_fkey; Type: FK CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.api_tokens
    ADD CONSTRAINT api_tokens_parent_id_fkey FOREIGN KEY (parent_id) REFERENCES hookd.api_tokens(id) ON DELETE CASCADE;


--
-- Name: delivery_queue delivery_queue_endpoint_id_fkey; Type: FK CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.delivery_queue
    ADD CONSTRAINT delivery_queue_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES hookd.endpoints(id) ON DELETE CASCADE;


--
-- Name: delivery_queue delivery_queue_event_id_fkey; Type: FK CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.delivery_queue
    ADD CONSTRAINT delivery_queue_event_id_fkey FOREIGN KEY (event_id) REFERENCES hookd.events(id) ON DELETE CASCADE;


--
-- Name: endpoint_secrets endpoint_secrets_endpoint_id_fkey; Type: FK CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.endpoint_secrets
    ADD CONSTRAINT endpoint_secrets_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES hookd.endpoints(id) ON DELETE CASCADE;


--
-- Name: operational_budget operational_budget_endpoint_id_fkey; Type: FK CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.operational_budget
    ADD CONSTRAINT operational_budget_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES hookd.endpoints(id) ON DELETE CASCADE;


--
-- Name: sign_in_codes sign_in_codes_token_id_fkey; Type: FK CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.sign_in_codes
    ADD CONSTRAINT sign_in_codes_token_id_fkey FOREIGN KEY (token_id) REFERENCES hookd.api_tokens(id) ON DELETE CASCADE;


--
-- Name: source_secrets source_secrets_source_id_fkey; Type: FK CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.source_secrets
    ADD CONSTRAINT source_secrets_source_id_fkey FOREIGN KEY (source_id) REFERENCES hookd.sources(id) ON DELETE CASCADE;


--
-- Name: subscriptions subscriptions_endpoint_id_fkey; Type: FK CONSTRAINT; Schema: hookd; Owner: -
--

ALTER TABLE ONLY hookd.subscriptions
    ADD CONSTRAINT subscriptions_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES hookd.endpoints(id) ON DELETE CASCADE;


--
-- PostgreSQL database dump complete
--


