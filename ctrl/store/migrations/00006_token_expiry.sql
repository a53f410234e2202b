-- Token expiry, and finding revocations quickly. expires_at (unix ms, NULL:
-- never) is checked on every call and ends a token's open streams when it
-- passes. Every ctrl polls for tokens revoked recently (by `ctrl token
-- revoke`, `ctrl cluster revoke` or another replica) to close their open
-- streams at once: api_tokens_revoked serves that range scan.

-- +goose Up
ALTER TABLE api_tokens
  ADD COLUMN expires_at BIGINT NULL AFTER created_at,
  ADD KEY api_tokens_revoked (revoked_at);

-- +goose Down
ALTER TABLE api_tokens
  DROP KEY api_tokens_revoked,
  DROP COLUMN expires_at;
