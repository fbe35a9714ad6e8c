package bench

import (
	"bufio"
	"fmt"
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
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// TTFTWindow is one overload window's calm TTFTs (ms).
type TTFTWindow struct {
	Dir, Scenario, Target string
	Alone, Loaded         []float64
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
}

// PoolTTFT pools ws by scenario and target, in the order of their first
// window.
func PoolTTFT(ws []TTFTWindow) []PooledTTFT {
	var out []PooledTTFT
	idx := map[[2]string]int{}
	var alone, loaded [][]float64
	for _, w := range ws {
		k := [2]string{w.Scenario, w.Target}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, PooledTTFT{Scenario: w.Scenario, Target: w.Target})
			alone, loaded = append(alone, nil), append(loaded, nil)
		}
		out[i].Windows++
		out[i].WindowRatios = append(out[i].WindowRatios, w.Ratio())
		alone[i] = append(alone[i], w.Alone...)
		loaded[i] = append(loaded[i], w.Loaded...)
	}
	for i := range out {
		p := &out[i]
		p.AloneN, p.LoadedN = len(alone[i]), len(loaded[i])
		p.AloneP99 = Percentile(alone[i], 99)
		p.LoadedP50, p.LoadedP90, p.LoadedP99 = Percentile(loaded[i], 50), Percentile(loaded[i], 90), Percentile(loaded[i], 99)
		p.Ratio = p.LoadedP99 / p.AloneP99
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
	sc2 := bufio.NewScanner(f)
	line := 0
	for sc2.Scan() {
		line++
		if line == 1 {
			if sc2.Text() != "phase,ttft_ms" {
				return w, fmt.Errorf("%s: header %q, want phase,ttft_ms", path, sc2.Text())
			}
			continue
		}
		phase, v, ok := strings.Cut(sc2.Text(), ",")
		x, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return w, fmt.Errorf("%s:%d: want phase,ttft_ms: %q", path, line, sc2.Text())
		}
		switch phase {
		case "alone":
			w.Alone = append(w.Alone, x)
		case "loaded":
			w.Loaded = append(w.Loaded, x)
		default:
			return w, fmt.Errorf("%s:%d: phase %q, want alone or loaded", path, line, phase)
		}
	}
	if err := sc2.Err(); err != nil {
		return w, fmt.Errorf("%s: %w", path, err)
	}
	if len(w.Alone) == 0 || len(w.Loaded) == 0 {
		return w, fmt.Errorf("%s: %d TTFTs alone and %d loaded; a ratio needs both", path, len(w.Alone), len(w.Loaded))
	}
	return w, nil
}

// FormatPooledTTFT renders p as a Markdown table.
func FormatPooledTTFT(p []PooledTTFT) string {
	var b strings.Builder
	b.WriteString("| scenario | through | windows | calm requests alone / under the flood | p99 alone (ms) | p50 / p90 / p99 under the flood (ms) | pooled p99 flood / alone | each window's ratio |\n|---|---|---|---|---|---|---|---|\n")
	for _, x := range p {
		rs := make([]string, len(x.WindowRatios))
		for i, r := range x.WindowRatios {
			rs[i] = fmt.Sprintf("%.1f×", r)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d / %d | %.0f | %.0f / %.0f / %.0f | **%.2f×** | %s |\n",
			x.Scenario, x.Target, x.Windows, x.AloneN, x.LoadedN, x.AloneP99, x.LoadedP50, x.LoadedP90, x.LoadedP99, x.Ratio, strings.Join(rs, ", "))
	}
	return b.String()
}
