//! `--chart FILE.svg`: throughput and p50/p99 latency over time, and the QPS of every shard
//! as bars (plotters, SVG backend only: no font or bitmap libraries).

use std::path::Path;

use plotters::prelude::*;

use crate::report::Report;

type Failure = String;

fn fail<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> Failure + '_ {
    move |e| format!("cannot draw the chart {}: {e}", path.display())
}

/// Draws the report's chart into an SVG file.
pub fn draw(report: &Report, path: &Path) -> Result<(), Failure> {
    let root = SVGBackend::new(path, (1100, 1100)).into_drawing_area();
    root.fill(&WHITE).map_err(fail(path))?;
    let areas = root.split_evenly((3, 1));
    let f = fail(path);

    let t_max = report.series.iter().map(|s| s.t as f64).fold(1.0, f64::max);
    let title = format!(
        "loadgen: {} ({} shards, {} connections, {})",
        report.settings.targets,
        report.shards.len(),
        report.settings.connections,
        report.settings.rate
    );

    // Throughput over time.
    let qps: Vec<(f64, f64)> = report.series.iter().map(|s| (s.t as f64, s.qps)).collect();
    let q_max = qps
        .iter()
        .map(|p| p.1)
        .chain(report.target_qps)
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&areas[0])
        .caption(format!("{title}: throughput"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..t_max, 0f64..q_max)
        .map_err(&f)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("queries / s")
        .draw()
        .map_err(&f)?;
    chart
        .draw_series(LineSeries::new(qps, BLUE.stroke_width(2)))
        .map_err(&f)?
        .label("achieved (ok/s)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    if let Some(target) = report.target_qps {
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, target), (t_max, target)],
                BLACK.mix(0.5),
            ))
            .map_err(&f)?
            .label("target")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
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
            .draw_series(LineSeries::new(errors, RED))
            .map_err(&f)?
            .label("errors + timeouts / s")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(&f)?;

    // Latency over time.
    let ms = |us: u64| us as f64 / 1000.0;
    let p50: Vec<(f64, f64)> = report
        .series
        .iter()
        .map(|s| (s.t as f64, ms(s.p50_us)))
        .collect();
    let p99: Vec<(f64, f64)> = report
        .series
        .iter()
        .map(|s| (s.t as f64, ms(s.p99_us)))
        .collect();
    let l_max = p99.iter().map(|p| p.1).fold(0.01, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&areas[1])
        .caption(
            "latency from the intended send time (coordinated omission corrected)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..t_max, 0f64..l_max)
        .map_err(&f)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("ms")
        .draw()
        .map_err(&f)?;
    chart
        .draw_series(LineSeries::new(p50, GREEN.stroke_width(2)))
        .map_err(&f)?
        .label("p50")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN));
    chart
        .draw_series(LineSeries::new(p99, MAGENTA.stroke_width(2)))
        .map_err(&f)?
        .label("p99")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], MAGENTA));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(&f)?;

    // QPS per shard.
    let n = report.shards.len().max(1) as f64;
    let s_max = report.shards.iter().map(|s| s.qps).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&areas[2])
        .caption(
            format!(
                "QPS per shard: min {:.1}, max {:.1}, stddev {:.1}",
                report.shard_qps.min, report.shard_qps.max, report.shard_qps.stddev
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..n, 0f64..s_max)
        .map_err(&f)?;
    chart
        .configure_mesh()
        .x_desc("shard")
        .y_desc("queries / s")
        .disable_x_mesh()
        .draw()
        .map_err(&f)?;
    chart
        .draw_series(report.shards.iter().map(|s| {
            let x = s.index as f64;
            Rectangle::new([(x + 0.1, 0.0), (x + 0.9, s.qps)], BLUE.mix(0.7).filled())
        }))
        .map_err(&f)?;
    root.present().map_err(&f)?;
    Ok(())
}
