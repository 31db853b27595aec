//! The PNG charts of a run (plotters, bitmap backend), each drawn only when the run has data
//! for it. Text is drawn only when a font was found (see `font.rs`); without one the charts
//! carry lines, bars and grid only.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::font::Text;
use crate::results::{Burst, CapacityStep, Mttp, MttpBurst, RunResult, Sample};

/// One chart file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Chart {
    /// Operations and convergence, queue depth, unowned shards over time, with the events.
    Timeline,
    /// CPU and RSS per replica over time.
    Replicas,
    /// `scale-out`: capacity per fleet size, p99 against offered load.
    Capacity,
    /// Manifests per second of each baseline path.
    Baselines,
    /// `mttp`: time to all Ready, CPU, requests and memory against the burst size.
    Mttp,
}

impl Chart {
    pub(super) fn file_name(self) -> &'static str {
        match self {
            Chart::Timeline => "timeline.png",
            Chart::Replicas => "replicas.png",
            Chart::Capacity => "capacity.png",
            Chart::Baselines => "baselines.png",
            Chart::Mttp => "mttp.png",
        }
    }

    pub(super) fn title(self) -> &'static str {
        match self {
            Chart::Timeline => "Timeline",
            Chart::Replicas => "Replicas",
            Chart::Capacity => "Capacity",
            Chart::Baselines => "Baselines",
            Chart::Mttp => "MTTP",
        }
    }
}

/// The charts `result` has data for, in the order they are drawn and linked.
pub(super) fn planned(result: &RunResult) -> Vec<Chart> {
    let has_replica_samples = result
        .timeline
        .iter()
        .any(|s| !s.cpu_cores.is_empty() || !s.rss_mib.is_empty());
    [
        (Chart::Timeline, !result.timeline.is_empty()),
        (Chart::Replicas, has_replica_samples),
        (Chart::Capacity, !result.capacity.is_empty()),
        (Chart::Baselines, result.baselines.is_some()),
        (
            Chart::Mttp,
            result.mttp.as_ref().is_some_and(|m| !m.bursts.is_empty()),
        ),
    ]
    .into_iter()
    .filter_map(|(chart, has_data)| has_data.then_some(chart))
    .collect()
}

/// Draws every chart `result` has data for into `dir`; returns the files written. Without a
/// font (see the module doc) the charts are still written, without text.
pub fn charts(result: &RunResult, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if planned(result).is_empty() {
        // Nothing to draw: no font lookup, no warning.
        return Ok(Vec::new());
    }
    render(result, dir, Text::available())
}

pub(super) fn render(result: &RunResult, dir: &Path, text: Text) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    planned(result)
        .into_iter()
        .map(|chart| {
            let path = dir.join(chart.file_name());
            draw(chart, result, &path, text)
                .with_context(|| format!("drawing {}", path.display()))?;
            Ok(path)
        })
        .collect()
}

fn draw(chart: Chart, result: &RunResult, path: &Path, text: Text) -> anyhow::Result<()> {
    match chart {
        Chart::Timeline => timeline(result, path, text),
        Chart::Replicas => replicas(result, path, text),
        Chart::Capacity => capacity(result, path, text),
        Chart::Mttp => match &result.mttp {
            Some(m) => mttp(m, path, text),
            None => Ok(()),
        },
        Chart::Baselines => match &result.baselines {
            Some(b) => baselines(
                &[
                    ("fleet", Some(&b.fleet)),
                    ("single replica", b.single_replica.as_ref()),
                    ("bare apply", b.bare_apply.as_ref()),
                    ("helm", b.helm.as_ref()),
                ],
                path,
                text,
            ),
            None => Ok(()),
        },
    }
}

// --- line panels --------------------------------------------------------------------------

pub(super) type Area<'b> = DrawingArea<BitMapBackend<'b>, Shift>;

/// One line of a panel.
pub(super) struct Line {
    name: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// A line chart on one drawing area.
pub(super) struct Panel<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    lines: Vec<Line>,
    /// The Grafana unit the y axis' values are written in (plain numbers when `None`).
    pub(super) y_unit: Option<&'a str>,
    /// Horizontal reference lines (SLOs), with a label.
    thresholds: Vec<(f64, String)>,
    /// Vertical marks (events), with a label.
    marks: Vec<(f64, String)>,
    /// Whether the marks' labels are drawn (once per figure is enough).
    mark_labels: bool,
    /// Dots on the points, for sparse data.
    dots: bool,
}

impl<'a> Panel<'a> {
    pub(super) fn new(title: &'a str, x_desc: &'a str, y_desc: &'a str, lines: Vec<Line>) -> Self {
        Panel {
            title,
            x_desc,
            y_desc,
            lines,
            y_unit: None,
            thresholds: Vec::new(),
            marks: Vec::new(),
            mark_labels: false,
            dots: false,
        }
    }

