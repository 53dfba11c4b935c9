//! SVG charts (plotters, SVG backend only: no font or bitmap libraries).
//!
//! `run --chart` / `merge --chart` ([`draw`]): throughput over time against the target,
//! latency over time (p50, p99, p99.9, max), QPS per shard (labelled with their ranges, or
//! indices when there are many) against each shard's target, and, through routers, QPS and
//! latency per router. `compare --chart` ([`draw_compare`]): both latency distributions by
//! percentile on a log scale (the HdrHistogram plot), and both runs' throughput and p99 over
//! time.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor;

use crate::compare::Comparison;
use crate::report::{Report, SecondReport};
use crate::stats;
use crate::table::ms;

type Failure = String;

fn fail<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> Failure + '_ {
    move |e| format!("cannot draw the chart {}: {e}", path.display())
}

/// Shards up to this many are labelled with their ranges; more, with indices.
const RANGE_LABELS_UP_TO: usize = 16;

const WIDTH: u32 = 1100;
const PANEL: u32 = 370;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A rate with the digits it needs (10000, 20.5, 0.195).
fn rate_text(r: f64) -> String {
    match r {
        r if r >= 100.0 => format!("{r:.0}"),
        r if r >= 1.0 => format!("{r:.1}"),
        r => format!("{r:.3}"),
    }
}

/// Draws a report's chart into an SVG file.
pub fn draw(report: &Report, path: &Path) -> Result<(), Failure> {
    let panels = if report.routers.is_empty() { 3 } else { 4 };
    let root = SVGBackend::new(path, (WIDTH, PANEL * panels)).into_drawing_area();
    let f = fail(path);
    root.fill(&WHITE).map_err(&f)?;
    let areas = root.split_evenly((panels as usize, 1));
    // Several routers' URLs do not fit a title: count them (the last panel names them).
    let targets = match report.routers.len() {
        0 | 1 => report.settings.targets.clone(),
        n => format!("{n} routers"),
    };
    let hosts = match report.hosts.len() {
        0 | 1 => String::new(),
        n => format!("{n} loadgen hosts, "),
    };
    let title = format!(
        "loadgen: {targets} ({} shards, {hosts}{} connections, {})",
        report.shards.len(),
        report.settings.connections,
        report.settings.rate
    );
    throughput(&areas[0], report, &title).map_err(fail(path))?;
    latency(&areas[1], report).map_err(fail(path))?;
    per_shard(&areas[2], report).map_err(fail(path))?;
    if panels == 4 {
        per_router(&areas[3], report).map_err(fail(path))?;
    }
    root.present().map_err(&f)?;
    Ok(())
}

type Drawn = Result<(), Box<dyn std::error::Error>>;

fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> Drawn
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(at)
        .draw()?;
    Ok(())
}

fn line_key(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color)
}

fn t_max(series: &[SecondReport]) -> f64 {
    series.iter().map(|s| s.t as f64).fold(1.0, f64::max)
}

