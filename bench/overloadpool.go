package bench

import (
	"cmp"
	"compress/gzip"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ttftFilePrefix names the file each overload window writes: the calm
// tenant's TTFTs alone and under the flood, the samples of its p99s.
const ttftFilePrefix = "ttft__"

// writeTTFTCSV writes one line per calm request: the phase (alone or
// loaded) and its TTFT in ms.
func writeTTFTCSV(path string, alone, loaded []float64) error {
	var b strings.Builder
	b.WriteString("phase,ttft_ms\n")
	for _, v := range alone {
		fmt.Fprintf(&b, "alone,%.3f\n", v)
	}
	for _, v := range loaded {
		fmt.Fprintf(&b, "loaded,%.3f\n", v)
	}
	return writeResultFile(path, []byte(b.String()))
}

// writeResultFile writes a run's data file, making its directory.
func writeResultFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// TTFTWindow is one overload window's calm TTFTs (ms) and, when its
// requests file was read, every request served in it.
type TTFTWindow struct {
	Dir, Scenario, Target string
	Alone, Loaded         []float64
	Requests              []ServedRequest
}

// ServedRequest is one line of a window's requests__*.csv.gz: a request
// served, its times in ms from the window's start.
type ServedRequest struct {
	Tenant                  string
	StartMs, FirstMs, EndMs float64
}

// CalmFirst returns, for each calm request that started in the window,
// the TTFT it would have had if calm requests took every slot that freed
// before any other tenant's (absolute priority, no preemption), the ends
// being those that happened: the wait from its start to the first end of
// another request not taken by an earlier calm request, plus firstToken
// (what a request that finds a slot at once takes to its first token).
// In a saturated pool no scheduler that neither preempts a running
// request nor keeps a slot idle serves the calm tenant sooner, so the
// p99 of these is the floor a queue is held to at equal priority.
func CalmFirst(reqs []ServedRequest, firstToken float64) []float64 {
	var ends []float64
	var calm []ServedRequest
	for _, r := range reqs {
		ends = append(ends, r.EndMs)
		if r.Tenant == "calm" && r.StartMs >= 0 {
			calm = append(calm, r)
		}
	}
	slices.Sort(ends)
	slices.SortFunc(calm, func(a, b ServedRequest) int { return cmp.Compare(a.StartMs, b.StartMs) })
	var out []float64
	taken := -1 // index in ends of the last end a calm request took
	for _, r := range calm {
		i, _ := slices.BinarySearch(ends, r.StartMs)
		i = max(i, taken+1)
		for i < len(ends) && (ends[i] <= r.StartMs || ends[i] == r.EndMs) {
			i++
		}
		if i == len(ends) {
			continue // the window ended first: no bound for it
		}
		taken = i
		out = append(out, ends[i]-r.StartMs+firstToken)
	}
	return out
}

// Ratio is the window's calm p99 under the flood over its p99 alone, as
// the window's own summary reports it.
func (w TTFTWindow) Ratio() float64 {
	return Percentile(w.Loaded, 99) / Percentile(w.Alone, 99)
}

// PooledTTFT is the calm tenant's TTFT over several windows of one
// scenario and target: each percentile taken over all their requests at
// once. A window of 120 s holds ~240 calm requests, so its p99 is its
// third-largest TTFT and moves with a few requests; pooled windows
// estimate the same percentile from many more.
type PooledTTFT struct {
	Scenario, Target     string
	Windows              int
	AloneN, LoadedN      int
	AloneP99, LoadedP99  float64
	LoadedP50, LoadedP90 float64
	Ratio                float64   // LoadedP99 / AloneP99
	WindowRatios         []float64 // each window's own ratio, in Dir order
	// CalmFirstP99 is the p99 of CalmFirst over the windows (each with its
	// own calm TTFT p50 alone as the first token's time), 0 unless every
	// window's requests were read; CalmFirstRatio is it over AloneP99, and
	// WindowFloors each window's own, beside WindowRatios.
	CalmFirstP99, CalmFirstRatio float64
	WindowFloors                 []float64
}

// calmFirst is w's CalmFirst, nil without its requests.
func (w TTFTWindow) calmFirst() []float64 {
	if len(w.Requests) == 0 {
		return nil
	}
	return CalmFirst(w.Requests, Percentile(w.Alone, 50))
}

// PoolTTFT pools ws by scenario and target, in the order of their first
// window.
func PoolTTFT(ws []TTFTWindow) []PooledTTFT {
	var keys [][2]string
	groups := map[[2]string][]TTFTWindow{}
	for _, w := range ws {
		k := [2]string{w.Scenario, w.Target}
		if groups[k] == nil {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], w)
	}
	out := make([]PooledTTFT, 0, len(keys))
	for _, k := range keys {
		p := PooledTTFT{Scenario: k[0], Target: k[1], Windows: len(groups[k])}
		var alone, loaded, first []float64
		floors := true
		for _, w := range groups[k] {
			alone, loaded = append(alone, w.Alone...), append(loaded, w.Loaded...)
			p.WindowRatios = append(p.WindowRatios, w.Ratio())
			f := w.calmFirst()
			floors = floors && len(f) > 0
			first = append(first, f...)
			p.WindowFloors = append(p.WindowFloors, Percentile(f, 99)/Percentile(w.Alone, 99))
		}
		p.AloneN, p.LoadedN = len(alone), len(loaded)
		p.AloneP99 = Percentile(alone, 99)
		p.LoadedP50, p.LoadedP90, p.LoadedP99 = Percentile(loaded, 50), Percentile(loaded, 90), Percentile(loaded, 99)
		p.Ratio = p.LoadedP99 / p.AloneP99
		if floors {
			p.CalmFirstP99 = Percentile(first, 99)
			p.CalmFirstRatio = p.CalmFirstP99 / p.AloneP99
		} else {
			p.WindowFloors = nil
		}
		out = append(out, p)
	}
	return out
}

