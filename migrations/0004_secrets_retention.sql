-- Signing secrets encrypted at rest (src/crypto.rs) and the retention of terminal rows.

-- Encrypted secrets: `ciphertext` is nonce || XChaCha20-Poly1305 ciphertext || tag, sealed
-- for this row's endpoint under the key named by `key_id`; `fingerprint` becomes a keyed
-- HMAC under the same key (see crypto.rs), so a dump reveals neither the secret nor a way
-- to confirm a guess of it.
--
-- The plaintext column is renamed rather than dropped: rows written before this
-- migration still hold their secret there, and no SQL can encrypt them (the key never
-- reaches the database). `hookd rekey`, and every dispatcher when it starts, encrypt
-- them and set the column to NULL. The rename also makes a pre-upgrade binary still
-- running fail loudly instead of writing new plaintext.
ALTER TABLE hookd.endpoint_secrets RENAME COLUMN secret TO plaintext_secret;
ALTER TABLE hookd.endpoint_secrets
    ALTER COLUMN plaintext_secret DROP NOT NULL,
    ADD COLUMN key_id text,
    ADD COLUMN ciphertext bytea;
-- Exactly one form per row: encrypted (key id and ciphertext), or the legacy plaintext
-- awaiting encryption. NOT VALID is not needed: the table holds a few rows per endpoint.
ALTER TABLE hookd.endpoint_secrets ADD CONSTRAINT endpoint_secrets_one_form CHECK (
    (ciphertext IS NOT NULL AND key_id IS NOT NULL AND plaintext_secret IS NULL)
    OR (ciphertext IS NULL AND key_id IS NULL AND plaintext_secret IS NOT NULL)
);
-- `hookd rekey` walks the rows not under the active key; the table is small, so the
-- primary key order is all it needs.

-- Retention needs no new index. Pruning walks each endpoint's deliveries through the
-- existing deliveries_endpoint_created (endpoint_id, created_at) index, and finds events
-- without deliveries by primary-key range (ids are UUIDv7, so "older than" is "id below
-- the UUIDv7 floor of the cutoff"). The hot insert path and the claim index
-- deliveries_claimable, which terminal rows never enter, are unchanged.
