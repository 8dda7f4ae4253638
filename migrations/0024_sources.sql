-- Inbound sources (issue 33): a third-party provider's webhooks, received at
-- POST /in/{name}, verified with the source's secrets and enqueued for its tenant.
-- `name` is the route's key, so it is unique across tenants (a lower-case DNS label).
CREATE TABLE hookd.sources (
    id                uuid PRIMARY KEY,
    name              text NOT NULL CONSTRAINT sources_name_unique UNIQUE
                      CONSTRAINT sources_name_label CHECK (name ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    tenant            text NOT NULL,
    consumer          text,
    provider          text NOT NULL CONSTRAINT sources_provider
                      CHECK (provider IN ('standard-webhooks', 'stripe', 'github', 'shopify', 'slack', 'hmac')),
    -- the generic scheme (header, algorithm, encoding, prefix, …), for provider 'hmac' only
    hmac              jsonb,
    event_type_prefix text NOT NULL,
    max_body_bytes    integer NOT NULL CONSTRAINT sources_max_body CHECK (max_body_bytes BETWEEN 1 AND 16777216),
    description       text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sources_hmac_scheme CHECK ((provider = 'hmac') = (hmac IS NOT NULL))
);
CREATE INDEX sources_tenant_name ON hookd.sources (tenant, name);

-- A source's verification secrets, sealed like endpoints' signing secrets (the AEAD's
-- associated data binds each to its source id). Several are valid during a rotation.
CREATE TABLE hookd.source_secrets (
    source_id  uuid NOT NULL REFERENCES hookd.sources (id) ON DELETE CASCADE,
    version    integer NOT NULL,
    key_id     text NOT NULL,
    ciphertext bytea NOT NULL,
    -- NULL: current; else it stops verifying at this time
    not_after  timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_id, version)
);
