-- The queue keeps one index of turns, by tenant: endpoint_queue_turn (turn_at alone) goes.
--
-- Every queue entry is inserted once per endpoint with work, and rewritten (not in place:
-- its turn is indexed) each time a claim serves it, so each index on turn_at is written
-- once per entry and once per claim of it. With thousands of customers' endpoints taking a
-- delivery or two each, that is an index insert per delivery twice over. The claim reads
-- turns by tenant (endpoint_queue_tenant_turn, migration 0015); only the dispatcher's
-- next-due timer and its backlog sampler read the global order, and both walk the tenants
-- instead: two probes per tenant with entries, whatever the number of endpoints, as the
-- claim's own scan does.

-- The tenants with queue entries, in order: a loose scan of endpoint_queue_tenant_turn, one
-- probe per tenant whatever its number of entries (the walk the claim's own `tenants` step
-- makes inline, where its plan needs it). db::deliveries::next_due and backlog_sample read
-- each tenant's turns from here.
CREATE FUNCTION hookd.endpoint_queue_tenants()
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
  WITH RECURSIVE t AS (
    (SELECT q.tenant FROM hookd.endpoint_queue q ORDER BY q.tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT q.tenant FROM hookd.endpoint_queue q
            WHERE q.tenant > t.tenant ORDER BY q.tenant LIMIT 1)
    FROM t WHERE t.tenant IS NOT NULL
  )
  SELECT t.tenant FROM t WHERE t.tenant IS NOT NULL
$$;

DROP INDEX hookd.endpoint_queue_turn;