fn throughput(area: &Area<'_>, report: &Report, title: &str) -> Drawn {
    let t_max = t_max(&report.series);
    let qps: Vec<(f64, f64)> = report.series.iter().map(|s| (s.t as f64, s.qps)).collect();
    let q_max = qps
        .iter()
        .map(|p| p.1)
        .chain(report.target_qps)
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{title}: throughput"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..t_max, 0f64..q_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("queries / s")
        .draw()?;
    chart
        .draw_series(LineSeries::new(qps, BLUE.stroke_width(2)))?
        .label("achieved (ok/s)")
        .legend(line_key(BLUE));
    if let Some(target) = report.target_qps {
        let grey = RGBColor(110, 110, 110);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, target), (t_max, target)],
                8,
                5,
                grey.stroke_width(2),
            ))?
            .label(format!("target {}/s", rate_text(target)))
            .legend(line_key(grey));
    }
    let errors: Vec<(f64, f64)> = report
        .series
        .iter()
        .map(|s| {
            (
                s.t as f64,
                (s.counts.errors + s.counts.timeouts) as f64 / s.seconds.max(1e-9),
            )
        })
        .collect();
    if errors.iter().any(|e| e.1 > 0.0) {
        chart
            .draw_series(LineSeries::new(errors, RED))?
            .label("errors + timeouts / s")
            .legend(line_key(RED));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// A named, coloured line of (x, y) points.
type Line<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

fn latency(area: &Area<'_>, report: &Report) -> Drawn {
    let t_max = t_max(&report.series);
    let pick = |f: fn(&SecondReport) -> u64| -> Vec<(f64, f64)> {
        report
            .series
            .iter()
            .map(|s| (s.t as f64, ms(f(s))))
            .collect()
    };
    // Format-1 reports have no p99.9 per second.
    let has_p999 = report.series.iter().any(|s| s.p999_us > 0);
    let lines: Vec<Line<'_>> = [
        Some(("p50", GREEN, pick(|s| s.p50_us))),
        Some(("p99", MAGENTA, pick(|s| s.p99_us))),
        has_p999.then(|| ("p99.9", RGBColor(230, 120, 0), pick(|s| s.p999_us))),
        Some(("max", RGBColor(160, 160, 160), pick(|s| s.max_us))),
    ]
    .into_iter()
    .flatten()
    .collect();
    let values = || {
        lines
            .iter()
            .flat_map(|(_, _, v)| v.iter().map(|p| p.1))
            .filter(|v| *v > 0.0)
    };
    // Headroom above the lines (log scale) for the legend.
    let l_max = values().fold(0.01, f64::max) * 5.0;
    let l_min = values().fold(f64::INFINITY, f64::min).min(l_max / 10.0) / 2.0;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "latency per second, from the intended send time (coordinated omission corrected)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..t_max, (l_min..l_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("ms (log)")
        .draw()?;
    for (name, color, points) in lines {
        // A second without successes has no latency: not a point at zero.
        let points: Vec<(f64, f64)> = points.into_iter().filter(|p| p.1 > 0.0).collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name)
            .legend(line_key(color));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

fn per_shard(area: &Area<'_>, report: &Report) -> Drawn {
    let n = report.shards.len().max(1);
    let per_shard_target = report.target_qps.map(|t| t / n as f64);
    let s_max = report
        .shards
        .iter()
        .map(|s| s.qps)
        .chain(per_shard_target)
        .fold(1.0, f64::max)
        * 1.15;
    let labels: Vec<String> = report
        .shards
        .iter()
        .map(|s| {
            if n <= RANGE_LABELS_UP_TO {
                s.range.clone()
            } else {
                s.index.to_string()
            }
        })
        .collect();
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "QPS per shard: min {:.1}, max {:.1}, stddev {:.1}",
                report.shard_qps.min, report.shard_qps.max, report.shard_qps.stddev
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        // A segmented 0..0 has no width: one shard gets a second, empty segment.
        .build_cartesian_2d((0..(n - 1).max(1)).into_segmented(), 0f64..s_max)?;
    chart
        .configure_mesh()
        .x_desc(if n <= RANGE_LABELS_UP_TO {
            "shard (keyspace range)"
        } else {
            "shard (index)"
        })
        .y_desc("queries / s")
        .disable_x_mesh()
        .x_labels(n.min(32))
        .x_label_style(("sans-serif", 12))
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                labels.get(*i).cloned().unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        })
        .draw()?;
    chart.draw_series(report.shards.iter().map(|s| {
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(s.index), 0.0),
                (SegmentValue::Exact(s.index + 1), s.qps),
            ],
            BLUE.mix(0.7).filled(),
        );
        // Gaps between bars only while the bars are wide enough to keep them (at 512 shards
        // a bar is under 2 pixels).
        let gap = if n <= 64 { 2 } else { 0 };
        bar.set_margin(0, 0, gap, gap);
        bar
    }))?;
    if let Some(t) = per_shard_target {
        let grey = RGBColor(110, 110, 110);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(SegmentValue::Exact(0), t), (SegmentValue::Last, t)],
                8,
                5,
                grey.stroke_width(2),
            ))?
            .label(format!("target {}/s per shard", rate_text(t)))
            .legend(line_key(grey));
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    }
    Ok(())
}

