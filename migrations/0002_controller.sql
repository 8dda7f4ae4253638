-- What the controller shows in WebhookEndpoint status without scanning history: when the
-- endpoint last had a delivery succeed and fail. The completer writes them in the same
-- statement that maintains the circuit breaker, at most once a second per endpoint on
-- success, so the steady state does not turn every delivery into an endpoint-row write.
ALTER TABLE hookd.endpoints
    ADD COLUMN last_success_at timestamptz,
    ADD COLUMN last_failure_at timestamptz;
