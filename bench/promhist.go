package bench

import (
	"math"
	"sort"
	"strconv"
	"strings"
)

// Histogram is one Prometheus histogram series read from text exposition:
// cumulative bucket counts by upper bound (+Inf last), count and sum.
type Histogram struct {
	Bounds []float64 `json:"bounds"`
	Counts []float64 `json:"counts"` // cumulative, parallel to Bounds
	Count  float64   `json:"count"`
	Sum    float64   `json:"sum"`
}

// ParseHistograms returns the series of histogram name in text, keyed by
// their labels without le (`op="route"`, or "" for an unlabelled one).
// Lines of other metrics and unparsable lines are skipped.
func ParseHistograms(text, name string) map[string]*Histogram {
	out := map[string]*Histogram{}
	get := func(labels string) *Histogram {
		h := out[labels]
		if h == nil {
			h = &Histogram{}
			out[labels] = h
		}
		return h
	}
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name+"_")
		if !ok {
			continue
		}
		suffix, labels, value, ok := splitSample(rest)
		if !ok {
			continue
		}
		switch suffix {
		case "bucket":
			le, others := cutLabel(labels, "le")
			b, err := strconv.ParseFloat(le, 64)
			if le == "" || err != nil {
				continue
			}
			h := get(others)
			h.Bounds = append(h.Bounds, b)
			h.Counts = append(h.Counts, value)
		case "count":
			get(labels).Count = value
		case "sum":
			get(labels).Sum = value
		}
	}
	for _, h := range out {
		sort.Sort(byBound{h})
	}
	return out
}

// splitSample splits `bucket{a="x",le="1"} 3` into its suffix, the label
// text between the braces and the value.
func splitSample(s string) (suffix, labels string, value float64, ok bool) {
	sp := strings.LastIndexByte(s, ' ')
	if sp < 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(s[sp+1:], 64)
	if err != nil {
		return "", "", 0, false
	}
	head := s[:sp]
	if i := strings.IndexByte(head, '{'); i >= 0 {
		if !strings.HasSuffix(head, "}") {
			return "", "", 0, false
		}
		return head[:i], head[i+1 : len(head)-1], v, true
	}
	return head, "", v, true
}

// cutLabel removes label key from a label list and returns its value. The
// values here (op names, bounds) hold no commas or quotes.
func cutLabel(labels, key string) (value, others string) {
	var kept []string
	for _, kv := range strings.Split(labels, ",") {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			value = strings.Trim(v, `"`)
			continue
		}
		if kv != "" {
			kept = append(kept, kv)
		}
	}
	return value, strings.Join(kept, ",")
}

type byBound struct{ h *Histogram }

func (b byBound) Len() int           { return len(b.h.Bounds) }
func (b byBound) Less(i, j int) bool { return b.h.Bounds[i] < b.h.Bounds[j] }
func (b byBound) Swap(i, j int) {
	b.h.Bounds[i], b.h.Bounds[j] = b.h.Bounds[j], b.h.Bounds[i]
	b.h.Counts[i], b.h.Counts[j] = b.h.Counts[j], b.h.Counts[i]
}

// Sub returns h minus an earlier scrape of the same series: the
// observations made between the two. A nil or differently bucketed before
// (a restarted process) leaves h as it is.
func (h *Histogram) Sub(before *Histogram) *Histogram {
	out := &Histogram{Bounds: append([]float64(nil), h.Bounds...), Counts: append([]float64(nil), h.Counts...), Count: h.Count, Sum: h.Sum}
	if before == nil || len(before.Bounds) != len(h.Bounds) || before.Count > h.Count {
		return out
	}
	for i := range out.Counts {
		out.Counts[i] = math.Max(0, out.Counts[i]-before.Counts[i])
	}
	out.Count -= before.Count
	out.Sum -= before.Sum
	return out
}

// Add returns the sum of two series with the same buckets (nil for a
// mismatch), e.g. every op's lock holds together.
func (h *Histogram) Add(o *Histogram) *Histogram {
	if o == nil {
		return h
	}
	if h == nil {
		return o
	}
	if len(h.Bounds) != len(o.Bounds) {
		return nil
	}
	out := &Histogram{Bounds: append([]float64(nil), h.Bounds...), Counts: make([]float64, len(h.Counts)), Count: h.Count + o.Count, Sum: h.Sum + o.Sum}
	for i := range out.Counts {
		if h.Bounds[i] != o.Bounds[i] {
			return nil
		}
		out.Counts[i] = h.Counts[i] + o.Counts[i]
	}
	return out
}

// Quantile estimates the q-quantile (0-1) as Prometheus's
// histogram_quantile does: linear within the bucket it falls in, the lower
// edge of the first bucket taken as 0. A quantile in the +Inf bucket
// returns the highest finite bound (the estimate is then only "at least").
// NaN when there are no observations.
func (h *Histogram) Quantile(q float64) float64 {
	if h == nil || len(h.Bounds) == 0 {
		return math.NaN()
	}
	total := h.Counts[len(h.Counts)-1]
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for i, b := range h.Bounds {
		if h.Counts[i] >= rank {
			if math.IsInf(b, 1) {
				return lower
			}
			in := h.Counts[i] - below
			if in <= 0 {
				return b
			}
			return lower + (b-lower)*(rank-below)/in
		}
		lower, below = b, h.Counts[i]
	}
	return lower
}

// Beyond reports whether the q-quantile falls in the +Inf bucket: Quantile
// then only says "at least the last finite bound".
func (h *Histogram) Beyond(q float64) bool {
	if h == nil || len(h.Bounds) < 2 || !math.IsInf(h.Bounds[len(h.Bounds)-1], 1) {
		return false
	}
	total := h.Counts[len(h.Counts)-1]
	return total > 0 && h.Counts[len(h.Counts)-2] < q*total
}

// MaxBound is the upper bound of the highest bucket holding an
// observation: the longest observation was at most this (+Inf: beyond the
// last finite bound). 0 when empty.
func (h *Histogram) MaxBound() float64 {
	if h == nil {
		return 0
	}
	for i := len(h.Counts) - 1; i >= 0; i-- {
		below := 0.0
		if i > 0 {
			below = h.Counts[i-1]
		}
		if h.Counts[i]-below > 0 {
			return h.Bounds[i]
		}
	}
	return 0
}
