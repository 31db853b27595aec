//! The font chart text is drawn with, found at runtime.
//!
//! plotters' default `ttf` feature finds system fonts through font-kit, which links
//! fontconfig/freetype — system libraries a clean CI machine may not have. Instead its
//! `ab_glyph` feature rasterises text in pure Rust from font bytes registered here: the file
//! named by `LOADTEST_FONT`, else the first of [`FONT_CANDIDATES`] that exists and parses. With
//! ab_glyph, text in a family nobody registered is an error, not a fallback, so when no font is
//! found the charts are drawn in [`Text::Omitted`] mode — lines, bars, grid, no captions, tick
//! labels or legends — and one warning goes to stderr. The charts are secondary to `summary.md`
//! and `results.json`, which carry every figure: a missing font must never fail a report.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

/// Family the loaded font is registered under. Deliberately not plotters' default
/// `sans-serif`: every text style here names this family, so a label that slipped through
/// with plotters' implicit default fails the tests instead of depending on the registry.
const FAMILY: &str = "loadtest-sans";

/// Environment variable naming a TrueType/OpenType file to draw text with.
pub const FONT_ENV: &str = "LOADTEST_FONT";

/// Where common distributions (and macOS) keep a plain sans-serif font.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// The font file registered for [`FAMILY`], found once per process; `None` (after one warning
/// on stderr) when there is none.
pub(super) fn font() -> Option<&'static Path> {
    static FONT: OnceLock<Option<PathBuf>> = OnceLock::new();
    FONT.get_or_init(load_font).as_deref()
}

fn load_font() -> Option<PathBuf> {
    let from_env = std::env::var_os(FONT_ENV).map(PathBuf::from);
    let candidates = from_env
        .iter()
        .cloned()
        .chain(FONT_CANDIDATES.iter().map(PathBuf::from));
    for path in candidates {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        // plotters keeps registered fonts for the life of the process and wants `'static`
        // bytes: leaked once per process (at most one file per candidate).
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        if register_font(FAMILY, FontStyle::Normal, bytes).is_ok() {
            return Some(path);
        }
    }
    let asked = from_env
        .map(|p| format!(" ({FONT_ENV}={} unreadable or not a font)", p.display()))
        .unwrap_or_default();
    eprintln!(
        "loadtest: no TrueType font found{asked}; charts are drawn without text. Set \
         {FONT_ENV}=/path/to/font.ttf (e.g. DejaVuSans.ttf) for labels."
    );
    None
}

/// Whether the charts carry text (captions, tick labels, legends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Text {
    /// A font is registered for [`FAMILY`].
    Drawn,
    /// No font: shapes only; nothing may ask plotters for a font.
    Omitted,
}

impl Text {
    /// [`Text::Drawn`] when a font is found (looked for once), else [`Text::Omitted`].
    pub(super) fn available() -> Self {
        if font().is_some() {
            Text::Drawn
        } else {
            Text::Omitted
        }
    }

    pub(super) fn drawn(self) -> bool {
        self == Text::Drawn
    }

    pub(super) fn style(size: u32) -> TextStyle<'static> {
        (FAMILY, size).into_font().into()
    }

    /// A chart builder on `area` with a caption, and label areas sized for tick labels (or
    /// just the axis lines without text).
    pub(super) fn builder<'a, 'b>(
        self,
        area: &'a DrawingArea<BitMapBackend<'b>, Shift>,
        title: &str,
    ) -> ChartBuilder<'a, 'b, BitMapBackend<'b>> {
        let mut builder = ChartBuilder::on(area);
        builder.margin(12);
        if self.drawn() {
            builder
                .caption(title, Self::style(18))
                .x_label_area_size(38)
                .y_label_area_size(62);
        } else {
            builder.x_label_area_size(4).y_label_area_size(4);
        }
        builder
    }
}
