package docs_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.yaml.in/yaml/v3"
)

// prometheusNames exports every instrument the library creates through the OpenTelemetry Prometheus exporter (its
// default translation, as examples/observability uses it), with every attribute key docs/metrics.md lists for it,
// and returns the metric names a scrape shows (histograms with their _bucket, _sum and _count series) and the
// label names of each.
func prometheusNames(t *testing.T, created []instrument, attrs map[string][]string) map[string][]string {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m := mp.Meter("github.com/stagehand-es/stagehand")
	ctx := context.Background()
	done := map[string]bool{}
	for _, in := range created {
		if done[in.name] {
			continue
		}
		done[in.name] = true
		opt := metric.WithAttributes(attrSet(attrs[in.name])...)
		switch in.kind {
		case "counter":
			c, err := m.Int64Counter(in.name, metric.WithUnit(in.unit))
			if err != nil {
				t.Fatal(err)
			}
			c.Add(ctx, 1, opt)
		case "histogram":
			h, err := m.Float64Histogram(in.name, metric.WithUnit(in.unit))
			if err != nil {
				t.Fatal(err)
			}
			h.Record(ctx, 1, opt)
		case "gauge":
			g, err := m.Float64Gauge(in.name, metric.WithUnit(in.unit))
			if err != nil {
				t.Fatal(err)
			}
			g.Record(ctx, 1, opt)
		default:
			t.Fatalf("%s: no export written for a %s", in.name, in.kind)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "stagehand_") {
			continue
		}
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		names := []string{f.GetName()}
		if f.GetType().String() == "HISTOGRAM" {
			names = []string{f.GetName() + "_bucket", f.GetName() + "_sum", f.GetName() + "_count"}
			labels = append(labels, "le")
		}
		for _, n := range names {
			out[n] = labels
		}
	}
	return out
}

// metricRefs are the stagehand metric names an expression uses; labelRefs the label names it groups by or matches.
var (
	metricRef = regexp.MustCompile(`\bstagehand_[a-zA-Z0-9_]+`)
	groupRef  = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
	matchRef  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!=|!~|=)\s*"`)
	selectors = regexp.MustCompile(`\{[^}]*\}`)
)

