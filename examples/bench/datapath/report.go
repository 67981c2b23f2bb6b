//go:build unix

package main

import (
	"fmt"
	"io"
	"math"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// printReport prints the table of results, the failures, and the CPU
// time of every process per measurement.
func printReport(w io.Writer, e *env, rep *report) {
	cfg := e.cfg
	fmt.Fprintf(w, "datapath: %s, %s %s/%s, %d CPUs, GOMAXPROCS of the servers: %s; %d run(s)\n",
		time.Now().Format("2006-01-02 15:04"), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), procsLabel(cfg.GOMAXPROCS), cfg.Runs)
	fmt.Fprintf(w, "load: %s; duration %v after %v of warm-up; logs as the example binaries: %v\n\n", loadLabel(e), cfg.Duration, cfg.Warmup, cfg.Logs)
	fmt.Fprintln(w, "| what | baseline | tunnel | tunnel/baseline |")
	fmt.Fprintln(w, "|---|--:|--:|--:|")
	for _, g := range groupResults(rep.results) {
		base, tun := "-", formatValue(median(g.tun), g.first.Unit)
		ratio := "-"
		if len(g.base) > 0 {
			base = formatValue(median(g.base), g.first.Unit)
			ratio = formatRatio(g.ratios, g.first.Lower)
		}
		if g.note != "" {
			tun += " " + g.note
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", g.first.What, base, tun, ratio)
	}
	fmt.Fprintln(w, "\nratios: tunnel/baseline of the same run (min..max over runs); ↑ higher is better, ↓ lower is better.")
	if len(rep.failures) > 0 {
		fmt.Fprintln(w, "\nFAILED:")
		for _, f := range rep.failures {
			fmt.Fprintln(w, "  "+strings.ReplaceAll(f, "\n", "\n  "))
		}
	}
	printCPU(w, rep.cpu)
	if cfg.CPUProfile != "" || cfg.MemProfile != "" {
		fmt.Fprintf(w, "\nprofiles: CPU in %s, allocations in %s (CASE.PROCESS.cpu.pprof, .alloc.pprof); e.g. go tool pprof -top -cum %s\n",
			orNone(cfg.CPUProfile), orNone(cfg.MemProfile), exampleProfile(cfg))
	}
}

func procsLabel(n int) string {
	if n <= 0 {
		return "default"
	}
	return fmt.Sprint(n)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func exampleProfile(cfg *config) string {
	if cfg.CPUProfile != "" {
		return cfg.CPUProfile + "/http-req-plain.edge.cpu.pprof"
	}
	return "-sample_index=alloc_space " + cfg.MemProfile + "/http-req-plain.edge.alloc.pprof"
}

// loadLabel says what generated the HTTP load.
func loadLabel(e *env) string {
	var parts []string
	if e.wrk != "" {
		parts = append(parts, fmt.Sprintf("%s -t %d -c %d", toolVersion(e.wrk, "-v"), min(e.cfg.Threads, e.cfg.Conns), e.cfg.Conns))
	} else {
		parts = append(parts, fmt.Sprintf("HTTP/1.1 from the Go generator, %d connections", e.cfg.Conns))
	}
	if e.h2load != "" {
		parts = append(parts, fmt.Sprintf("%s -c %d -m %d", toolVersion(e.h2load, "--version"), e.cfg.H2Conns, e.cfg.H2Streams))
	} else {
		parts = append(parts, fmt.Sprintf("HTTP/2 from the Go generator, %d requests at once", e.cfg.H2Conns*e.cfg.H2Streams))
	}
	return strings.Join(parts, ", ")
}

// toolVersion returns the first words of a tool's version line.
func toolVersion(path, flag string) string {
	out, _ := exec.Command(path, flag).CombinedOutput()
	line, _, _ := strings.Cut(string(out), "\n")
	f := strings.Fields(line)
	if len(f) > 2 {
		f = f[:2]
	}
	if len(f) == 0 {
		return path
	}
	return strings.Join(f, " ")
}

// group is a line of the table over every run.
type group struct {
	first             result
	base, tun, ratios []float64
	note              string
}

// groupResults gathers each line's figures over the runs, in the order
// the lines first came.
func groupResults(results []result) []*group {
	var order []*group
	by := map[string]*group{}
	for _, r := range results {
		g := by[r.Row+"\x00"+r.What]
		if g == nil {
			g = &group{first: r}
			by[r.Row+"\x00"+r.What] = g
			order = append(order, g)
		}
		g.tun = append(g.tun, r.Tun)
		if !math.IsNaN(r.Base) {
			g.base = append(g.base, r.Base)
			g.ratios = append(g.ratios, r.Tun/r.Base)
		}
		g.note = r.Note
	}
	return order
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// formatValue writes v in unit with the precision it deserves.
func formatValue(v float64, unit string) string {
	var s string
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		s = "?"
	case math.Abs(v) >= 100:
		s = fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		s = fmt.Sprintf("%.1f", v)
	default:
		s = fmt.Sprintf("%.2f", v)
	}
	return s + " " + unit
}

// formatRatio writes the ratios' range, and which way is better.
func formatRatio(r []float64, lower bool) string {
	arrow := " ↑"
	if lower {
		arrow = " ↓"
	}
	lo, hi := slices.Min(r), slices.Max(r)
	if len(r) == 1 || fmt.Sprintf("%.2f", lo) == fmt.Sprintf("%.2f", hi) {
		return fmt.Sprintf("%.2fx%s", lo, arrow)
	}
	return fmt.Sprintf("%.2f..%.2fx%s", lo, hi, arrow)
}

// printCPU prints, per measurement, the CPU time of each process, summed
// over the runs, and per operation.
func printCPU(w io.Writer, recs []cpuRecord) {
	if len(recs) == 0 {
		return
	}
	type sum struct {
		unit  string
		ops   float64
		order []string
		cpu   map[string]time.Duration
		io    map[string]benchproc.IO
	}
	var cases []string
	by := map[string]*sum{}
	for _, r := range recs {
		s := by[r.Case]
		if s == nil {
			s = &sum{unit: r.Unit, cpu: map[string]time.Duration{}, io: map[string]benchproc.IO{}}
			by[r.Case] = s
			cases = append(cases, r.Case)
		}
		s.ops += r.Ops
		for _, p := range r.Procs {
			if _, ok := s.cpu[p.Name]; !ok {
				s.order = append(s.order, p.Name)
			}
			s.cpu[p.Name] += p.CPU
			io, seen := s.io[p.Name]
			if p.IO.Reads < 0 || (seen && io.Reads < 0) {
				s.io[p.Name] = benchproc.IO{Reads: -1, Writes: -1}
			} else {
				s.io[p.Name] = benchproc.IO{Reads: io.Reads + p.IO.Reads, Writes: io.Writes + p.IO.Writes}
			}
		}
	}
	fmt.Fprintln(w, "\nCPU time (user+system) of each process while the load ran, summed over the runs, and per operation (with its read and write syscalls, r+w, per operation; per MB for GB):")
	fmt.Fprintln(w, "| case | operations | per process: CPU time (per operation) |")
	fmt.Fprintln(w, "|---|--:|---|")
	for _, c := range cases {
		s := by[c]
		var cells []string
		for _, name := range s.order {
			cells = append(cells, fmt.Sprintf("%s %s (%s%s)", name, formatCPU(s.cpu[name]), perOp(s.cpu[name], s.ops, s.unit), syscallsPerOp(s.io[name], s.ops, s.unit)))
		}
		ops := fmt.Sprintf("%.0f %s", s.ops, s.unit)
		switch s.unit {
		case "":
			ops = "-"
		case "GB":
			ops = fmt.Sprintf("%.2f GB", s.ops)
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", c, ops, strings.Join(cells, ", "))
	}
}

// syscallsPerOp writes io per operation (per MB for GB), after a comma;
// nothing when it is not known.
func syscallsPerOp(io benchproc.IO, ops float64, unit string) string {
	if io.Reads < 0 || ops <= 0 || unit == "" {
		return ""
	}
	per := "/" + unit
	if unit == "GB" {
		ops *= 1000
		per = "/MB"
	}
	return fmt.Sprintf(", %.1f+%.1f syscalls%s", float64(io.Reads)/ops, float64(io.Writes)/ops, per)
}

func formatCPU(d time.Duration) string {
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// perOp writes d per operation: µs per request, call, round trip or
// connection, seconds per GB.
func perOp(d time.Duration, ops float64, unit string) string {
	if ops <= 0 {
		return "-"
	}
	if unit == "GB" {
		return fmt.Sprintf("%.2f s/GB", d.Seconds()/ops)
	}
	return fmt.Sprintf("%.1f µs/%s", micros(d)/ops, unit)
}
