package events

import (
	"context"
	"time"
)

// verdict is what a transport is told about one delivery.
type verdict struct {
	ack bool
	// redeliver: deliver it again after delay (NATS: Nak; River: an error
	// or a snooze).
	redeliver bool
	delay     time.Duration
	// silent: say nothing at all; the transport's ack deadline passes and
	// it redelivers on its own (the injector's lose_ack).
	silent bool
}

// transportSide is what process needs to know about a transport.
type transportSide struct {
	// modes the injector may apply at delivery on this transport (the rest
	// are applied by the relay at publish).
	modes []Mode
	// ackDeadline is how long the transport waits for an ack before it
	// hands the delivery to someone else.
	ackDeadline time.Duration
	// window is the broker's dedupe window (after_window on a transport
	// without a relay waits this long before delivering again).
	window time.Duration
	// retryAfter is the wait before a failed delivery is redelivered.
	retryAfter time.Duration
}

// outOfOrderDelay is how long out_of_order sends a delivery back for:
// long enough for the events behind it to overtake it.
const outOfOrderDelay = time.Second

// holdMargin is how far past the ack deadline hold_past_deadline holds.
const holdMargin = 500 * time.Millisecond

// process takes one delivery through the injector and the consumer rule,
// and returns what to tell the transport. It is the same for every
// transport; only how the verdict is carried out differs.
func process(ctx context.Context, h *Handler, inj *Injector, side transportSide, d Delivery) verdict {
	mode, err := inj.take(ctx, h.Consumer(), side.modes...)
	if err != nil {
		h.logger.Warn("events: injector unavailable; delivering normally", "err", err)
	}
	d.Injected = mode
	switch mode {
	case OutOfOrder:
		h.Defer(ctx, d, "sent back unhandled so the events behind it overtake it")
		return verdict{redeliver: true, delay: outOfOrderDelay}
	case HoldPastDeadline:
		// Sit on it past the ack deadline: the transport gives it to
		// another instance meanwhile, and both handle it.
		select {
		case <-ctx.Done():
			return verdict{silent: true}
		case <-time.After(side.ackDeadline + holdMargin):
		}
		ctx = context.WithoutCancel(ctx) // the transport's deadline has passed: finish anyway
	}
	if _, err := h.Handle(ctx, d); err != nil {
		h.logger.Warn("events: delivery failed; the transport redelivers it", "consumer", h.Consumer(),
			"event", d.ID, "err", err)
		return verdict{redeliver: true, delay: side.retryAfter}
	}
	switch mode {
	case FailAfterCommit:
		return verdict{redeliver: true} // committed, but the transport hears "failed"
	case LoseAck:
		return verdict{silent: true}
	case DeliverTwice:
		return verdict{redeliver: true}
	case AfterWindow:
		return verdict{redeliver: true, delay: side.window + time.Second}
	}
	return verdict{ack: true}
}
