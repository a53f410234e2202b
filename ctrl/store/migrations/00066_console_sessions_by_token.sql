-- krane:phase expand
--
-- A console session's token, indexed: sign-in ends the oldest sessions of
-- the signing-in token past its share (ctrl/store/console.go), and finds
-- them with this index instead of reading the whole table.

-- +goose Up
ALTER TABLE console_sessions ADD KEY console_sessions_token (token_id, created_at), ALGORITHM=INPLACE, LOCK=NONE;

-- +goose Down
ALTER TABLE console_sessions DROP KEY console_sessions_token;
