-- +goose Up

-- A delivery the injector's hold_past_deadline sits on is recorded as it
-- starts ('held'), before it is handled: a transport that keeps no delivery
-- count of its own (Kafka: offsets, not deliveries) learns from it that the
-- copy another instance receives meanwhile is a redelivery (internal/events).
ALTER TABLE event_deliveries DROP CONSTRAINT event_deliveries_outcome_check;
ALTER TABLE event_deliveries ADD CONSTRAINT event_deliveries_outcome_check
    CHECK (outcome IN ('applied', 'duplicate', 'deferred', 'failed', 'held'));

-- +goose Down
DELETE FROM event_deliveries WHERE outcome = 'held';
ALTER TABLE event_deliveries DROP CONSTRAINT event_deliveries_outcome_check;
ALTER TABLE event_deliveries ADD CONSTRAINT event_deliveries_outcome_check
    CHECK (outcome IN ('applied', 'duplicate', 'deferred', 'failed'));
