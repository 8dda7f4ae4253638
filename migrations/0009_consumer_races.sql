-- Consumers under concurrency (issue 15, found by a hostile review): an enqueue that read
-- a consumer's endpoints as live just before the consumer was deleted commits deliveries
-- for disabled endpoints. They are cancelled by the dispatchers' straggler sweep, which
-- until now only looked at endpoints removed outright. Deleting a consumer stamps its
-- endpoints, and the sweep probes the endpoints stamped in the last day (one bounded index
-- range each), so its cost follows recent deletions, not the number of endpoints.
ALTER TABLE hookd.endpoints ADD COLUMN consumer_deleted_at timestamptz;
CREATE INDEX endpoints_consumer_deleted ON hookd.endpoints (consumer_deleted_at)
    WHERE consumer_deleted_at IS NOT NULL;
