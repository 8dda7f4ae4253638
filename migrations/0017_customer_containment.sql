-- Customers are contained (issue 29, DESIGN.md invariant 11).

-- ---- Consumer generations ----
-- A consumer uid can be deleted and created again by the producer (uids are its own
-- names, often reused). Each incarnation gets a generation from one sequence; endpoints
-- and tokens made for a consumer carry the generation they were made for, so a later
-- consumer with the same uid neither sees nor re-enables what the earlier one left, and a
-- token of the earlier one is dead even before any revocation reaches it.
CREATE SEQUENCE hookd.consumer_generations;
ALTER TABLE hookd.consumers
    ADD COLUMN generation bigint NOT NULL DEFAULT nextval('hookd.consumer_generations');

ALTER TABLE hookd.endpoints ADD COLUMN consumer_generation bigint;
UPDATE hookd.endpoints e SET consumer_generation = c.generation
FROM hookd.consumers c
WHERE c.tenant = e.tenant AND c.uid = e.consumer AND e.consumer_deleted_at IS NULL;

ALTER TABLE hookd.api_tokens ADD COLUMN consumer_generation bigint;
UPDATE hookd.api_tokens t SET consumer_generation = c.generation
FROM hookd.consumers c
WHERE c.tenant = t.tenant AND c.uid = t.consumer;

-- A consumer token never carries `produce` (consumers do not enqueue, and with it a
-- customer could squat the tenant's idempotency keys). Older rows are kept (NOT VALID) and
-- their `produce` is ignored when they are verified.
ALTER TABLE hookd.api_tokens ADD CONSTRAINT api_tokens_consumer_never_produces
    CHECK (consumer IS NULL OR NOT ('produce' = ANY (scopes))) NOT VALID;

-- GET /v1/tokens: a tenant's tokens newest first, keyset-paged on the UUIDv7 id
CREATE INDEX api_tokens_tenant_page ON hookd.api_tokens (tenant, id);

-- ---- Consumer deletions ----
-- Deleting a consumer revokes its tokens and removes its subscriptions at once; disabling
-- its endpoints and cancelling their open deliveries runs afterwards in bounded batches
-- (one short transaction each), recorded here so that progress is visible and any API
-- process resumes a deletion whose process died.
CREATE TABLE hookd.consumer_deletions (
    id                   uuid PRIMARY KEY,
    tenant               text NOT NULL,
    uid                  text NOT NULL,
    generation           bigint NOT NULL,
    -- 'endpoints' (disabling them), 'deliveries' (cancelling), 'done'
    phase                text NOT NULL DEFAULT 'endpoints'
                         CHECK (phase IN ('endpoints', 'deliveries', 'done')),
    -- keyset position of the phase: the last endpoint id handled
    cursor_id            uuid,
    tokens_revoked       bigint NOT NULL DEFAULT 0,
    endpoints_disabled   bigint NOT NULL DEFAULT 0,
    deliveries_cancelled bigint NOT NULL DEFAULT 0,
    requested_at         timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    completed_at         timestamptz
);
CREATE INDEX consumer_deletions_open ON hookd.consumer_deletions (requested_at)
    WHERE completed_at IS NULL;
CREATE INDEX consumer_deletions_tenant ON hookd.consumer_deletions (tenant, uid, requested_at);

-- Endpoints of a consumer generation, for the per-consumer cap and the deletion batches.
CREATE INDEX endpoints_consumer_generation ON hookd.endpoints (tenant, consumer, consumer_generation, id)
    WHERE removed_at IS NULL AND consumer IS NOT NULL;
-- The per-tenant cap counts a tenant's live API endpoints under a per-tenant lock: an
-- index-only count of this index, never a read of the rows.
CREATE INDEX endpoints_api_live ON hookd.endpoints (tenant)
    WHERE managed_by = 'api' AND removed_at IS NULL AND consumer_deleted_at IS NULL;
