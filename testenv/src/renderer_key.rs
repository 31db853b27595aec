//! Where `hack/build-tools.sh` caches the renderer: its key over `HELM_VERSION` and the
//! renderer's sources, and the versions pinned in `hack/versions.env`. Shared, as this one file,
//! by testenv (`tools.rs`) and module-manager's build script (`build.rs`, so that `diff` finds
//! the renderer built for its checkout): the three must agree.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// `KEY=value` of a `hack/versions.env` text.
pub fn pinned<'a>(versions_env: &'a str, key: &str) -> Option<&'a str> {
    versions_env
        .lines()
        .filter_map(|line| line.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
}

/// The renderer's cache key, as `renderer_key` in `hack/build-tools.sh` computes it: the first 16
/// hex digits of the sha256 of `HELM_VERSION=<v>` and, for each `*.go`, `go.mod` and `go.sum` of
/// `src` in byte order, its name and the sha256 of its contents (one per line). The error is the
/// path that could not be read.
pub fn renderer_key(src: &Path, helm_version: &str) -> Result<String, PathBuf> {
    let read = |path: &Path| std::fs::read(path).map_err(|_| path.to_owned());
    let mut names: Vec<String> = std::fs::read_dir(src)
        .map_err(|_| src.to_owned())?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".go") || name == "go.mod" || name == "go.sum")
        .collect();
    names.sort();
    let mut listing = format!("HELM_VERSION={helm_version}\n");
    for name in names {
        let digest = Sha256::digest(read(&src.join(&name))?);
        listing.push_str(&format!("{name}\n{digest:x}\n"));
    }
    Ok(format!("{:x}", Sha256::digest(listing.as_bytes()))[..16].to_owned())
}
