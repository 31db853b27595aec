//! The report of a run: `results.json`, the Markdown summary `summary.md`, PNG charts, and
//! the dashboards' panels as PNGs (when Prometheus watched the run).

mod charts;
mod font;
mod markdown;
mod panels;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::results::RunResult;

pub use charts::charts;
pub use font::FONT_ENV;
pub use markdown::markdown;

/// Writes the whole report into `dir` (created if needed): `results.json` (pretty),
/// `summary.md`, then the charts the run has data for. Returns the files written, in that
/// order.
pub fn write(result: &RunResult, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(result).context("serialising the run's results")?;
    let mut written = vec![
        write_file(dir, "results.json", json + "\n")?,
        write_file(dir, "summary.md", markdown(result))?,
    ];
    written.extend(charts(result, dir)?);
    if !panels::planned(result).is_empty() {
        written.extend(panels::render(result, dir, font::Text::available())?);
    }
    Ok(written)
}

fn write_file(dir: &Path, name: &str, contents: String) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
