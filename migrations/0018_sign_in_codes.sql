-- Tokens never enter a browser's history (issue 29 item 5).
--
-- A browser page (the portal, the console) never holds the token it was opened or signed
-- in with: it exchanges it, or a one-time sign-in code standing for it, for a session of
-- its own (POST /v1/sessions, POST /v1/sessions/from-code). Whatever a browser keeps on disk
-- (its history, session restore files, sessionStorage) then holds at most that session,
-- which expires within hours and dies with the token it came from.

-- ---- Sessions ----
-- A session is an ordinary API token (same verification, listing and revocation) made from
-- another one: its parent. Revoking a token revokes its sessions in the same statement.
ALTER TABLE hookd.api_tokens
    ADD COLUMN parent_id uuid REFERENCES hookd.api_tokens (id) ON DELETE CASCADE;
CREATE INDEX api_tokens_parent ON hookd.api_tokens (parent_id) WHERE parent_id IS NOT NULL;

CREATE FUNCTION hookd.revoke_sessions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- one level here; the UPDATE fires this trigger again for sessions of sessions
    UPDATE hookd.api_tokens SET revoked_at = NEW.revoked_at
    WHERE parent_id = NEW.id AND revoked_at IS NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER api_tokens_revoke_sessions
    AFTER UPDATE OF revoked_at ON hookd.api_tokens
    FOR EACH ROW WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
    EXECUTE FUNCTION hookd.revoke_sessions();

-- ---- One-time sign-in codes ----
-- What a portal link carries instead of a token: 256 random bits, stored as their SHA-256
-- (like tokens), good for one exchange within minutes. The exchange deletes the row, so a
-- replayed code finds nothing.
CREATE TABLE hookd.sign_in_codes (
    code_hash   bytea PRIMARY KEY CHECK (length(code_hash) = 32),
    token_id    uuid NOT NULL REFERENCES hookd.api_tokens (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX sign_in_codes_expiry ON hookd.sign_in_codes (expires_at);