    fn x_range(&self) -> Range<f64> {
        let xs = self.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
        let (lo, hi) = bounds(xs.chain(self.marks.iter().map(|m| m.0)));
        if lo < hi { lo..hi } else { lo - 0.5..hi + 0.5 }
    }

    /// From zero (or the lowest value, when negative) to a margin above the highest value or
    /// threshold.
    fn y_range(&self) -> Range<f64> {
        let ys = self.lines.iter().flat_map(|l| l.points.iter().map(|p| p.1));
        let (lo, hi) = bounds(ys.chain(self.thresholds.iter().map(|t| t.0)));
        let lo = lo.min(0.0);
        let hi = if hi > lo { hi * 1.1 } else { lo + 1.0 };
        lo..hi
    }
}

/// Lowest and highest finite value (0, 0 when there is none).
fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc: Option<(f64, f64)>, v| {
            Some(acc.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))))
        })
        .unwrap_or((0.0, 0.0))
}

/// `panels` one above the other, 1200 pixels wide and `height` high, into the PNG at `path`.
fn stacked(path: &Path, height: u32, panels: &[Panel<'_>], text: Text) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, panel) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        line_panel(area, panel, text)?;
    }
    root.present()?;
    Ok(())
}

pub(super) fn line_panel(area: &Area<'_>, panel: &Panel<'_>, text: Text) -> anyhow::Result<()> {
    let (x_range, y_range) = (panel.x_range(), panel.y_range());
    let mut chart = text
        .builder(area, panel.title)
        .build_cartesian_2d(x_range.clone(), y_range.clone())?;
    let unit = panel.y_unit.unwrap_or_default();
    let in_unit = |v: &f64| crate::prometheus::units::format(unit, *v);
    let mut mesh = chart.configure_mesh();
    mesh.max_light_lines(4);
    if panel.y_unit.is_some() {
        mesh.y_label_formatter(&in_unit);
    }
    if text.drawn() {
        mesh.label_style(Text::style(13))
            .axis_desc_style(Text::style(14))
            .x_desc(panel.x_desc)
            .y_desc(panel.y_desc);
    } else {
        mesh.disable_axes();
    }
    mesh.draw()?;

    for (i, (x, label)) in panel.marks.iter().enumerate() {
        let color = RGBColor(200, 60, 60).mix(0.6);
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(*x, y_range.start), (*x, y_range.end)],
            color.stroke_width(1),
        )))?;
        if text.drawn() && panel.mark_labels {
            // Staggered down from the top so that close events stay legible.
            let height = y_range.end - y_range.start;
            let y = y_range.end - height * (0.04 + 0.07 * (i % 3) as f64);
            chart.draw_series(std::iter::once(plotters::element::Text::new(
                format!(" {}", short(label, 24)),
                (*x, y),
                Text::style(11).color(&RGBColor(150, 30, 30)),
            )))?;
        }
    }
    for (y, label) in &panel.thresholds {
        let series = chart.draw_series(std::iter::once(PathElement::new(
            vec![(x_range.start, *y), (x_range.end, *y)],
            RED.stroke_width(2),
        )))?;
        if text.drawn() {
            series
                .label(label.clone())
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], RED.stroke_width(2)));
        }
    }
    for line in &panel.lines {
        let style = line.color.stroke_width(2);
        let series = chart.draw_series(LineSeries::new(line.points.iter().copied(), style))?;
        if text.drawn() {
            let color = line.color;
            series.label(line.name.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        }
        if panel.dots {
            chart.draw_series(
                line.points
                    .iter()
                    .map(|p| Circle::new(*p, 4, line.color.filled())),
            )?;
        }
    }
    if text.drawn() && (!panel.lines.is_empty() || !panel.thresholds.is_empty()) {
        chart
            .configure_series_labels()
            .label_font(Text::style(12))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
    }
    Ok(())
}

