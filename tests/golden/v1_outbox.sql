-- proto_version: 1
-- options:
-- A transactional outbox row like the relay's, used by the benchmark.
CREATE TABLE outbox (
  id uuid PRIMARY KEY,
  aggregatetype text NOT NULL,
  aggregateid text NOT NULL,
  type text NOT NULL,
  payload jsonb NOT NULL,
  created_at timestamptz NOT NULL);
CREATE PUBLICATION golden_pub FOR TABLE outbox;
INSERT INTO outbox VALUES ('5f0c6f9e-2c5b-4b8e-9a55-0c7c2f1f4a11', 'order', 'order-1001', 'OrderCreated',
  '{"orderId": "order-1001", "customerId": "cust-42", "lines": [{"sku": "sku-1", "qty": 2, "price": "19.99"}, {"sku": "sku-2", "qty": 1, "price": "5.00"}], "currency": "EUR", "total": "44.98"}',
  '2024-01-02 03:04:05.123456+00');
