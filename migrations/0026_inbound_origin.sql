-- An inbound event keeps where it came from (issue 33): the source's name, the provider's
-- own event id, and the request headers its provider documents (signature, id, type,
-- timestamp, delivery attempt, ...), kept with the exact body. The dispatcher sends the
-- first two on with every delivery (`hookd-source`, `hookd-source-event-id`).
--
-- Nullable columns without a default: adding them rewrites nothing and holds the table's
-- lock only for the catalog change. Produced events leave them NULL, which costs a row
-- nothing (events already carry a null bitmap).
ALTER TABLE hookd.events
    ADD COLUMN source text,
    ADD COLUMN source_event_id text,
    ADD COLUMN source_headers jsonb;
