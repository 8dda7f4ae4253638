-- Static API tokens (`hookd token create`). The token itself is never stored: only its
-- SHA-256, which is what the API looks a presented token up by. A fast hash is right here
-- and a password hash (argon2, bcrypt) is not: tokens are 256 bits from the OS RNG, so
-- there is nothing to brute-force offline, and the lookup runs on every cache miss of the
-- ingest path. `prefix` is the first characters of the token, kept so that operators can
-- match a leaked or listed token to its row; it is too short to authenticate anything.
CREATE TABLE hookd.api_tokens (
    id          uuid PRIMARY KEY,
    token_hash  bytea NOT NULL CHECK (length(token_hash) = 32),
    prefix      text NOT NULL,
    tenant      text NOT NULL CHECK (tenant ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    scopes      text[] NOT NULL
                CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['produce', 'read', 'operate']),
    name        text CHECK (name IS NULL OR length(name) <= 200),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    revoked_at  timestamptz
);
CREATE UNIQUE INDEX api_tokens_hash ON hookd.api_tokens (token_hash);
