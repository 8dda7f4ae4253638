-- Why a dispatcher holds an endpoint's deliveries on its own side (issue 19): a signing
-- secret it could not decrypt (a key missing from its keyring, or a damaged row). Such
-- deliveries are held, not sent and not counted; without this the only trace was each
-- delivery's lastError and the dispatcher's log. Set by the outcome writer when it holds
-- a delivery; cleared by the next attempt that was sent. Shown in the endpoint's status
-- (API and WebhookEndpoint). No trigger watches these columns.
ALTER TABLE hookd.endpoints
    ADD COLUMN secret_unreadable text,
    ADD COLUMN secret_unreadable_since timestamptz;
