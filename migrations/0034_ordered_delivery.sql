-- Ordered delivery per key (issue 34, item 1). An event may carry an `ordering_key`; an
-- endpoint with `ordering = 'perKey'` is sent the deliveries of one key strictly in the
-- order their events committed, the next only once the one before it succeeded, was
-- cancelled, or was dead-lettered (`on_dead_letter = 'hold'` stops the key there until
-- the dead delivery is replayed or the endpoint says `continue`).
--
-- How, without a new status and without touching the claim:
--
-- * Same-key enqueues take a transaction-scoped advisory lock on (tenant, key), seed 1
--   (idempotency keys use seed 0), the API's group commit through try-locks as for
--   idempotency keys, so a producer's open transaction holding a key holds only its own
--   request. Under the lock, `hookd.ordering_seq` taken at insert orders a key's events
--   in commit order.
-- * A delivery of a key that already has an open delivery to that endpoint (or an earlier
--   one in the same statement, or a dead letter holding the key) is inserted waiting:
--   `visible_at = hookd.ordering_waiting()`, a time no claim reaches. Every other path
--   (listings, backlog, pause, cancellation) sees an ordinary pending row.
-- * The line moves on through `hookd.ordering_advances`: the queue triggers add a row
--   when a keyed delivery ends or starts waiting, and every dispatcher's line mover
--   (`hookd.ordering_advance`) promotes the lowest waiting delivery of each advanced key
--   when nothing of that key is on its way. An advance is processed by a later
--   transaction than the one that wrote it, so whichever of "the head ended" and "a
--   delivery queued behind it" commits last leads to a promotion, and outcome batches take
--   no key lock.

ALTER TABLE hookd.endpoints
    ADD COLUMN ordering text NOT NULL DEFAULT 'none',
    ADD COLUMN on_dead_letter text NOT NULL DEFAULT 'continue',
    ADD CONSTRAINT endpoints_ordering CHECK (ordering IN ('none', 'perKey')),
    ADD CONSTRAINT endpoints_on_dead_letter CHECK (on_dead_letter IN ('continue', 'hold'));

-- Nullable columns without a default: nothing is rewritten.
ALTER TABLE hookd.events
    ADD COLUMN ordering_key text,
    ADD COLUMN ordering_seq bigint;
-- On a delivery only when its endpoint orders by key: the rows the indexes below hold.
ALTER TABLE hookd.deliveries
    ADD COLUMN ordering_key text,
    ADD COLUMN ordering_seq bigint;

CREATE SEQUENCE hookd.ordering_seq;

-- The time of a delivery waiting behind an earlier one of its key. Finite, so every
-- reader that turns a `visible_at` into a time still can.
CREATE FUNCTION hookd.ordering_waiting() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT timestamptz '9999-12-31 00:00:00+00' $$;

-- A key's waiting deliveries, lowest sequence first (what a promotion takes) ...
CREATE INDEX deliveries_ordering_waiting ON hookd.delivery_queue (endpoint_id, ordering_key, ordering_seq)
    WHERE ordering_key IS NOT NULL AND visible_at = hookd.ordering_waiting();
-- ... and the one on its way (due, leased or retrying): at most one per key.
CREATE INDEX deliveries_ordering_head ON hookd.delivery_queue (endpoint_id, ordering_key)
    WHERE ordering_key IS NOT NULL AND visible_at < hookd.ordering_waiting();

-- Keys whose line may move. Insert-only for writers; hookd.ordering_advance deletes what it
-- processed.
CREATE TABLE hookd.ordering_advances (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id uuid NOT NULL,
    ordering_key text NOT NULL
);

-- Keys stopped by a dead letter (`on_dead_letter = 'hold'`): the first dead delivery
-- holds the key until it is replayed or the endpoint says `continue`.
CREATE TABLE hookd.ordering_holds (
    endpoint_id uuid NOT NULL,
    ordering_key text NOT NULL,
    delivery_id uuid NOT NULL,
    held_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (endpoint_id, ordering_key)
);

-- Whether a new delivery of (endpoint, key) must wait: something of the key is still
-- open there, or a dead letter holds it. Shared by the API's fan-out and hookd.enqueue.
CREATE FUNCTION hookd.ordering_blocked(p_endpoint uuid, p_key text) RETURNS boolean
LANGUAGE sql STABLE AS $$
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

