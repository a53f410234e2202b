-- Nonces of ctrl's signed calls through Restate's ingress
-- (CtrlIngress.Call), each kept until the call's signature would expire
-- anyway, with the invocation that used it. A call seen on the wire and
-- sent again within its window names a nonce another invocation used, and
-- is refused; every ctrl replica sees the same table.

-- +goose Up
CREATE TABLE restate_call_nonces (
  nonce         VARCHAR(64)  NOT NULL,
  invocation_id VARCHAR(255) NOT NULL,
  expires_at    BIGINT       NOT NULL,
  PRIMARY KEY (nonce),
  KEY restate_call_nonces_expires (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE restate_call_nonces;
