-- An endpoint's last success is read from its deliveries, not kept on its row.
--
-- The circuit statement wrote last_success_at on an endpoint's first success in every second,
-- so a drain of 10,000 endpoints x 1 row locked and rewrote 10,000 endpoint rows that had
-- nothing else to record: about 150 ms of the drain's 1.25 s of Postgres statements
-- (pg_stat_statements, hookd-bench --only trickle). The API and the controller now read it
-- from the endpoint's newest succeeded delivery and its attempt (db::endpoints::last_success).
-- last_failure_at stays: a failure writes the row's breaker counts anyway.
--
-- The column stays for one release: dispatchers of the previous release still write it
-- until the controller has rolled them to the new image. Nothing reads it.
COMMENT ON COLUMN hookd.endpoints.last_success_at IS
  'unused since migration 0036 (read from the newest succeeded delivery); dropped in a later release';
