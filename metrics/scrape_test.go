package metrics_test

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// serveMetrics registers cs on a new pedantic registry (which checks that
// each collector describes what it collects) and serves it, in the
// Prometheus text format, on a loopback listener until cleanup. It returns
// the URL to scrape.
func serveMetrics(t testing.TB, cs ...prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(cs...)
	ln := listen(t)
	hs := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError})}
	var wg sync.WaitGroup
	wg.Go(func() { hs.Serve(ln) })
	t.Cleanup(func() { hs.Close(); wg.Wait() })
	return "http://" + ln.Addr().String() + "/metrics"
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// samples are the values of one scrape, by series: name{label="value",...}
// with the labels sorted by name. A histogram gives name_count and
// name_sum series.
type samples map[string]float64

func (s samples) String() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %g\n", k, s[k])
	}
	return b.String()
}

// scrape gets url over HTTP and parses it with the Prometheus text parser.
func scrape(t testing.TB, url string) samples {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET %s: Content-Type %q, want the text format", url, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	s := samples{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := series(m.GetLabel())
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				s[name+labels] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				s[name+labels] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				s[name+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
				s[name+"_sum"+labels] = m.GetHistogram().GetSampleSum()
			default:
				t.Fatalf("%s: unexpected type %v", name, f.GetType())
			}
		}
	}
	return s
}

func series(labels []*dto.LabelPair) string {
	if len(labels) == 0 {
		return ""
	}
	pairs := make([]string, len(labels))
	for i, l := range labels {
		pairs[i] = fmt.Sprintf("%s=%q", l.GetName(), l.GetValue())
	}
	slices.Sort(pairs)
	return "{" + strings.Join(pairs, ",") + "}"
}

// check is what a series should be: a value, or at least a value.
type check struct {
	series  string
	value   float64
	atLeast bool
}

func eq(series string, v float64) check      { return check{series: series, value: v} }
func atLeast(series string, v float64) check { return check{series: series, value: v, atLeast: true} }

func (c check) holds(s samples) bool {
	v, ok := s[c.series]
	if !ok {
		return false
	}
	if c.atLeast {
		return v >= c.value
	}
	return v == c.value
}

func (c check) String() string {
	if c.atLeast {
		return fmt.Sprintf("%s >= %g", c.series, c.value)
	}
	return fmt.Sprintf("%s == %g", c.series, c.value)
}

// waitMetrics scrapes url until every check holds, and returns that
// scrape. Most counts reach the Observer after the client has its answer
// (a request is counted when its handler returns, a connection's bytes
// when it closes), so a test scrapes again, as Prometheus would, until
// they arrive, for 10 s at most.
func waitMetrics(t testing.TB, url string, checks ...check) samples {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := scrape(t, url)
		var failed []string
		for _, c := range checks {
			if !c.holds(s) {
				got, ok := s[c.series]
				if ok {
					failed = append(failed, fmt.Sprintf("%v (got %g)", c, got))
				} else {
					failed = append(failed, fmt.Sprintf("%v (no such series)", c))
				}
			}
		}
		if len(failed) == 0 {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, these do not hold:\n\t%s\nlast scrape:\n%s", strings.Join(failed, "\n\t"), s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
