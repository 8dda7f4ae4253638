-- What a source was sent (issue 33's console page): requests to each source by hour and
-- outcome (accepted, duplicate, or why one was refused). Counters only: nothing of a
-- refused request is stored beyond them. Each API process adds what it counted every few
-- seconds, in one statement; rows older than two days are deleted as they are written.
-- No foreign key: a count for a source deleted meanwhile is harmless (it is read only
-- through a live source's id) and would otherwise fail the whole batch it came in.
CREATE TABLE hookd.source_requests (
    source_id uuid NOT NULL,
    hour      timestamptz NOT NULL,
    outcome   text NOT NULL,
    count     bigint NOT NULL,
    last_at   timestamptz NOT NULL,
    PRIMARY KEY (source_id, hour, outcome)
);
CREATE INDEX source_requests_hour ON hookd.source_requests (hour);

-- GET /v1/messages?source=: an inbound source's events, newest first, read like every
-- other filter (a listing costs what it returns). Partial: produced events (source NULL)
-- are not in it and cost nothing to write. Built in the migration's transaction, so an
-- upgrade holds writes to hookd.events while it reads the table (a few seconds per
-- million events).
CREATE INDEX events_source_page ON hookd.events (tenant, source, id) WHERE source IS NOT NULL;
