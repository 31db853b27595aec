//! Local charts: a directory or `.tgz` under the chart root, hashed by content.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::archive::{Budget, check_archive};
use super::chart::{ContentError, Limits, ResolvedChart};
use super::error::SourceError;

pub(super) fn resolve_path(
    spec_path: &str,
    root: &Path,
    limits: Limits,
) -> Result<ResolvedChart, SourceError> {
    let joined = root.join(spec_path);
    let path = joined
        .canonicalize()
        .map_err(|_| SourceError::NotFound(spec_path.to_owned()))?;
    if !path.starts_with(root) {
        return Err(SourceError::OutsideRoot {
            path: spec_path.to_owned(),
            root: root.display().to_string(),
        });
    }
    let digest = if path.is_dir() {
        if !path.join("Chart.yaml").is_file() {
            return Err(ContentError::NotAChart(spec_path.to_owned()).into());
        }
        digest_directory(&path, limits)?
    } else {
        digest_archive(&path, limits)?
    };
    Ok(ResolvedChart { digest, path })
}

/// Hashes every file under `dir` in sorted path order (path, length, content), refusing links;
/// `.tgz` files (packaged subcharts, which helm loads) are checked like an archive chart.
fn digest_directory(dir: &Path, limits: Limits) -> Result<String, ContentError> {
    let mut hasher = Sha256::new();
    let mut budget = Budget::new(limits);
    let mut stack = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let io = |source| ContentError::Io {
            path: relative.display().to_string(),
            source,
        };
        let mut entries: Vec<_> = std::fs::read_dir(dir.join(&relative))
            .map_err(io)?
            .collect::<Result<_, _>>()
            .map_err(io)?;
        entries.sort_by_key(|e| e.file_name());
        // Directories are pushed in reverse so they pop in sorted order.
        for entry in entries.into_iter().rev() {
            let name = relative.join(entry.file_name());
            let io = |source| ContentError::Io {
                path: name.display().to_string(),
                source,
            };
            let kind = entry.file_type().map_err(io)?;
            if kind.is_dir() {
                hasher.update(format!("D\0{}\0", name.display()));
                stack.push(name);
            } else if kind.is_file() {
                let content = read_bounded(&dir.join(&name), limits.max_bytes)?;
                budget.add(1, content.len() as u64)?;
                if name.extension().is_some_and(|e| e == "tgz") {
                    check_archive(&name.display().to_string(), &content, &mut budget, 1)?;
                }
                hasher.update(format!("F\0{}\0{}\0", name.display(), content.len()));
                hasher.update(&content);
            } else {
                return Err(ContentError::UnsupportedEntry(name.display().to_string()));
            }
        }
    }
    Ok(format!("sha256:{:x}", hasher.finalize()))
}

/// Reads a regular file of at most `max` bytes (a device or FIFO is refused, not read).
pub(super) fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, ContentError> {
    let shown = path.display().to_string();
    let io = |source| ContentError::Io {
        path: shown.clone(),
        source,
    };
    // stat before open: opening a FIFO for reading would block until a writer appears.
    if !std::fs::metadata(path).map_err(io)?.is_file() {
        return Err(ContentError::UnsupportedEntry(shown));
    }
    let file = std::fs::File::open(path).map_err(io)?;
    let mut content = Vec::new();
    file.take(max + 1).read_to_end(&mut content).map_err(io)?;
    if content.len() as u64 > max {
        return Err(ContentError::TooLarge {
            what: "bytes",
            limit: max,
        });
    }
    Ok(content)
}

/// Hashes a `.tgz` chart after checking it (see [`check_archive`]).
fn digest_archive(path: &Path, limits: Limits) -> Result<String, ContentError> {
    let bytes = read_bounded(path, limits.max_bytes)?;
    check_archive(
        &path.display().to_string(),
        &bytes,
        &mut Budget::new(limits),
        0,
    )?;
    Ok(format!("sha256:{:x}", Sha256::digest(&bytes)))
}