-- Where a replayed delivery goes: a keyed one of an endpoint that orders by key waits in
-- line (hookd.ordering_advance lets it go when its turn comes); any other is due now.
CREATE FUNCTION hookd.ordering_replay_at(p_endpoint uuid, p_key text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN p_key IS NOT NULL
                   AND EXISTS (SELECT 1 FROM hookd.endpoints e
                               WHERE e.id = p_endpoint AND e.ordering = 'perKey')
              THEN hookd.ordering_waiting() ELSE now() END
$$;

-- The advisory lock a key's enqueues and replays take (db::events::lock_keys, seed 1).
CREATE FUNCTION hookd.ordering_lock_id(p_tenant text, p_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT hashtextextended(p_tenant || E'\n' || p_key, 1) $$;

-- Promotes the next delivery of each advanced key whose line is free: nothing of the key
-- on its way, no dead letter holding it. Run by every dispatcher's line mover
-- (db::deliveries::advance_lines), off the claim's path. Never waits: a line another call
-- is moving, or a candidate someone holds, is passed over and its advance written again
-- for the next call. Returns the number of advances processed.
--
-- Two calls must never move one line at once: each would see the line free in its own
-- snapshot and could pick a different delivery (one a replay just put back in line), and
-- two of the key would be on their way. So the lines are try-locked first (a
-- transaction-scoped lock per endpoint and key), and what to promote is decided by a
-- later statement, whose snapshot is taken with those locks held: it sees whatever any
-- earlier mover of the line committed.
CREATE FUNCTION hookd.ordering_advance(batch int) RETURNS int
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $$
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

-- The queue triggers of 0008/0020, which now also keep the lines moving: a keyed row
-- inserted waiting, or replayed into waiting, or that ended (succeeded, dead, cancelled),
-- advances its key; a keyed row that died holds its key when its endpoint says `hold`, and
-- one replayed from dead releases it. Waiting rows wake no queue entry: they are not due.
CREATE OR REPLACE FUNCTION hookd.deliveries_queue_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
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
ALTER FUNCTION hookd.deliveries_queue_insert() SET plan_cache_mode = force_generic_plan;

CREATE OR REPLACE FUNCTION hookd.deliveries_queue_update() RETURNS trigger
LANGUAGE plpgsql AS $$
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
ALTER FUNCTION hookd.deliveries_queue_update() SET plan_cache_mode = force_generic_plan;

-- A queue entry follows an endpoint's earliest row on its way; rows waiting in a key's
-- line are not (0022's function, with that one condition added).
CREATE OR REPLACE FUNCTION hookd.endpoint_queue_refresh(ids uuid[], served uuid[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  locked uuid[];
BEGIN
  SELECT coalesce(array_agg(l.endpoint_id), '{}') INTO locked FROM (
    SELECT q.endpoint_id FROM hookd.endpoint_queue q
    WHERE q.endpoint_id = ANY (ids)
    ORDER BY q.endpoint_id
    FOR UPDATE SKIP LOCKED
  ) l;
  -- entries another transaction holds: refreshed again once this one commits
  INSERT INTO hookd.endpoint_rechecks (endpoint_id)
  SELECT q.endpoint_id FROM hookd.endpoint_queue q
  WHERE q.endpoint_id = ANY (ids) AND q.endpoint_id <> ALL (locked);
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
    DELETE FROM hookd.endpoint_queue q USING m
    WHERE q.endpoint_id = m.id AND q.endpoint_id = ANY (locked) AND m.due IS NULL
  )
  UPDATE hookd.endpoint_queue q
  SET due_at = m.due,
      served_at = CASE WHEN q.endpoint_id = ANY (served) THEN now() ELSE q.served_at END
  FROM m
  WHERE q.endpoint_id = m.id AND q.endpoint_id = ANY (locked) AND m.due IS NOT NULL
    AND (q.due_at IS DISTINCT FROM m.due OR q.endpoint_id = ANY (served));
END
$$;

-- An endpoint that stops ordering releases every delivery waiting in its lines; one that
-- stops holding keys after a dead letter lets each held line move on.
CREATE FUNCTION hookd.endpoint_ordering_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
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
CREATE TRIGGER endpoints_ordering AFTER UPDATE OF ordering, on_dead_letter ON hookd.endpoints
  FOR EACH ROW
  WHEN (OLD.ordering IS DISTINCT FROM NEW.ordering OR OLD.on_dead_letter IS DISTINCT FROM NEW.on_dead_letter)
  EXECUTE FUNCTION hookd.endpoint_ordering_changed();
-- An endpoint row deleted takes its holds with it.
CREATE FUNCTION hookd.endpoint_ordering_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM hookd.ordering_holds h USING old_rows o WHERE h.endpoint_id = o.id;
  RETURN NULL;
END
$$;
CREATE TRIGGER endpoints_ordering_gone AFTER DELETE ON hookd.endpoints
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION hookd.endpoint_ordering_gone();

-- hookd.enqueue with an ordering key: 0031's body, taking the key's lock and placing
-- each delivery in its key's line. The five-argument form calls it without a key.
CREATE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text, consumer text,
                              ordering_key text)
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
$$;
REVOKE ALL ON FUNCTION hookd.enqueue(text, text, text, text, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION hookd.enqueue(tenant text, event_type text, payload text, idempotency_key text, consumer text)
RETURNS uuid
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT hookd.enqueue(tenant, event_type, payload, idempotency_key, consumer, NULL::text) $$;

-- Whoever may call the 5-argument form may call the 6-argument one.
DO $$
DECLARE r record;
BEGIN
  FOR r IN
    SELECT DISTINCT a.grantee::regrole::text AS role
    FROM pg_proc p, aclexplode(p.proacl) a
    WHERE p.oid = 'hookd.enqueue(text, text, text, text, text)'::regprocedure
      AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION hookd.enqueue(text, text, text, text, text, text) TO %s', r.role);
  END LOOP;
END
$$;
