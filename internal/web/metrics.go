package web

import (
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the HTTP layer's collectors on this process's Prometheus
// registry (made by cmd/web, shared with the background loops). It is not
// the global default, so several servers in one test binary never collide.
type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newMetrics(reg *prometheus.Registry, pool *pgxpool.Pool) *metrics {
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemlab_http_requests_total",
			Help: "HTTP requests by route pattern, method and status.",
		}, []string{"route", "method", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemlab_http_request_duration_seconds",
			Help:    "HTTP request latency by route pattern and method.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route", "method"}),
	}
	m.reg.MustRegister(m.requests, m.latency,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		poolCollector(pool))
	return m
}

func (m *metrics) handler() echo.HandlerFunc {
	return echo.WrapHandler(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
}

// measure records every request under its route pattern (not its raw path,
// which would make one series per policy id).
func (m *metrics) measure(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err) // write the response now so its status is known
		}
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		m.requests.WithLabelValues(route, c.Request().Method, strconv.Itoa(c.Response().Status)).Inc()
		m.latency.WithLabelValues(route, c.Request().Method).Observe(time.Since(start).Seconds())
		return nil
	}
}

// poolCollector exposes pgxpool's statistics as gauges read at scrape time.
func poolCollector(pool *pgxpool.Pool) prometheus.Collector {
	gauge := func(name, help string, f func(*pgxpool.Stat) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idemlab_db_pool_" + name, Help: help},
			func() float64 { return f(pool.Stat()) })
	}
	return multiCollector{
		gauge("total_conns", "Connections in the pool.", func(s *pgxpool.Stat) float64 { return float64(s.TotalConns()) }),
		gauge("acquired_conns", "Connections in use.", func(s *pgxpool.Stat) float64 { return float64(s.AcquiredConns()) }),
		gauge("idle_conns", "Idle connections.", func(s *pgxpool.Stat) float64 { return float64(s.IdleConns()) }),
		gauge("max_conns", "Pool size (DB_MAX_CONNS).", func(s *pgxpool.Stat) float64 { return float64(s.MaxConns()) }),
		gauge("acquire_wait_seconds_total", "Time spent waiting for a connection.", func(s *pgxpool.Stat) float64 { return s.AcquireDuration().Seconds() }),
		gauge("empty_acquire_total", "Acquires that had to wait for a connection.", func(s *pgxpool.Stat) float64 { return float64(s.EmptyAcquireCount()) }),
	}
}

type multiCollector []prometheus.Collector

func (mc multiCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range mc {
		c.Describe(ch)
	}
}

func (mc multiCollector) Collect(ch chan<- prometheus.Metric) {
	for _, c := range mc {
		c.Collect(ch)
	}
}
