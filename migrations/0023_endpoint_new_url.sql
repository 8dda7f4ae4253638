-- A new URL is a new destination: its circuit starts closed with no failures, and the
-- endpoint's configuration version moves on, so outcomes of sends to the old URL (which
-- carry the old version) no longer touch its circuit or state. Every door that changes a
-- URL (the endpoints API, a WebhookEndpoint through the controller or `hookd apply`, an
-- operator's own UPDATE) gets the rule here, once, instead of in each statement.
-- `UPDATE OF url` fires only for statements that set the column, so the hot path's
-- updates of an endpoint (circuit, last success, probe) never run it.
CREATE FUNCTION hookd.endpoint_new_url() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.circuit_state := 'closed';
    NEW.circuit_failures := 0;
    NEW.circuit_open_until := NULL;
    NEW.config_version := OLD.config_version + 1;
    RETURN NEW;
END
$$;

CREATE TRIGGER endpoints_new_url
    BEFORE UPDATE OF url ON hookd.endpoints
    FOR EACH ROW WHEN (NEW.url IS DISTINCT FROM OLD.url)
    EXECUTE FUNCTION hookd.endpoint_new_url();

-- Column-specific triggers fire on the columns a statement names, not on those a BEFORE
-- trigger changes: a statement that sets only `url` must still release the queue entry
-- its open circuit held, so the hold trigger also fires on `url` (its WHEN still compares
-- the values that decide the hold).
DROP TRIGGER endpoints_queue_hold ON hookd.endpoints;
CREATE TRIGGER endpoints_queue_hold
    AFTER UPDATE OF state, circuit_state, circuit_open_until, url ON hookd.endpoints
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state
                       OR OLD.circuit_state IS DISTINCT FROM NEW.circuit_state
                       OR OLD.circuit_open_until IS DISTINCT FROM NEW.circuit_open_until)
    EXECUTE FUNCTION hookd.endpoints_queue_hold();
