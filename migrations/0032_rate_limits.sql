-- Rate limits per endpoint (issue 34): at most `rate_per_second` deliveries a second, with
-- bursts of up to `rate_burst`, whichever dispatcher replica sends them.
--
-- A token bucket on the endpoint row, charged by the claim: the claim that leases an
-- endpoint's rows takes that many tokens in the same statement, under the row lock (two
-- replicas serving one endpoint take turns on its row; the second sees what the first
-- took). So there is no counter every send writes: a claim writes the bucket once for all
-- the rows it leases, only for limited endpoints, and an emptied bucket holds the
-- endpoint's queue entry until enough tokens for a useful claim are back (at most ~20
-- claims a second, whatever the rate). Rows held back are not leased, so they are not
-- attempts. Tokens are spent when a row is leased, not when it is sent: a send never
-- happens before its lease, so the receiver sees at most `rate_burst` at once and
-- `rate_per_second` a second after that.
ALTER TABLE hookd.endpoints
    ADD COLUMN rate_per_second double precision,
    ADD COLUMN rate_burst integer,
    -- the bucket: `rate_tokens` as of `rate_at` (NULL: full)
    ADD COLUMN rate_tokens double precision,
    ADD COLUMN rate_at timestamptz,
    -- when a claim left the bucket without a whole token: until then the endpoint's
    -- queue entry is held (hookd.endpoint_hold); a time in the past holds nothing
    ADD COLUMN rate_wait_until timestamptz,
    ADD CONSTRAINT endpoints_rate_limit CHECK (
        (rate_per_second IS NULL) = (rate_burst IS NULL)
        AND (rate_per_second IS NULL OR rate_per_second BETWEEN 0.01 AND 100000)
        AND (rate_burst IS NULL OR rate_burst BETWEEN 1 AND 100000)
        -- tokens are handed out in steps of 50 ms (hookd.rate_wait): a burst must hold one
        AND (rate_burst IS NULL OR rate_burst >= rate_per_second * 0.05));

-- The tokens in an endpoint's bucket at `at_time`.
CREATE FUNCTION hookd.rate_tokens(per_second double precision, burst integer,
                                  tokens double precision, since timestamptz,
                                  at_time timestamptz)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT least(burst::double precision,
               coalesce(tokens, burst::double precision)
               + greatest(0, extract(epoch FROM at_time - coalesce(since, at_time)))::double precision
                 * per_second)
$$;

-- After a claim leaves `left` tokens at `at_time`: NULL while a whole token is left, else
-- when the bucket holds enough for a useful claim again: 50 ms worth of tokens (so a fast
-- limit is served in batches, not a claim per token), at least one, at most the burst. A
-- millisecond over, so a claim at that time never finds 0.9999 of a token.
CREATE FUNCTION hookd.rate_wait(per_second double precision, burst integer,
                                "left" double precision, at_time timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN "left" >= 1 THEN NULL
              ELSE at_time + make_interval(secs =>
                     (least(burst::double precision, greatest(1, per_second * 0.05)) - "left")
                     / per_second + 0.001)
         END
$$;

-- When an endpoint's deliveries may be sent, from its row: as before (migration 0008),
-- and not before its rate limit's bucket has tokens again. greatest() ignores NULLs, and a
-- rate_wait_until in the past only says "now", which a turn already is.
CREATE FUNCTION hookd.endpoint_hold(state text, circuit_state text,
                                    circuit_open_until timestamptz, rate_wait_until timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT greatest(hookd.endpoint_hold(state, circuit_state, circuit_open_until), rate_wait_until)
$$;

-- A change of the rate wait alone, the limit unchanged, is a claim's (the claim statement
-- charges the bucket):
-- it never waits for the entry, which an outcome batch's refresh may hold until it commits
-- (a claim waiting here held up every tenant behind it, found by the hostile review). A
-- skipped hold leaves the entry due while the bucket is empty: claims then take nothing
-- from it until the tokens are back, which costs a read, not a delivery.
CREATE OR REPLACE FUNCTION hookd.endpoints_queue_hold() RETURNS trigger
LANGUAGE plpgsql AS $$
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

DROP TRIGGER endpoints_queue_hold ON hookd.endpoints;
CREATE TRIGGER endpoints_queue_hold
    AFTER UPDATE OF state, circuit_state, circuit_open_until, url, rate_wait_until ON hookd.endpoints
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state
                       OR OLD.circuit_state IS DISTINCT FROM NEW.circuit_state
                       OR OLD.circuit_open_until IS DISTINCT FROM NEW.circuit_open_until
                       OR OLD.rate_wait_until IS DISTINCT FROM NEW.rate_wait_until)
    EXECUTE FUNCTION hookd.endpoints_queue_hold();