fn per_router(area: &Area<'_>, report: &Report) -> Drawn {
    let n = report.routers.len().max(1) as f64;
    let r_max = report.routers.iter().map(|r| r.qps).fold(1.0, f64::max) * 1.35;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "QPS per router, with its p50 / p99 / max latency in ms",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(10)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..n, 0f64..r_max)?;
    chart
        .configure_mesh()
        .y_desc("queries / s")
        .disable_x_mesh()
        .x_labels(0)
        .draw()?;
    chart.draw_series(report.routers.iter().enumerate().map(|(i, r)| {
        let x = i as f64;
        Rectangle::new([(x + 0.15, 0.0), (x + 0.85, r.qps)], BLUE.mix(0.7).filled())
    }))?;
    let style = ("sans-serif", 13).into_font().color(&BLACK);
    let centred = style.pos(text_anchor::Pos::new(
        text_anchor::HPos::Center,
        text_anchor::VPos::Bottom,
    ));
    for (i, r) in report.routers.iter().enumerate() {
        let l = &r.latency_us;
        let x = i as f64 + 0.5;
        let figures = format!(
            "{:.0}/s   {:.3} / {:.3} / {:.3}",
            r.qps,
            ms(l.p50),
            ms(l.p99),
            ms(l.max)
        );
        chart.draw_series([
            Text::new(figures, (x, r.qps + r_max * 0.03), centred.clone()),
            Text::new(r.target.clone(), (x, r.qps + r_max * 0.1), centred.clone()),
        ])?;
    }
    Ok(())
}

/// The latency-by-percentile curve of a histogram: x is 1 / (1 - q), so 10 is p90, 100 p99,
/// 1000 p99.9 (the HdrHistogram plot); it ends where the samples run out.
fn percentile_curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let x_end = (h.len() as f64).clamp(10.0, 1e7);
    let steps = 300;
    let mut points: Vec<(f64, f64)> = (0..=steps)
        .map(|k| {
            let x = x_end.powf(k as f64 / steps as f64);
            let q = 1.0 - 1.0 / x;
            (x, ms(h.value_at_quantile(q)))
        })
        .collect();
    points.push((x_end, ms(h.max())));
    points
}

fn percent_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 1.0 / x.max(1.0));
    let text = format!("{p:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}%")
}

/// Draws `compare --chart`: both distributions and both time series.
pub fn draw_compare(
    cmp: &Comparison,
    before: &Report,
    after: &Report,
    path: &Path,
) -> Result<(), Failure> {
    let root = SVGBackend::new(path, (WIDTH, PANEL * 3)).into_drawing_area();
    let f = fail(path);
    root.fill(&WHITE).map_err(&f)?;
    let areas = root.split_evenly((3, 1));
    let hb = stats::decode(&before.histogram)?;
    let ha = stats::decode(&after.histogram)?;
    let sides = [
        (format!("before: {}", cmp.before.file), BLUE, before, &hb),
        (format!("after: {}", cmp.after.file), RED, after, &ha),
    ];
    distributions(&areas[0], &sides).map_err(fail(path))?;
    over_time(
        &areas[1],
        &sides,
        ("throughput over time", "queries / s"),
        SeriesLabelPosition::LowerRight,
        |s| s.qps,
    )
    .map_err(fail(path))?;
    over_time(
        &areas[2],
        &sides,
        ("p99 latency over time", "ms"),
        SeriesLabelPosition::UpperRight,
        |s| ms(s.p99_us),
    )
    .map_err(fail(path))?;
    root.present().map_err(&f)?;
    Ok(())
}

type Sides<'a> = [(String, RGBColor, &'a Report, &'a Histogram<u64>); 2];