/// At most `max` characters, with an ellipsis when cut.
fn short(label: &str, max: usize) -> String {
    if label.chars().count() <= max {
        label.to_owned()
    } else {
        let cut: String = label.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

pub(super) fn line(name: impl Into<String>, color: RGBColor, points: Vec<(f64, f64)>) -> Line {
    Line {
        name: name.into(),
        color,
        points: points
            .into_iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect(),
    }
}

/// Line and bar colours (matplotlib's "tab10", which stays legible on white), cycled.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub(super) fn palette(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

const BLUE_LINE: RGBColor = PALETTE[0];
const ORANGE_LINE: RGBColor = PALETTE[1];
const GREEN_LINE: RGBColor = PALETTE[2];
const RED_LINE: RGBColor = PALETTE[3];

// --- the charts ---------------------------------------------------------------------------

fn timeline(result: &RunResult, path: &Path, text: Text) -> anyhow::Result<()> {
    let samples = &result.timeline;
    let series = |f: &dyn Fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        samples.iter().map(|s| (s.t, f(s))).collect()
    };
    let marks: Vec<(f64, String)> = samples
        .iter()
        .filter(|s| !s.events.is_empty())
        .map(|s| (s.t, s.events.join(", ")))
        .collect();
    let x_desc = "seconds since the load phase started";
    let mut panels = [
        Panel::new(
            "Throughput",
            x_desc,
            "per second",
            vec![
                line(
                    "operations/s",
                    BLUE_LINE,
                    series(&|s| s.operations_per_second),
                ),
                line(
                    "converged/s",
                    GREEN_LINE,
                    series(&|s| s.converged_per_second),
                ),
            ],
        ),
        Panel::new(
            "Queue depth (all replicas)",
            x_desc,
            "items",
            vec![line("queue depth", ORANGE_LINE, series(&|s| s.queue_depth))],
        ),
        Panel::new(
            "Shards without a live owner",
            x_desc,
            "shards",
            vec![line(
                "unowned shards",
                RED_LINE,
                series(&|s| f64::from(s.unowned_shards)),
            )],
        ),
    ];
    for (i, panel) in panels.iter_mut().enumerate() {
        panel.marks = marks.clone();
        panel.mark_labels = i == 0;
    }
    stacked(path, 1000, &panels, text)
}

fn replicas(result: &RunResult, path: &Path, text: Text) -> anyhow::Result<()> {
    let samples = &result.timeline;
    let mut names: Vec<&String> = samples
        .iter()
        .flat_map(|s| s.cpu_cores.keys().chain(s.rss_mib.keys()))
        .collect();
    names.sort();
    names.dedup();
    let per_replica = |pick: fn(&Sample) -> &BTreeMap<String, f64>| -> Vec<Line> {
        names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let points = samples
                    .iter()
                    .filter_map(|s| pick(s).get(*name).map(|v| (s.t, *v)))
                    .collect();
                line(name.as_str(), palette(i), points)
            })
            .collect()
    };
    let cpu = per_replica(|s| &s.cpu_cores);
    let rss = per_replica(|s| &s.rss_mib);
    let x_desc = "seconds since the load phase started";
    let panels = [
        Panel::new("CPU per replica", x_desc, "cores", cpu),
        Panel::new("Resident memory per replica", x_desc, "MiB", rss),
    ];
    stacked(path, 800, &panels, text)
}

/// Left column: the capacity curve (objects, ops/s at the last passing step against replicas);
/// right column: per fleet size, p99 Ready and p99 queue wait against the offered create rate,
/// with the SLOs.
fn capacity(result: &RunResult, path: &Path, text: Text) -> anyhow::Result<()> {
    let mut sizes: Vec<_> = result.capacity.iter().collect();
    sizes.sort_by_key(|c| c.replicas);
    let points = |pick: &dyn Fn(&CapacityStep) -> f64| -> Vec<(f64, f64)> {
        sizes
            .iter()
            .filter_map(|c| c.point().map(|p| (f64::from(c.replicas), pick(p))))
            .collect()
    };
    let mut objects = Panel::new(
        "Capacity: objects at the last passing step",
        "replicas",
        "Manifests",
        vec![line("objects", BLUE_LINE, points(&|p| p.objects as f64))],
    );
    let mut ops = Panel::new(
        "Capacity: operations/s at the last passing step",
        "replicas",
        "operations/s",
        vec![line(
            "ops/s",
            GREEN_LINE,
            points(&|p| p.operations_per_second),
        )],
    );
    objects.dots = true;
    ops.dots = true;
    let p99 = |pick: &dyn Fn(&CapacityStep) -> Option<f64>| -> Vec<Line> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let points = c
                    .steps
                    .iter()
                    .filter_map(|s| pick(s).map(|v| (s.create_rate, v)))
                    .collect();
                let plural = if c.replicas == 1 { "" } else { "s" };
                line(
                    format!("{} replica{plural}", c.replicas),
                    palette(i),
                    points,
                )
            })
            .collect()
    };
    let mut ready = Panel::new(
        "p99 create/update → Ready",
        "creates/s offered",
        "seconds",
        p99(&|s| s.ready_p99_seconds),
    );
    ready.thresholds = vec![(5.0, "SLO 5 s".to_owned())];
    ready.dots = true;
    let mut queue = Panel::new(
        "p99 queue wait",
        "creates/s offered",
        "seconds",
        p99(&|s| s.queue_wait_p99_seconds),
    );
    queue.thresholds = vec![(1.0, "SLO 1 s".to_owned())];
    queue.dots = true;

    let root = BitMapBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = [objects, ready, ops, queue];
    for (area, panel) in root.split_evenly((2, 2)).iter().zip(&panels) {
        line_panel(area, panel, text)?;
    }
    root.present()?;
    Ok(())
}

