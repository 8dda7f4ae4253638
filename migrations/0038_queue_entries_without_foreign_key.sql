-- A queue entry no longer has a foreign key to its endpoint.
--
-- The fold of wake-ups (db::deliveries::fold_wakeups) inserts an entry for each endpoint
-- that got work; for thousands of customers' endpoints with a delivery or two each, that is
-- an entry per delivery. The foreign key made Postgres check each inserted entry with a
-- query of its own (a primary-key probe of hookd.endpoints taking FOR KEY SHARE, run from
-- an after-row trigger event): 29 ms of the 95 ms a fold of 10,000 wake-ups took. The fold
-- reads each entry's endpoint by primary key already, FOR SHARE, so an endpoint that is
-- gone never gets an entry, and one cannot be deleted before the entry that names it has
-- committed. The key's other duty, removing an endpoint's entry with its row, moves to the
-- trigger below. Endpoints are disabled rather than deleted; only an operator deletes a row.
ALTER TABLE hookd.endpoint_queue DROP CONSTRAINT endpoint_queue_endpoint_id_fkey;

-- After the statement's own cascades (its deliveries go with their foreign key), so their
-- queue triggers cannot leave the entry behind.
CREATE FUNCTION hookd.endpoints_queue_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM hookd.endpoint_queue q USING gone g WHERE q.endpoint_id = g.id;
  RETURN NULL;
END
$$;

CREATE TRIGGER endpoints_queue_gone
    AFTER DELETE ON hookd.endpoints
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION hookd.endpoints_queue_gone();

-- (The claim statement now walks the tenants through hookd.endpoint_queue_tenants() as well,
-- migration 0037's function, instead of keeping a copy of the walk inline: the same plan.)
