package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

var (
	warmupShade = color.RGBA{R: 230, G: 230, B: 230, A: 255}
	seriesColor = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	fitColor    = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	bandColor   = color.RGBA{R: 44, G: 160, B: 44, A: 255}
)

// drawPlot writes one panel per series, as SVG at svgPath and PNG at
// pngPath (a viewer that takes no SVG): the samples
// against minutes of load, the warm-up shaded; for each asserted series,
// its fitted line after the warm-up (red) and the band of ±tolerance
// around its mean there (green, dashed).
func drawPlot(svgPath, pngPath string, samples []sample, flat []flatResult, warmup float64, tol float64) error {
	const cols = 3
	rows := (len(series) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, cols)
	}
	for k, sr := range series {
		p := plot.New()
		f := flat[k]
		title := sr.name
		if sr.unit != "" {
			title += " (" + sr.unit + ")"
		}
		if sr.asserted && f.n >= 3 {
			verdict := "flat"
			if !f.ok {
				verdict = "NOT FLAT"
			}
			title += fmt.Sprintf(": drift %+.1f%%, %s", 100*f.rel*sign(f.drift), verdict)
		}
		p.Title.Text = title
		p.X.Label.Text = "minutes of load"
		var xys plotter.XYs
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, s := range samples {
			v := sr.get(s)
			if math.IsNaN(v) {
				continue
			}
			xys = append(xys, plotter.XY{X: s.at.Minutes(), Y: v})
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
		if len(xys) == 0 {
			plots[k/cols][k%cols] = p
			continue
		}
		if sr.asserted && f.n >= 3 {
			lo, hi = math.Min(lo, f.mean*(1-tol)), math.Max(hi, f.mean*(1+tol))
		}
		if hi == lo {
			hi, lo = hi+1, math.Max(lo-1, 0)
		}
		p.Y.Min, p.Y.Max = math.Min(0, lo), hi+(hi-lo)*0.05
		if warmup > 0 {
			shade, err := plotter.NewPolygon(plotter.XYs{{X: 0, Y: p.Y.Min}, {X: warmup, Y: p.Y.Min}, {X: warmup, Y: p.Y.Max}, {X: 0, Y: p.Y.Max}})
			if err != nil {
				return err
			}
			shade.Color, shade.LineStyle.Width = warmupShade, 0
			p.Add(shade)
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		line.Color, line.Width = seriesColor, vg.Points(1.5)
		points, err := plotter.NewScatter(xys)
		if err != nil {
			return err
		}
		points.Color, points.Radius = seriesColor, vg.Points(1.5)
		p.Add(line, points)
		if sr.asserted && f.n >= 3 {
			x0, x1 := f.t0/60, f.t1/60
			fit, err := plotter.NewLine(plotter.XYs{{X: x0, Y: f.intercept + f.slope*f.t0}, {X: x1, Y: f.intercept + f.slope*f.t1}})
			if err != nil {
				return err
			}
			fit.Color, fit.Width = fitColor, vg.Points(1.5)
			p.Add(fit)
			for _, y := range []float64{f.mean * (1 - tol), f.mean * (1 + tol)} {
				b, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
				if err != nil {
					return err
				}
				b.Color, b.Dashes = bandColor, []vg.Length{vg.Points(4), vg.Points(3)}
				p.Add(b)
			}
		}
		plots[k/cols][k%cols] = p
	}
	w, h := vg.Points(420*cols), vg.Points(300*float64(rows))
	svg := vgsvg.New(w, h)
	png := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(96))
	for _, c := range []vg.CanvasSizer{svg, png} {
		dc := draw.New(c)
		tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(12), PadY: vg.Points(12),
			PadTop: vg.Points(8), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(8)}
		canvases := plot.Align(plots, tiles, dc)
		for j := range plots {
			for i := range plots[j] {
				if plots[j][i] != nil {
					plots[j][i].Draw(canvases[j][i])
				}
			}
		}
	}
	if err := writeTo(svgPath, svg); err != nil {
		return err
	}
	return writeTo(pngPath, vgimg.PngCanvas{Canvas: png})
}

func writeTo(path string, w io.WriterTo) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := w.WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
