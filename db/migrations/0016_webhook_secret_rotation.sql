-- Secret rotation: when an endpoint's secret changes, the one it replaces
-- keeps signing beside it until previous_secret_until, so a receiver that
-- still verifies with the old secret, or already with the new one, accepts
-- every delivery meanwhile (the Standard Webhooks header carries both
-- signatures, "v1,<new> v1,<old>"). Expand only: a release from before
-- ignores both columns and signs with the current secret.
ALTER TABLE webhook_endpoints
    ADD COLUMN previous_secret text CHECK (previous_secret IS NULL OR previous_secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$'),
    ADD COLUMN previous_secret_until timestamptz;
