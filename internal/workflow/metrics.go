package workflow

import "github.com/prometheus/client_golang/prometheus"

// metrics are the engine's Prometheus series.
type metrics struct {
	// fenced counts late writes refused by the fence, by operation type:
	// each is a zombie owner stopped before it could overwrite the new
	// owner's work (and a line on the operation's timeline).
	fenced *prometheus.CounterVec
	// cancels counts cancel requests honoured by an owner, by operation
	// type and what followed (cancel.go: stopped, compensating, to_person).
	cancels *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		fenced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemlab_workflow_fenced_writes_total",
			Help: "Step and operation writes refused because the writer no longer owned the operation (a zombie's late write).",
		}, []string{"operation_type"}),
		cancels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemlab_workflow_cancels_total",
			Help: "Cancel requests an owner honoured before a step, by what followed: stopped, compensating, to_person.",
		}, []string{"operation_type", "outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.fenced, m.cancels)
	}
	return m
}
