-- An API process keeps the sources it verifies with, their secrets opened, between
-- requests (issue 33: a database read per inbound request made inbound ingest 0.66x of
-- outbound). Any change to a source or its secrets notifies `hookd_sources` when it
-- commits, and every process that listens forgets what it kept: a deleted, changed or
-- rotated source stops verifying in every API replica when the notification arrives.
-- Statement-level and without a payload: sources change seldom, one notification per
-- transaction is enough (Postgres folds identical ones), and a bulk change costs one.
CREATE FUNCTION hookd.sources_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('hookd_sources', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER sources_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON hookd.sources
    FOR EACH STATEMENT EXECUTE FUNCTION hookd.sources_changed();
CREATE TRIGGER source_secrets_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON hookd.source_secrets
    FOR EACH STATEMENT EXECUTE FUNCTION hookd.sources_changed();
