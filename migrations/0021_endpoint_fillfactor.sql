-- Room on each endpoints page for the row's next version, so the frequent small updates
-- of an endpoint (its circuit breaker and last success, written by outcome batches; its
-- half-open probe, by claims) stay HOT: on a full page each one wrote a new entry in every
-- index of the table (seven). A first success per endpoint, as when 10,000 customers each
-- get one event, was 19 us of Postgres time per delivery in `hookd-bench`.
-- Applies to pages written from now on; `VACUUM FULL hookd.endpoints` (or pg_repack)
-- rewrites existing ones. Changing a storage parameter does not block reads or writes.
ALTER TABLE hookd.endpoints SET (fillfactor = 80);
