//! The chaos timeline as one SVG: throughput, errors and timeouts, and p99/max latency per
//! second, one panel each on the same time axis, every fault drawn as a shaded band from its
//! start to the end of its command with its name above.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::Report;
use super::timeline::{Second, Window};

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Drawn = Result<(), Box<dyn std::error::Error>>;

const WIDTH: u32 = 1400;
const PANEL: u32 = 300;
const BAND: RGBColor = RGBColor(255, 200, 120);
const GREY: RGBColor = RGBColor(110, 110, 110);

/// Draws the timeline of `report` into `path`.
pub fn draw(report: &Report, seconds: &[Second], path: &Path) -> Result<(), String> {
    let fail =
        |e: Box<dyn std::error::Error>| format!("cannot draw the chart {}: {e}", path.display());
    let root = SVGBackend::new(path, (WIDTH, PANEL * 3 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(Box::new(e)))?;
    let (title, rest) = root.split_vertically(40);
    title
        .titled(
            &format!(
                "chaos: {} routers, {}/s, {} connections; {} faults; {}",
                report.targets,
                report.rate,
                report.connections,
                report.faults.len(),
                if report.passed() {
                    "invariants held"
                } else {
                    "INVARIANTS BROKEN"
                }
            ),
            ("sans-serif", 20),
        )
        .map_err(|e| fail(Box::new(e)))?;
    let areas = rest.split_evenly((3, 1));
    let t_max = (seconds.len() as f64).max(1.0);
    let ok: Vec<(f64, f64)> = seconds
        .iter()
        .enumerate()
        .map(|(i, s)| (i as f64, s.ok as f64))
        .collect();
    let bad: Vec<(f64, f64)> = seconds
        .iter()
        .enumerate()
        .map(|(i, s)| (i as f64, (s.error_count() + s.timeouts) as f64))
        .collect();
    // Seconds in which nothing completed have no latency to draw (not a latency of 0).
    let (p99, max): (Vec<_>, Vec<_>) = (0..seconds.len())
        .filter(|&i| !seconds[i].latency.is_empty())
        .map(|i| {
            let w = Window::of(seconds, i, i + 1);
            (
                (i as f64, w.p99_ms.max(0.01)),
                (i as f64, w.max_ms.max(0.01)),
            )
        })
        .unzip();
    panel(
        &areas[0],
        report,
        t_max,
        "completed requests / s",
        &[("ok / s", BLUE, ok)],
        Some(report.rate),
    )
    .map_err(fail)?;
    panel(
        &areas[1],
        report,
        t_max,
        "errors + timeouts / s",
        &[("errors + timeouts / s", RED, bad)],
        None,
    )
    .map_err(fail)?;
    latency(&areas[2], report, t_max, p99, max).map_err(fail)?;
    root.present().map_err(|e| fail(Box::new(e)))?;
    Ok(())
}

type Line<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

/// A linear panel of lines over time, with the fault bands and an optional target line.
fn panel(
    area: &Area<'_>,
    report: &Report,
    t_max: f64,
    y_desc: &str,
    lines: &[Line<'_>],
    target: Option<f64>,
) -> Drawn {
    let y_max = lines
        .iter()
        .flat_map(|l| l.2.iter().map(|p| p.1))
        .chain(target)
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(y_desc)
        .draw()?;
    bands(&mut chart, report, y_max)?;
    for (name, color, points) in lines {
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(key(*color));
    }
    if let Some(t) = target {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, t), (t_max, t)],
                8,
                5,
                GREY.stroke_width(1),
            ))?
            .label(format!("target {t}/s"))
            .legend(key(GREY));
    }
    legend(&mut chart)
}

/// p99 and max per second on a log scale (a fault's stall is orders of magnitude above the
/// steady state).
fn latency(
    area: &Area<'_>,
    report: &Report,
    t_max: f64,
    p99: Vec<(f64, f64)>,
    max: Vec<(f64, f64)>,
) -> Drawn {
    let y_max = max.iter().map(|p| p.1).fold(1.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, (0.01f64..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("latency ms (log)")
        .draw()?;
    bands(&mut chart, report, y_max)?;
    chart
        .draw_series(LineSeries::new(p99, BLUE.stroke_width(2)))?
        .label("p99")
        .legend(key(BLUE));
    chart
        .draw_series(LineSeries::new(max, MAGENTA))?
        .label("max")
        .legend(key(MAGENTA));
    legend(&mut chart)
}

/// Shades each fault from start to end (at least half a second wide) and names it.
fn bands<'a, Y>(
    chart: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, Y>,
    >,
    report: &Report,
    y_top: f64,
) -> Drawn
where
    Y: Ranged<ValueType = f64>,
{
    for (i, f) in report.faults.iter().enumerate() {
        let (x0, x1) = (f.fault.start_s, f.fault.end_s.max(f.fault.start_s + 0.5));
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x0, y_top * 0.0001), (x1, y_top)],
            BAND.mix(0.45).filled(),
        )))?;
        // Alternate label heights so faults close together stay readable.
        let y = if i % 2 == 0 {
            y_top * 0.97
        } else {
            y_top * 0.80
        };
        chart.draw_series(std::iter::once(Text::new(
            f.fault.name.clone(),
            (x0, y),
            ("sans-serif", 12),
        )))?;
    }
    Ok(())
}

fn key(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color)
}

fn legend<'a, CT: CoordTranslate>(chart: &mut ChartContext<'a, SVGBackend<'a>, CT>) -> Drawn {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}
