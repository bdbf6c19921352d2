package events

import (
	"context"
	"slices"
	"time"
)

// verdict is what a transport is told about one delivery.
type verdict struct {
	ack bool
	// redeliver: deliver it again after delay (NATS: Nak; River: a snooze,
	// or an error when failed).
	redeliver bool
	delay     time.Duration
	// failed: the transport hears "the handler failed" (River counts an
	// attempt and retries; NATS has only the Nak).
	failed bool
	// silent: say nothing at all; the transport's ack deadline passes and
	// it redelivers on its own (the injector's lose_ack).
	silent bool
	// outcome is the consumer rule's (OutcomeApplied, OutcomeDuplicate)
	// when the delivery was handled; a transport that answers a request
	// (Cloud Tasks' push) says it.
	outcome string
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

// holdBound bounds how long hold_past_deadline waits, after the deadline,
// for another instance to apply the delivery (River's rescuer passes every
// 30 s).
const holdBound = time.Minute

// process takes one delivery through the injector and the consumer rule,
// and returns what to tell the transport. It is the same for every
// transport; only how the verdict is carried out differs.
func process(ctx context.Context, h *Handler, inj *Injector, side transportSide, d Delivery) verdict {
	modes := side.modes
	if d.Attempt > 1 {
		// Only a first delivery is held: holding the copy the transport
		// handed on would have two instances wait for each other.
		modes = slices.DeleteFunc(slices.Clone(modes), func(m Mode) bool { return m == HoldPastDeadline })
	}
	mode, err := inj.take(ctx, h.Consumer(), modes...)
	if err != nil {
		h.logger.Warn("events: injector unavailable; delivering normally", "err", err)
	}
	d.Injected = mode
	switch mode {
	case OutOfOrder:
		h.Defer(ctx, d, "sent back unhandled so the events behind it overtake it")
		return verdict{redeliver: true, delay: outOfOrderDelay}
	case HoldPastDeadline:
		// Sit on it past the ack deadline, until the transport has handed
		// it to another instance and that one applied it (bounded). The
		// transport may cancel ctx at its own deadline (River's job
		// timeout): a handler that outlives it is the point, so the hold
		// does not watch ctx, and the handling that follows ignores it.
		h.hold(ctx, d)
		time.Sleep(side.ackDeadline + holdMargin)
		h.waitApplied(context.WithoutCancel(ctx), d.ID, holdBound)
		ctx = context.WithoutCancel(ctx)
	}
	outcome, err := h.Handle(ctx, d)
	if err != nil {
		h.logger.Warn("events: delivery failed; the transport redelivers it", "consumer", h.Consumer(),
			"event", d.ID, "err", err)
		return verdict{redeliver: true, failed: true, delay: side.retryAfter}
	}
	switch mode {
	case FailAfterCommit:
		return verdict{redeliver: true, failed: true, outcome: outcome} // committed, but the transport hears "failed"
	case LoseAck:
		return verdict{silent: true, outcome: outcome}
	case DeliverTwice:
		return verdict{redeliver: true, outcome: outcome}
	case AfterWindow:
		return verdict{redeliver: true, delay: side.window + time.Second, outcome: outcome}
	}
	return verdict{ack: true, outcome: outcome}
}
