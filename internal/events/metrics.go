package events

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the events package's Prometheus series. One value serves the
// relay and every consumer of a process; a nil *Metrics records nothing.
type Metrics struct {
	lag          *prometheus.GaugeVec   // age of the oldest due PENDING row, by transport
	publishes    *prometheus.CounterVec // by transport, result (acked, duplicate, failed)
	deliveries   *prometheus.CounterVec // by consumer, transport, outcome
	suppressed   *prometheus.CounterVec // duplicates suppressed, by consumer and layer
	deadLetters  *prometheus.CounterVec // rows moved to DEAD, by transport
	drainBacklog *prometheus.GaugeVec   // PENDING rows, by transport
}

// NewMetrics registers the series on reg (nil: unregistered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemlab_events_outbox_lag_seconds",
			Help: "Age of the oldest PENDING outbox row, as of the relay's last pass.",
		}, []string{"transport"}),
		drainBacklog: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemlab_events_outbox_pending",
			Help: "PENDING outbox rows, as of the relay's last pass.",
		}, []string{"transport"}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemlab_events_publishes_total",
			Help: "Publishes by the relay: acked (new to the broker), duplicate (the broker's dedupe window dropped it), failed.",
		}, []string{"transport", "result"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemlab_events_deliveries_total",
			Help: "Deliveries seen by consumers: applied, duplicate (the inbox had it), deferred, failed.",
		}, []string{"consumer", "transport", "outcome"}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemlab_events_duplicates_suppressed_total",
			Help: "Duplicates that produced no second effect, by consumer and the layer that caught them (broker, inbox).",
		}, []string{"consumer", "layer"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemlab_events_dead_letters_total",
			Help: "Outbox rows that failed to publish max-attempts times and were set DEAD.",
		}, []string{"transport"}),
	}
	if reg != nil {
		reg.MustRegister(m.lag, m.drainBacklog, m.publishes, m.deliveries, m.suppressed, m.deadLetters)
	}
	return m
}

func (m *Metrics) published(transport, result string, n int) {
	if m != nil && n > 0 {
		m.publishes.WithLabelValues(transport, result).Add(float64(n))
	}
}

func (m *Metrics) delivered(consumer, transport, outcome string) {
	if m == nil {
		return
	}
	m.deliveries.WithLabelValues(consumer, transport, outcome).Inc()
	if outcome == OutcomeDuplicate {
		m.suppressed.WithLabelValues(consumer, LayerInbox).Inc()
	}
}

// brokerDuplicate counts a publish the broker dropped as a duplicate: it
// suppressed a copy for every consumer.
func (m *Metrics) brokerDuplicate(transport string) {
	if m == nil {
		return
	}
	for _, c := range Consumers {
		m.suppressed.WithLabelValues(c, LayerBroker).Inc()
	}
}

func (m *Metrics) dead(transport string, n int) {
	if m != nil && n > 0 {
		m.deadLetters.WithLabelValues(transport).Add(float64(n))
	}
}

func (m *Metrics) backlog(transport string, pending int64, lagSeconds float64) {
	if m != nil {
		m.drainBacklog.WithLabelValues(transport).Set(float64(pending))
		m.lag.WithLabelValues(transport).Set(lagSeconds)
	}
}
