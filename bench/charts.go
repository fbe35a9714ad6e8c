package bench

import (
	"fmt"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// BarSeries is one set of bars in a grouped bar chart: Values[i] belongs to
// category i (NaN draws nothing).
type BarSeries struct {
	Name   string
	Values []float64
}

// RefLine is a horizontal reference line across the whole chart.
type RefLine struct {
	Name  string
	Y     float64
	Color int // plotutil palette index
}

// BarChart writes a grouped bar chart as PNG.
func BarChart(path, title, ylabel string, categories []string, series []BarSeries, refs []RefLine) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	n := len(series)
	width := vg.Points(math.Min(28, 220/float64(max(n*len(categories), 1))*float64(max(n, 1))))
	ymax := 0.0
	for i, s := range series {
		vals := make(plotter.Values, len(categories))
		for j := range categories {
			v := math.NaN()
			if j < len(s.Values) {
				v = s.Values[j]
			}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				v = 0
			}
			vals[j] = v
			ymax = math.Max(ymax, v)
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		bars.LineStyle.Width = vg.Length(0)
		bars.Color = plotutil.Color(i)
		bars.Offset = vg.Length(float64(i)-float64(n-1)/2) * width
		p.Add(bars)
		p.Legend.Add(s.Name, bars)
	}
	for _, r := range refs {
		pts := plotter.XYs{{X: -0.5, Y: r.Y}, {X: float64(len(categories)) - 0.5, Y: r.Y}}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(r.Color)
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(r.Name, l)
		ymax = math.Max(ymax, r.Y)
	}
	// Leave room above the bars for the legend.
	p.Y.Max = ymax * (1.1 + 0.08*float64(len(series)+len(refs)))
	if p.Y.Max == 0 {
		p.Y.Max = 1
	}
	p.Legend.Top = true
	p.NominalX(categories...)
	p.Add(plotter.NewGrid())
	w := vg.Length(math.Max(16, 2.2*float64(len(categories)))) * vg.Centimeter
	return p.Save(w, 11*vg.Centimeter, path)
}

// LineSeries is one line of points; Points with NaN Y are left out.
type LineSeries struct {
	Name   string
	Points plotter.XYs
	// Markers only (no line), for baselines.
	Markers bool
	Color   int
}

// LineChart writes an XY chart as PNG.
func LineChart(path, title, xlabel, ylabel string, xticks []float64, series []LineSeries, refs []RefLine) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	ymax := 0.0
	xmin, xmax := math.Inf(1), math.Inf(-1)
	for _, x := range xticks {
		xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
	}
	for i, s := range series {
		var pts plotter.XYs
		for _, pt := range s.Points {
			if !math.IsNaN(pt.Y) {
				pts = append(pts, pt)
				ymax = math.Max(ymax, pt.Y)
			}
		}
		if len(pts) == 0 {
			continue
		}
		c := plotutil.Color(s.Color)
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Color = c
		sc.GlyphStyle.Radius = vg.Points(4)
		sc.GlyphStyle.Shape = plotutil.Shape(i)
		p.Add(sc)
		if s.Markers {
			p.Legend.Add(s.Name, sc)
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = c
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.Name, l, sc)
	}
	for _, r := range refs {
		pts := plotter.XYs{{X: xmin, Y: r.Y}, {X: xmax, Y: r.Y}}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(r.Color)
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(r.Name, l)
		ymax = math.Max(ymax, r.Y)
	}
	if ymax == 0 {
		ymax = 1
	}
	p.Y.Max = ymax * (1.1 + 0.08*float64(len(series)+len(refs)))
	if !math.IsInf(xmin, 0) {
		p.X.Min, p.X.Max = xmin-0.5, xmax+0.5
		var ticks []plot.Tick
		for _, x := range xticks {
			ticks = append(ticks, plot.Tick{Value: x, Label: fmt.Sprint(x)})
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
	}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p.Save(16*vg.Centimeter, 11*vg.Centimeter, path)
}
