// Package telemetrytest records what stagehand's components trace and measure, for tests: an OpenTelemetry SDK
// tracer provider writing to an in-memory exporter and a meter provider read through a manual reader.
package telemetrytest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Recorder holds the providers to hand to the components under test and what they recorded.
type Recorder struct {
	TracerProvider *sdktrace.TracerProvider
	MeterProvider  *sdkmetric.MeterProvider
	exporter       *tracetest.InMemoryExporter
	reader         *sdkmetric.ManualReader
}

// New returns a Recorder whose providers are shut down when the test ends. Spans are exported as they end.
func New(tb testing.TB) *Recorder {
	tb.Helper()
	r := &Recorder{exporter: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	r.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(r.exporter))
	r.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	tb.Cleanup(func() {
		_ = r.TracerProvider.Shutdown(context.Background())
		_ = r.MeterProvider.Shutdown(context.Background())
	})
	return r
}

// Spans returns the ended spans named name (every ended span when name is empty), in the order they ended.
func (r *Recorder) Spans(name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range r.exporter.GetSpans() {
		if name == "" || s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// Reset forgets the spans recorded so far.
func (r *Recorder) Reset() { r.exporter.Reset() }

// Collect reads every metric now (observable instruments are observed during the call).
func (r *Recorder) Collect(tb testing.TB) metricdata.ResourceMetrics {
	tb.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		tb.Fatalf("collect metrics: %v", err)
	}
	return rm
}

// Int64 returns the value of the int64 sum or gauge name summed over the data points whose attributes include
// every one of attrs, and whether such a data point exists.
func (r *Recorder) Int64(tb testing.TB, name string, attrs ...attribute.KeyValue) (int64, bool) {
	tb.Helper()
	return sumPoints[int64](tb, r.metrics(tb, name), name, attrs)
}

// Float64 is Int64 for float64 sums and gauges.
func (r *Recorder) Float64(tb testing.TB, name string, attrs ...attribute.KeyValue) (float64, bool) {
	tb.Helper()
	return sumPoints[float64](tb, r.metrics(tb, name), name, attrs)
}

func sumPoints[N int64 | float64](tb testing.TB, ms []metricdata.Metrics, name string, attrs []attribute.KeyValue) (
	N, bool) {
	tb.Helper()
	var total N
	found := false
	for _, m := range ms {
		var points []metricdata.DataPoint[N]
		switch d := m.Data.(type) {
		case metricdata.Sum[N]:
			points = d.DataPoints
		case metricdata.Gauge[N]:
			points = d.DataPoints
		default:
			var zero N
			tb.Fatalf("metric %s is a %T, not a %T sum or gauge", name, m.Data, zero)
		}
		for _, p := range points {
			if matches(p.Attributes, attrs) {
				total += p.Value
				found = true
			}
		}
	}
	return total, found
}

func (r *Recorder) metrics(tb testing.TB, name string) []metricdata.Metrics {
	tb.Helper()
	var out []metricdata.Metrics
	for _, sm := range r.Collect(tb).ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				out = append(out, m)
			}
		}
	}
	return out
}

func matches(set attribute.Set, attrs []attribute.KeyValue) bool {
	for _, kv := range attrs {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// Attr returns the value of attribute key on span s (an invalid Value when it is missing).
func Attr(s tracetest.SpanStub, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}
