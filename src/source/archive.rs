//! Chart archives: a `.tgz` checked as helm will read it, within the chart's budget of files and
//! bytes (nested subchart archives included).

use std::io::Read;
use std::path::Component;

use super::{Limits, SourceError};

/// Counts files and unpacked bytes of a chart, subcharts included, against the limits.
pub(super) struct Budget {
    limits: Limits,
    files: usize,
    bytes: u64,
}

impl Budget {
    pub(super) fn new(limits: Limits) -> Self {
        Self {
            limits,
            files: 0,
            bytes: 0,
        }
    }

    pub(super) fn add(&mut self, files: usize, bytes: u64) -> Result<(), SourceError> {
        self.files += files;
        self.bytes += bytes;
        if self.files > self.limits.max_files {
            return Err(SourceError::TooLarge {
                what: "files",
                limit: self.limits.max_files as u64,
            });
        }
        if self.bytes > self.limits.max_bytes {
            return Err(SourceError::TooLarge {
                what: "bytes",
                limit: self.limits.max_bytes,
            });
        }
        Ok(())
    }
}

/// How deep archives may nest (a chart's `charts/*.tgz`, their `charts/*.tgz`, …).
const MAX_NESTING: usize = 4;

/// Checks an archive as helm will read it: every gzip member (helm reads them all), every entry
/// a regular file or directory with a relative path without `..`, nested `.tgz` subcharts
/// likewise, the bytes really decompressed (not the headers' claims) within the budget, and
/// nothing but zero padding after the tar end marker.
pub(super) fn check_archive(
    shown: &str,
    bytes: &[u8],
    budget: &mut Budget,
    depth: usize,
) -> Result<(), SourceError> {
    let archive_error = |source| SourceError::Archive {
        path: shown.to_owned(),
        source,
    };
    if depth > MAX_NESTING {
        return Err(archive_error(std::io::Error::other(
            "archives nested too deep",
        )));
    }
    let mut archive = tar::Archive::new(flate2::read::MultiGzDecoder::new(bytes));
    for entry in archive.entries().map_err(archive_error)? {
        let mut entry = entry.map_err(archive_error)?;
        let entry_path = entry.path().map_err(archive_error)?.into_owned();
        let shown_entry = entry_path.display().to_string();
        if entry_path
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(SourceError::UnsafePath(shown_entry));
        }
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() || kind.is_dir() {
            continue;
        }
        if !kind.is_file() {
            return Err(SourceError::UnsupportedEntry(shown_entry));
        }
        let remaining = budget.limits.max_bytes.saturating_sub(budget.bytes);
        let mut content = Vec::new();
        (&mut entry)
            .take(remaining + 1)
            .read_to_end(&mut content)
            .map_err(archive_error)?;
        budget.add(1, content.len() as u64)?;
        if entry_path.extension().is_some_and(|e| e == "tgz") {
            check_archive(
                &format!("{shown}:{shown_entry}"),
                &content,
                budget,
                depth + 1,
            )?;
        }
    }
    let mut rest = archive.into_inner();
    let mut trailing = [0u8; 4096];
    loop {
        let read = rest.read(&mut trailing).map_err(archive_error)?;
        if read == 0 {
            return Ok(());
        }
        budget.add(0, read as u64)?; // zero padding is bounded too (a stream of zeros is a bomb)
        if trailing[..read].iter().any(|b| *b != 0) {
            return Err(archive_error(std::io::Error::other(
                "data after the end of the archive",
            )));
        }
    }
}
