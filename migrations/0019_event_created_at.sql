-- An event's created_at is the moment its row is inserted, not its transaction's start.
--
-- Retention deletes the events of dropped history days in bulk (db::retention::
-- dropped_days_end): it relies on an event's deliveries being minted (UUIDv7 ids, which
-- place them in a history day) within a day of the event's created_at. The API inserts an
-- event and its deliveries in one statement; `hookd.enqueue` in two statements of one call;
-- but with now() a producer's transaction opened a day before it called hookd.enqueue
-- would date its event a day before its deliveries. clock_timestamp() dates it at the
-- insert. A metadata-only change: no row is rewritten and the lock is brief. It waits at
-- most 10 s for producers' open transactions (while it waits, new enqueues queue behind
-- it); past that `hookd migrate` fails with a lock timeout and can simply be run again.
SET LOCAL lock_timeout = '10s';
ALTER TABLE hookd.events ALTER COLUMN created_at SET DEFAULT clock_timestamp();