fn distributions(area: &Area<'_>, sides: &Sides<'_>) -> Drawn {
    let curves: Vec<Vec<(f64, f64)>> = sides.iter().map(|s| percentile_curve(s.3)).collect();
    let x_end = curves
        .iter()
        .flat_map(|c| c.last().map(|p| p.0))
        .fold(10.0, f64::max);
    let values = || {
        curves
            .iter()
            .flat_map(|c| c.iter().map(|p| p.1))
            .filter(|v| *v > 0.0)
    };
    let y_max = values().fold(0.01, f64::max) * 1.5;
    let y_min = values().fold(f64::INFINITY, f64::min).min(y_max / 10.0) / 1.5;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "latency by percentile (from the intended send time)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(80)
        .build_cartesian_2d((1f64..x_end).log_scale(), (y_min..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("percentile (log scale)")
        .y_desc("ms (log)")
        .x_label_formatter(&|x| percent_label(*x))
        .draw()?;
    for ((name, color, _, _), curve) in sides.iter().zip(curves) {
        let curve = curve.into_iter().filter(|p| p.1 > 0.0);
        chart
            .draw_series(LineSeries::new(curve, color.stroke_width(2)))?
            .label(name.as_str())
            .legend(line_key(*color));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

fn over_time(
    area: &Area<'_>,
    sides: &Sides<'_>,
    (caption, unit): (&str, &str),
    legend_at: SeriesLabelPosition,
    value: fn(&SecondReport) -> f64,
) -> Drawn {
    let series: Vec<Vec<(f64, f64)>> = sides
        .iter()
        .map(|s| s.2.series.iter().map(|p| (p.t as f64, value(p))).collect())
        .collect();
    let t_max = sides.iter().map(|s| t_max(&s.2.series)).fold(1.0, f64::max);
    let y_max = series
        .iter()
        .flat_map(|v| v.iter().map(|p| p.1))
        .fold(0.01, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds into the measured window")
        .y_desc(unit)
        .draw()?;
    for ((name, color, _, _), points) in sides.iter().zip(series) {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name.as_str())
            .legend(line_key(*color));
    }
    legend(&mut chart, legend_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::report::{Cpu, Parts, SeriesPoint};
    use crate::stats::{tests::sample, Outcome, Tally, Totals};
    use crate::workload::Op;

    /// A report over `shards` shards with `ok` successes per shard, `seconds` of series and
    /// `routers` routers.
    fn report(shards: usize, ok: u64, seconds: u64, routers: usize) -> Report {
        let mut t = Totals::new(shards);
        let mut second = Tally::default();
        for s in 0..shards {
            for i in 0..ok {
                let us = 100 + i * 37 + s as u64;
                t.record(&sample(s, Op::Read, &Outcome::Ok, us));
                second.hist.record(us).expect("record");
                second.counts.ok += 1;
            }
        }
        t.record(&sample(0, Op::Read, &Outcome::Timeout, 0));
        t.shard_hists = (0..shards).map(|_| stats::new_shard_hist()).collect();
        let series: Vec<SeriesPoint> = (0..seconds)
            .map(|k| SeriesPoint {
                unix_s: 1000 + k,
                t: k + 1,
                seconds: 1.0,
                totals: second.clone(),
            })
            .collect();
        Report::build(Parts {
            settings: crate::merge::tests::settings(),
            hosts: vec![],
            routers: (0..routers)
                .map(|i| (format!("postgres://r{i}"), Tally::of(&t)))
                .collect(),
            ranges: (0..shards).map(|i| format!("r{i}")).collect(),
            duration_s: seconds as f64,
            target_qps: Some(10.0),
            totals: &t,
            series: &series,
            cpu: Cpu::default(),
            warnings: vec![],
        })
        .expect("report")
    }

    #[test]
    fn draws_every_shape_of_report() {
        let dir = std::env::temp_dir().join(format!("loadgen-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let cases = [
            ("many", report(512, 3, 5, 3)),
            ("one", report(1, 10, 1, 1)),
            ("nothing succeeded", report(4, 0, 3, 0)),
            ("no series", report(2, 5, 0, 2)),
        ];
        for (name, r) in &cases {
            let path = dir.join(format!("{name}.svg"));
            draw(r, &path).unwrap_or_else(|e| panic!("{name}: {e}"));
            let svg = std::fs::read_to_string(&path).expect("svg");
            assert!(svg.contains("QPS per shard"), "{name}");
            // Renderers skip shapes of negative size: none may be drawn.
            assert!(
                !svg.contains("width=\"-") && !svg.contains("height=\"-"),
                "{name}"
            );
            if r.counts.ok > 0 {
                let bars = svg.matches("fill=\"#0000FF\"").count();
                assert!(bars >= r.shards.len(), "{name}: {bars} bars");
            }
        }
        for (a, b) in [(0, 1), (2, 2), (1, 3)] {
            let (ra, rb) = (&cases[a].1, &cases[b].1);
            let cmp = crate::compare::compare("a", ra, "b", rb).expect("compare");
            let path = dir.join(format!("compare-{a}-{b}.svg"));
            draw_compare(&cmp, ra, rb, &path).unwrap_or_else(|e| panic!("{a} vs {b}: {e}"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn percentile_axis_reads_as_percentiles() {
        assert_eq!(percent_label(1.0), "0%");
        assert_eq!(percent_label(10.0), "90%");
        assert_eq!(percent_label(100.0), "99%");
        assert_eq!(percent_label(1000.0), "99.9%");
        assert_eq!(percent_label(10000.0), "99.99%");
    }

    #[test]
    fn the_percentile_curve_follows_the_histogram() {
        let mut h = stats::new_hist();
        for v in 1..=1000u64 {
            h.record(v * 10).expect("record");
        }
        let c = percentile_curve(&h);
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        let last = c.last().copied().unwrap_or_default();
        assert_eq!((last.0, last.1), (1000.0, ms(h.max())));
        assert!((last.1 - 10.0).abs() < 0.011, "{last:?}");
    }
}