// ReadTTFTWindows reads the TTFT files of the overload result
// directories dirs (each window's ttft__<scenario>__<target>.csv).
func ReadTTFTWindows(dirs []string) ([]TTFTWindow, error) {
	var out []TTFTWindow
	for _, d := range dirs {
		files, err := filepath.Glob(filepath.Join(d, ttftFilePrefix+"*.csv"))
		if err != nil {
			return nil, err
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%s: no %s*.csv (runs of cart-bench overload before the TTFT files cannot be pooled)", d, ttftFilePrefix)
		}
		slices.Sort(files)
		for _, f := range files {
			w, err := readTTFTFile(f)
			if err != nil {
				return nil, err
			}
			w.Dir = d
			reqs := filepath.Join(d, "requests__"+w.Scenario+"__"+w.Target+".csv.gz")
			if w.Requests, err = readRequestsFile(reqs); err != nil && !os.IsNotExist(err) {
				return nil, err
			}
			out = append(out, w)
		}
	}
	return out, nil
}

func readTTFTFile(path string) (TTFTWindow, error) {
	name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), ttftFilePrefix), ".csv")
	sc, target, ok := strings.Cut(name, "__")
	if !ok || sc == "" || target == "" {
		return TTFTWindow{}, fmt.Errorf("%s: not a %s<scenario>__<target>.csv file", path, ttftFilePrefix)
	}
	w := TTFTWindow{Scenario: sc, Target: target}
	f, err := os.Open(path)
	if err != nil {
		return w, err
	}
	defer f.Close()
	err = readCSV(f, path, "phase,ttft_ms", func(rec []string) error {
		x, err := strconv.ParseFloat(rec[1], 64)
		if err != nil {
			return err
		}
		switch rec[0] {
		case "alone":
			w.Alone = append(w.Alone, x)
		case "loaded":
			w.Loaded = append(w.Loaded, x)
		default:
			return fmt.Errorf("phase %q, want alone or loaded", rec[0])
		}
		return nil
	})
	if err != nil {
		return w, err
	}
	if len(w.Alone) == 0 || len(w.Loaded) == 0 {
		return w, fmt.Errorf("%s: %d TTFTs alone and %d loaded; a ratio needs both", path, len(w.Alone), len(w.Loaded))
	}
	return w, nil
}

// readRequestsFile reads a window's requests__*.csv.gz.
func readRequestsFile(path string) ([]ServedRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []ServedRequest
	err = readCSV(z, path, "tenant,start_ms,first_token_ms,end_ms", func(rec []string) error {
		var v [3]float64
		for i := range v {
			var err error
			if v[i], err = strconv.ParseFloat(rec[i+1], 64); err != nil {
				return err
			}
		}
		out = append(out, ServedRequest{rec[0], v[0], v[1], v[2]})
		return nil
	})
	return out, err
}

// readCSV checks r's header against header and hands each record, with as
// many fields, to each.
func readCSV(r io.Reader, path, header string, each func([]string) error) error {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = strings.Count(header, ",") + 1
	head, err := cr.Read()
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if got := strings.Join(head, ","); got != header {
		return fmt.Errorf("%s: header %q, want %s", path, got, header)
	}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err == nil {
			err = each(rec)
		}
		if err != nil {
			line, _ := cr.FieldPos(0)
			return fmt.Errorf("%s:%d: %w", path, line, err)
		}
	}
}

// FormatPooledTTFT renders p as a Markdown table.
func FormatPooledTTFT(p []PooledTTFT) string {
	var b strings.Builder
	b.WriteString("| scenario | through | windows | calm requests alone / under the flood | p99 alone (ms) | p50 / p90 / p99 under the flood (ms) | pooled p99 flood / alone | calm-first floor p99 (ms, / alone) | each window's ratio |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range p {
		rs := make([]string, len(x.WindowRatios))
		for i, r := range x.WindowRatios {
			rs[i] = fmt.Sprintf("%.2f×", r)
			if x.WindowFloors != nil {
				rs[i] += fmt.Sprintf(" (floor %.2f×)", x.WindowFloors[i])
			}
		}
		floor := "no requests files"
		if x.CalmFirstP99 > 0 {
			floor = fmt.Sprintf("%.0f (%.2f×)", x.CalmFirstP99, x.CalmFirstRatio)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d / %d | %.0f | %.0f / %.0f / %.0f | **%.2f×** | %s | %s |\n",
			x.Scenario, x.Target, x.Windows, x.AloneN, x.LoadedN, x.AloneP99, x.LoadedP50, x.LoadedP90, x.LoadedP99, x.Ratio, floor, strings.Join(rs, ", "))
	}
	return b.String()
}