// checkExpr reports the metric and label names of expr that a scrape of the library's metrics does not show.
func checkExpr(t *testing.T, where, expr string, exported map[string][]string, used map[string]bool) {
	t.Helper()
	labels := map[string]bool{"job": true, "instance": true, "otel_scope_name": true, "otel_scope_version": true}
	// Metric names are what is left once the label lists (grouping, matching) and the label matchers are cut.
	bare := selectors.ReplaceAllString(groupRef.ReplaceAllString(expr, ""), "")
	refs := metricRef.FindAllString(bare, -1)
	if len(refs) == 0 {
		t.Errorf("%s: %q uses no stagehand metric", where, expr)
	}
	for _, name := range refs {
		ls, ok := exported[name]
		if !ok {
			t.Errorf("%s: %q uses %s, which the library does not export (exported: %s)", where, expr, name,
				strings.Join(sortedKeys(exported), ", "))
			continue
		}
		used[name] = true
		for _, l := range ls {
			labels[l] = true
		}
	}
	for _, g := range groupRef.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !labels[l] {
				t.Errorf("%s: %q groups by %s, a label none of its metrics has", where, expr, l)
			}
		}
	}
	for _, m := range matchRef.FindAllStringSubmatch(expr, -1) {
		if !labels[m[1]] {
			t.Errorf("%s: %q matches on %s, a label none of its metrics has", where, expr, m[1])
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The Prometheus alerting rules (deploy/prometheus/stagehand-rules.yml) and the Grafana dashboard
// (deploy/grafana/stagehand.json) use only metric and label names the library exports, as the OpenTelemetry
// Prometheus exporter names them: a renamed metric, unit or attribute fails here. Each rule has the fields
// Prometheus needs, and the dashboard's panels cover dead letters, lag per stage, stalls and relay pauses.
func TestMonitoringAssets(t *testing.T) {
	root := repoRoot(t)
	consts := telemetryConsts(t, root)
	created := libraryInstruments(t, root, consts)
	exported := prometheusNames(t, created, documentedAttributes(t, root))
	if len(exported) < 10 {
		t.Fatalf("only %d metrics exported: the export is broken", len(exported))
	}
	t.Logf("exported: %s", strings.Join(sortedKeys(exported), ", "))
	used := map[string]bool{}

	// docs/metrics.md's table of Prometheus names holds what the exporter produces, for every metric.
	docs, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented, listed := 0, 0
	for i, l := range strings.Split(string(docs), "\n") {
		if strings.HasPrefix(l, "| `stagehand.") {
			listed++
		}
		if !strings.HasPrefix(l, "| `stagehand_") {
			continue
		}
		documented++
		for _, name := range metricRef.FindAllString(strings.Split(l, "|")[1], -1) {
			if _, ok := exported[name]; !ok {
				t.Errorf("docs/metrics.md:%d names %s, which the exporter does not produce", i+1, name)
			}
		}
	}
	if documented != listed {
		t.Errorf("docs/metrics.md gives the Prometheus names of %d metrics; it lists %d", documented, listed)
	}

	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "stagehand-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("stagehand-rules.yml: %v", err)
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			where := "stagehand-rules.yml " + g.Name + "/" + r.Alert
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" ||
				r.Annotations["description"] == "" {
				t.Errorf("%s: a rule needs alert, expr, labels.severity, annotations.summary and description", where)
			}
			checkExpr(t, where, r.Expr, exported, used)
			alerts = append(alerts, r.Alert)
		}
	}
	for _, want := range []string{"StagehandDeadLetters", "StagehandInboxDeadLetters", "StagehandOutboxLagging",
		"StagehandProjectionLagging", "StagehandRelayStalled", "StagehandRelayFailing", "StagehandProjectionStalled",
		"StagehandMaintenanceFailing"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("stagehand-rules.yml has no %s alert", want)
		}
	}

	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	data, err = os.ReadFile(filepath.Join(root, "deploy", "grafana", "stagehand.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("stagehand.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Error("stagehand.json: the dashboard needs a uid and a title")
	}
	var titles []string
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		titles = append(titles, p.Title)
		if len(p.Targets) == 0 {
			t.Errorf("stagehand.json: panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkExpr(t, "stagehand.json panel "+p.Title, tg.Expr, exported, used)
		}
	}
	for _, want := range []string{"Dead letters", "Outbox lag", "Projection lag", "Relay stalls", "Relay failures"} {
		if !slices.ContainsFunc(titles, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("stagehand.json has no panel titled %q…", want)
		}
	}
	for _, name := range []string{"stagehand_messages_dead_lettered_total", "stagehand_outbox_oldest_pending_age_seconds",
		"stagehand_projection_lag_time_seconds", "stagehand_messages_published_total", "stagehand_inbox_messages_total"} {
		if !used[name] {
			t.Errorf("neither the rules nor the dashboard use %s", name)
		}
	}
}

// documentedAttributes maps each metric of docs/metrics.md to the attribute keys its row lists.
func documentedAttributes(t *testing.T, root string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	tick := regexp.MustCompile("`([^`]+)`")
	out := map[string][]string{}
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(l, "| `stagehand.") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) < 5 {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[0]), "`")
		for _, m := range tick.FindAllStringSubmatch(cells[3], -1) {
			out[name] = append(out[name], m[1])
		}
	}
	return out
}

func attrSet(keys []string) []attribute.KeyValue {
	out := make([]attribute.KeyValue, 0, len(keys))
	for _, k := range keys {
		out = append(out, attribute.String(k, "x"))
	}
	return out
}
