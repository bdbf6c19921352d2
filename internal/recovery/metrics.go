package recovery

import "github.com/prometheus/client_golang/prometheus"

// loopMetrics are the loop's Prometheus series, registered on the app's
// registry (Config.Registerer).
type loopMetrics struct {
	recovered *prometheus.CounterVec // by outcome
	claims    *prometheus.CounterVec // by strategy
	polls     prometheus.Counter
	lag       prometheus.Gauge
}

func newLoopMetrics(reg prometheus.Registerer) *loopMetrics {
	m := &loopMetrics{
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemlab_recovery_operations_total",
			Help: "Claimed operations by how their recovery attempt ended (succeeded, failed, needs_reconciliation, backed_off, fenced).",
		}, []string{"outcome"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemlab_recovery_claims_total",
			Help: "Stale operations claimed by this instance, by claim strategy.",
		}, []string{"strategy"}),
		polls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemlab_recovery_polls_total",
			Help: "Provider status queries made while polling a RUNNING or unreachable operation.",
		}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemlab_recovery_lag_seconds",
			Help: "How long the oldest claimable (stale) operation has been waiting, as of the last pass.",
		}),
	}
	for _, o := range Outcomes { // every series exists from the start, at 0
		m.recovered.WithLabelValues(string(o))
	}
	if reg != nil {
		reg.MustRegister(m.recovered, m.claims, m.polls, m.lag)
	}
	return m
}
