// Package tracing carries one W3C trace across every process an operation
// touches: the API request, its calls to the provider and payments, the
// recovery that resumes it after a crash or a lost answer, and the event
// it publishes, to each consumer. It is OpenTelemetry's Go SDK behind four
// small functions, so the code that does the work names a trace in one
// line and never an exporter.
//
// Between processes the trace travels as a traceparent (W3C Trace Context,
// "00-<trace id>-<span id>-<flags>"): in HTTP headers (otelhttp), and, where
// the work waits in a table, in a column beside it — operation_steps (what
// recovery resumes) and outbox (what the relay publishes). A stored
// traceparent is a remote parent: the process that picks the row up later
// continues the same trace.
//
// Spans are exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, and to nothing otherwise:
// trace ids are still made and stored, so the operation page can name them.
package tracing

import (
	"context"
	"net/http"
	"os"
	"sync"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// W3C Trace Context: the one propagation format, in headers and columns.
var propagator = propagation.TraceContext{}

var setup sync.Once

// Setup installs this process's tracer provider (once; a second call does
// nothing) and returns the function that flushes it at shutdown. service
// names the process in the traces: "idemlab", "idemlab-provider", …
//
// OpenTelemetry's provider is process-wide by the library's design: every
// instrumented client and server finds it there, so this is the one place
// that sets it.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	shutdown = func(context.Context) error { return nil }
	setup.Do(func() {
		opts := []sdktrace.TracerProviderOption{
			sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))),
		}
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
			exp, e := otlptracehttp.New(ctx) // the endpoint, headers and protocol from OTEL_* variables
			if e != nil {
				err = e
				return
			}
			opts = append(opts, sdktrace.WithBatcher(exp)) // OTEL_BSP_* tune the batches
		}
		tp := sdktrace.NewTracerProvider(opts...)
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(propagator)
		shutdown = tp.Shutdown
	})
	return shutdown, err
}

// Start begins a span named name: the child of parent, a traceparent
// stored with the work (a step recovery resumes, an event a consumer
// applies), which belongs to the trace that stored it whatever carried it
// here; under ctx's span when parent is "".
func Start(ctx context.Context, name, parent string) (context.Context, trace.Span) {
	if parent != "" {
		ctx = propagator.Extract(ctx, propagation.MapCarrier{"traceparent": parent})
	}
	return otel.Tracer("idemlab").Start(ctx, name)
}

// Parent is ctx's span as a traceparent, to store beside work another
// process will pick up; "" when ctx has no span.
func Parent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c["traceparent"]
}

// TraceID is the trace id inside a stored traceparent ("" when none).
func TraceID(traceparent string) string {
	sc := trace.SpanContextFromContext(propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent}))
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// Handler traces every request h serves, continuing the caller's trace
// when its request carries a traceparent.
func Handler(h http.Handler, service string) http.Handler {
	return otelhttp.NewHandler(h, service, otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
		return r.Method + " " + r.URL.Path
	}))
}

// Transport sends ctx's trace with every request (the traceparent header).
func Transport(base http.RoundTripper) http.RoundTripper {
	return otelhttp.NewTransport(base)
}
