//! What a chart is to the rest of the crate: the [`Limits`] it must stay within, the
//! [`ResolvedChart`] a resolve gives, and the [`ContentError`]s of a chart whose files fail the
//! checks (those of `local.rs` and `archive.rs`, for local and fetched charts alike).

use std::path::PathBuf;

/// Bounds on what a chart may contain.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most files in a chart (directory or archive).
    pub max_files: usize,
    /// Most bytes: of the archive file, and of all files unpacked.
    pub max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_files: 5_000,
            max_bytes: 20 * 1024 * 1024,
        }
    }
}

/// A chart on local disk, identified by its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedChart {
    /// `sha256:<hex>`: of the archive bytes, or of a directory's sorted paths and contents.
    pub digest: String,
    /// Where helm reads it.
    pub path: PathBuf,
}

/// What is wrong with a chart's files, or reading them: bad input, all of them (they wait for a
/// spec change).
#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    /// a directory chart has no `Chart.yaml`.
    #[error("{0:?} is not a chart: it has no Chart.yaml")]
    NotAChart(String),
    /// the chart holds a symbolic link, a device or another non-regular file.
    #[error("chart entry {0:?} is not a regular file or directory")]
    UnsupportedEntry(String),
    /// an archive entry has an absolute path or `..`.
    #[error("chart archive entry {0:?} escapes the chart")]
    UnsafePath(String),
    /// the chart exceeds a limit.
    #[error("chart exceeds the limit of {limit} {what}")]
    TooLarge {
        /// `files` or `bytes`.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// the archive could not be read.
    #[error("chart archive {path:?} is not a valid .tgz: {source}")]
    Archive {
        /// The archive.
        path: String,
        /// What went wrong.
        source: std::io::Error,
    },
    /// reading the chart failed.
    #[error("read chart {path:?}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}
