-- `hookd.delivery_attempts.error_class` holds a value of `ErrorClass` (src/domain/queue.rs)
-- or NULL (an attempt the receiver answered with 2xx). Without this CHECK a class written
-- by hand (SQL, a script) was accepted and made every read of that delivery's attempts
-- fail to decode (a 500). The test `sql_literals_are_the_values_of_the_queue_enums` reads
-- the constraint back and compares it with the enum, so a new class needs a migration.
--
-- NOT VALID: new and updated rows are checked at once, existing rows are not scanned.
-- This is the largest table (one row per attempt), and validating here would hold the
-- ACCESS EXCLUSIVE lock of ALTER TABLE, inside the migration's transaction, for the whole
-- scan, stopping every dispatcher's writes. hookd itself has only ever written these
-- values; to check rows written by hand, run at any time (a lock that lets writes go on):
--   ALTER TABLE hookd.delivery_attempts VALIDATE CONSTRAINT delivery_attempts_error_class;
ALTER TABLE hookd.delivery_attempts
    ADD CONSTRAINT delivery_attempts_error_class CHECK (error_class IN (
        'timeout', 'connect', 'dns', 'body', 'request', 'destination_forbidden',
        'invalid_url', 'http_status', 'gone', 'no_signing_secret', 'secret_unreadable'
    )) NOT VALID;