/// `mttp`: per fleet size (and the baselines), against the burst size: time to all Ready, CPU
/// seconds per Manifest, API requests per Manifest, peak RSS per replica.
fn mttp(m: &Mttp, path: &Path, text: Text) -> anyhow::Result<()> {
    let mut sizes: Vec<u32> = m.bursts.iter().map(|b| b.replicas).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let per_size = |pick: &dyn Fn(&MttpBurst) -> Option<f64>| -> Vec<Line> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, size)| {
                let points = m
                    .bursts
                    .iter()
                    .filter(|b| b.replicas == *size)
                    .filter_map(|b| pick(b).map(|v| (b.manifests as f64, v)))
                    .collect();
                line(
                    format!("{size} replica{}", if *size == 1 { "" } else { "s" }),
                    palette(i),
                    points,
                )
            })
            .collect()
    };
    let mut ready = per_size(&|b| Some(b.ready.all_ready_seconds));
    let baseline =
        |pick: &dyn Fn(&crate::results::MttpBaseline) -> Option<f64>| -> Vec<(f64, f64)> {
            m.baselines
                .iter()
                .filter_map(|b| pick(b).map(|v| (b.manifests as f64, v)))
                .collect()
        };
    let n = sizes.len();
    ready.push(line(
        "bare apply",
        palette(n),
        baseline(&|b| b.bare_apply.as_ref().map(|x| x.seconds)),
    ));
    ready.push(line(
        "helm",
        palette(n + 1),
        baseline(&|b| b.helm.as_ref().map(|x| x.seconds)),
    ));
    let x = "Manifests created at once";
    let mut panels = [
        Panel::new("Time to all Ready", x, "seconds", ready),
        Panel::new(
            "CPU per Manifest (replicas, renderer, helm)",
            x,
            "CPU seconds",
            per_size(&|b| Some(b.cpu_seconds_per_manifest)),
        ),
        Panel::new(
            "API requests per Manifest (the fleet's)",
            x,
            "requests",
            per_size(&|b| {
                b.operator_requests_per_manifest
                    .or(Some(b.api_requests_per_manifest))
            }),
        ),
        Panel::new(
            "Peak RSS per replica (renderer included)",
            x,
            "MiB",
            per_size(&|b| b.peak_rss_mib.values().copied().reduce(f64::max)),
        ),
    ];
    for panel in &mut panels {
        panel.dots = true;
    }
    let root = BitMapBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, panel) in root.split_evenly((2, 2)).iter().zip(&panels) {
        line_panel(area, panel, text)?;
    }
    root.present()?;
    Ok(())
}

/// One bar per path that ran, Manifests per second. Bar `i` is centred on x = `i` of a plain
/// numeric axis (plotters' segmented axis misplaces a single segment); ticks at the integers
/// carry the names.
fn baselines(paths: &[(&str, Option<&Burst>)], path: &Path, text: Text) -> anyhow::Result<()> {
    let bars: Vec<(&str, f64)> = paths
        .iter()
        .filter_map(|(name, burst)| burst.map(|b| (*name, b.per_second)))
        .map(|(name, v)| (name, if v.is_finite() { v } else { 0.0 }))
        .collect();
    let (_, top) = bounds(bars.iter().map(|b| b.1));
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };

    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = text
        .builder(&root, "Baselines: the same burst through each path")
        .build_cartesian_2d(-0.5..bars.len() as f64 - 0.5, 0.0..top)?;
    let name_at = |x: &f64| {
        let i = x.round();
        let on_bar = (x - i).abs() < 1e-6 && i >= 0.0;
        on_bar
            .then(|| bars.get(i as usize).map(|b| b.0.to_owned()))
            .flatten()
            .unwrap_or_default()
    };
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh().max_light_lines(4);
    if text.drawn() {
        mesh.label_style(Text::style(14))
            .axis_desc_style(Text::style(14))
            .x_labels(bars.len())
            .x_label_formatter(&name_at)
            .y_desc("Manifests/s");
    } else {
        mesh.disable_axes();
    }
    mesh.draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
        let x = i as f64;
        Rectangle::new([(x - 0.35, 0.0), (x + 0.35, *v)], palette(i).filled())
    }))?;
    if text.drawn() {
        let above = Text::style(14).pos(Pos::new(HPos::Center, VPos::Bottom));
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            plotters::element::Text::new(
                format!("{v:.1}/s"),
                (i as f64, *v + top * 0.02),
                above.clone(),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}
