//! Chart source: resolves `spec.chart` to a chart on disk with a content digest, within limits.
//! The entry points are here: `resolve` for a local chart, and `RemoteCharts::resolve` for
//! any source (a local one on a blocking thread, a remote one fetched by `remote`).
//!
//! Local charts (`spec.chart.path`) must lie under the configured chart root: a Manifest author
//! must not be able to point the manager at arbitrary files on its filesystem. They are read by
//! `local.rs`, archives checked by `archive.rs` (also for fetched charts), and repository and OCI
//! charts fetched by `remote`. What they share is in `chart.rs` (the limits, the resolved chart,
//! and what can be wrong with a chart's files); why a resolve failed in `error.rs`.

use std::path::Path;

use crate::api::ChartSource;

mod archive;
mod chart;
mod chart_version;
mod error;
mod local;
pub mod remote;
pub mod version;
pub mod yaml;

pub use self::chart::{ContentError, Limits, ResolvedChart};
pub use self::chart_version::local_chart_version;
pub use self::error::SourceError;
use self::local::resolve_path;
pub use remote::{
    Cidr, Credentials, CredentialsError, FetchError, FetchStats, KeyMaterial, Refusal,
    RemoteCharts, RemoteConfig, Reserved, VerifyError, ensure_crypto_provider,
};

/// Resolves a chart source relative to `root` (an absolute, canonical directory).
pub fn resolve(
    source: &ChartSource,
    root: &Path,
    limits: Limits,
) -> Result<ResolvedChart, SourceError> {
    match (&source.path, &source.repository, &source.oci) {
        (Some(path), None, None) => resolve_path(path, root, limits),
        (None, Some(_), None) | (None, None, Some(_)) => Err(SourceError::Unsupported(
            "a repository or OCI chart is fetched by RemoteCharts::resolve, not read from disk",
        )),
        // The CRD's CEL rule makes this unreachable through the API server.
        _ => Err(SourceError::Unsupported(
            "exactly one chart source must be set: path, repository (with name and version), or oci",
        )),
    }
}

impl RemoteCharts {
    /// Resolves any chart source: a local path (under `root`, on a blocking thread), a chart of
    /// a Helm repository, or an OCI reference; a remote one with `credentials` (those of
    /// `spec.chart.secretRef`), sent only to the repository's or registry's host. A source with
    /// `verify` is refused: its keys are needed ([`RemoteCharts::resolve_verified`]).
    pub async fn resolve(
        &self,
        source: &ChartSource,
        root: &Path,
        credentials: Option<&Credentials>,
        limits: Limits,
    ) -> Result<ResolvedChart, SourceError> {
        self.resolve_verified(source, root, credentials, limits, None)
            .await
    }

    /// [`RemoteCharts::resolve`], and a source with `verify` is verified against the public
    /// keys of `keys` before its archive is used: the archive returned is the one whose digest
    /// the signature covers (an OCI chart's layer is taken from the manifest whose digest was
    /// verified; a repository chart's archive is checked against the digest the provenance
    /// file signs).
    pub async fn resolve_verified(
        &self,
        source: &ChartSource,
        root: &Path,
        credentials: Option<&Credentials>,
        limits: Limits,
        keys: Option<&KeyMaterial>,
    ) -> Result<ResolvedChart, SourceError> {
        if let Some((origin, fetched)) = self.fetch(source, credentials, limits, keys).await {
            return fetched.map_err(|error| SourceError::Fetch { origin, error });
        }
        match (&source.path, &source.repository, &source.oci) {
            (Some(_), None, None) if source.verify.is_some() => Err(SourceError::Unsupported(
                "spec.chart.verify is for oci charts and charts of a Helm repository",
            )),
            (Some(_), None, None) => {
                let (source, root) = (source.clone(), root.to_owned());
                tokio::task::spawn_blocking(move || resolve(&source, &root, limits))
                    .await
                    .map_err(|e| ContentError::Io {
                        path: "chart".into(),
                        source: std::io::Error::other(e),
                    })?
            }
            // The CRD's CEL rule makes this unreachable through the API server.
            _ => resolve(source, root, limits),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::path::PathBuf;

    use sha2::{Digest, Sha256};

    use super::*;

    fn chart_dir(root: &Path, name: &str) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("templates")).unwrap();
        std::fs::write(
            dir.join("Chart.yaml"),
            "apiVersion: v2\nname: demo\nversion: 1.0.0\n",
        )
        .unwrap();
        std::fs::write(dir.join("templates/cm.yaml"), "kind: ConfigMap\n").unwrap();
        dir
    }

    fn source(path: &str) -> ChartSource {
        ChartSource {
            path: Some(path.into()),
            ..Default::default()
        }
    }

    fn root() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let canonical = t.path().canonicalize().unwrap();
        (t, canonical)
    }

    fn tgz(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        for (path, kind, content) in entries {
            let mut header = tar::Header::new_gnu();
            // `set_path` refuses `..`; write the raw name so the test can build hostile archives.
            header.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_entry_type(*kind);
            header.set_size(content.len() as u64);
            if kind.is_symlink() {
                header.set_link_name("/etc/passwd").unwrap();
            }
            header.set_cksum();
            builder.append(&header, *content).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn a_directory_digest_follows_content_not_timestamps() {
        let (_t, root) = root();
        let dir = chart_dir(&root, "demo");
        let first = resolve(&source("demo"), &root, Limits::default()).unwrap();
        assert_eq!(first.path, dir);
        assert!(first.digest.starts_with("sha256:") && first.digest.len() == 71);
        std::fs::write(dir.join("templates/cm.yaml"), "kind: ConfigMap\n").unwrap();
        assert_eq!(
            resolve(&source("demo"), &root, Limits::default())
                .unwrap()
                .digest,
            first.digest
        );
        std::fs::write(dir.join("templates/cm.yaml"), "kind: Secret\n").unwrap();
        assert_ne!(
            resolve(&source("demo"), &root, Limits::default())
                .unwrap()
                .digest,
            first.digest
        );
    }

    #[test]
    fn paths_outside_the_root_missing_paths_and_non_charts_are_refused() {
        let (_t, root) = root();
        chart_dir(&root, "demo");
        std::fs::create_dir(root.join("empty")).unwrap();
        let inner = root.join("inner");
        std::fs::create_dir(&inner).unwrap();
        assert!(matches!(
            resolve(&source("../demo"), &inner, Limits::default()),
            Err(SourceError::OutsideRoot { .. })
        ));
        assert!(matches!(
            resolve(&source("/etc"), &root, Limits::default()),
            Err(SourceError::OutsideRoot { .. })
        ));
        assert!(matches!(
            resolve(&source("nope"), &root, Limits::default()),
            Err(SourceError::NotFound(_))
        ));
        assert!(matches!(
            resolve(&source("empty"), &root, Limits::default()),
            Err(SourceError::Chart(ContentError::NotAChart(_)))
        ));
    }

    #[test]
    fn directory_limits_and_links_are_enforced() {
        let (_t, root) = root();
        let dir = chart_dir(&root, "demo");
        let two_files = Limits {
            max_files: 1,
            max_bytes: 1 << 20,
        };
        assert!(matches!(
            resolve(&source("demo"), &root, two_files),
            Err(SourceError::Chart(ContentError::TooLarge {
                what: "files",
                ..
            }))
        ));
        let tiny = Limits {
            max_files: 10,
            max_bytes: 10,
        };
        assert!(matches!(
            resolve(&source("demo"), &root, tiny),
            Err(SourceError::Chart(ContentError::TooLarge {
                what: "bytes",
                ..
            }))
        ));
        std::os::unix::fs::symlink("/etc/passwd", dir.join("templates/passwd")).unwrap();
        assert!(matches!(
            resolve(&source("demo"), &root, Limits::default()),
            Err(SourceError::Chart(ContentError::UnsupportedEntry(_)))
        ));
    }

    #[test]
    fn archives_are_hashed_and_hostile_entries_refused() {
        let (_t, root) = root();
        let file = tar::EntryType::Regular;
        let good = tgz(&[
            ("demo/Chart.yaml", file, b"name: demo\n"),
            ("demo/templates/cm.yaml", file, b"kind: ConfigMap\n"),
        ]);
        std::fs::write(root.join("demo.tgz"), &good).unwrap();
        let resolved = resolve(&source("demo.tgz"), &root, Limits::default()).unwrap();
        assert_eq!(
            resolved.digest,
            format!("sha256:{:x}", Sha256::digest(&good))
        );

        for (name, entries, expect) in [
            (
                "dotdot.tgz",
                vec![("demo/../../evil", file, &b"x"[..])],
                "escapes",
            ),
            (
                "absolute.tgz",
                vec![("/etc/evil", file, &b"x"[..])],
                "escapes",
            ),
            (
                "link.tgz",
                vec![("demo/link", tar::EntryType::Symlink, &b""[..])],
                "not a regular file",
            ),
        ] {
            std::fs::write(root.join(name), tgz(&entries)).unwrap();
            let error = resolve(&source(name), &root, Limits::default())
                .unwrap_err()
                .to_string();
            assert!(error.contains(expect), "{name}: {error}");
        }

        let big = vec![b'a'; 4096];
        std::fs::write(root.join("bomb.tgz"), tgz(&[("demo/big", file, &big)])).unwrap();
        let small = Limits {
            max_files: 10,
            max_bytes: 1024,
        };
        assert!(matches!(
            resolve(&source("bomb.tgz"), &root, small),
            Err(SourceError::Chart(ContentError::TooLarge {
                what: "bytes",
                ..
            }))
        ));
        std::fs::write(root.join("junk.tgz"), b"not gzip").unwrap();
        assert!(matches!(
            resolve(&source("junk.tgz"), &root, Limits::default()),
            Err(SourceError::Chart(ContentError::Archive { .. }))
        ));
    }

    /// A tar stream without its end marker in a first gzip member, and more entries in a
    /// second member: helm (Go) reads every member, so the check must too.
    #[test]
    fn every_gzip_member_is_checked() {
        let (_t, root) = root();
        let file = tar::EntryType::Regular;
        let mut first = tgz(&[("demo/Chart.yaml", file, b"name: demo\n")]);
        // Strip the end marker: re-encode the first member's tar without its two zero blocks.
        let mut tar_bytes = Vec::new();
        flate2::read::GzDecoder::new(first.as_slice())
            .read_to_end(&mut tar_bytes)
            .unwrap();
        tar_bytes.truncate(1024); // header + one data block
        first = {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut gz, &tar_bytes).unwrap();
            gz.finish().unwrap()
        };
        let second = tgz(&[("demo/templates/evil", tar::EntryType::Symlink, b"")]);
        std::fs::write(root.join("multi.tgz"), [first, second].concat()).unwrap();
        let error = resolve(&source("multi.tgz"), &root, Limits::default()).unwrap_err();
        assert!(
            matches!(error, SourceError::Chart(ContentError::UnsupportedEntry(_))),
            "{error}"
        );
    }

    #[test]
    fn packaged_subcharts_are_checked_too() {
        let (_t, root) = root();
        let file = tar::EntryType::Regular;
        let hostile = tgz(&[("sub/../../../etc/evil", file, b"x")]);
        let outer = tgz(&[
            ("demo/Chart.yaml", file, b"name: demo\n"),
            ("demo/charts/sub.tgz", file, &hostile),
        ]);
        std::fs::write(root.join("outer.tgz"), &outer).unwrap();
        assert!(matches!(
            resolve(&source("outer.tgz"), &root, Limits::default()),
            Err(SourceError::Chart(ContentError::UnsafePath(_)))
        ));

        let dir = chart_dir(&root, "with-sub");
        std::fs::create_dir(dir.join("charts")).unwrap();
        std::fs::write(dir.join("charts/sub.tgz"), &hostile).unwrap();
        assert!(matches!(
            resolve(&source("with-sub"), &root, Limits::default()),
            Err(SourceError::Chart(ContentError::UnsafePath(_)))
        ));
    }

    #[test]
    fn data_after_the_archive_and_special_files_are_refused() {
        let (_t, root) = root();
        let good = tgz(&[("demo/Chart.yaml", tar::EntryType::Regular, b"name: demo\n")]);
        let mut tar_bytes = Vec::new();
        flate2::read::GzDecoder::new(good.as_slice())
            .read_to_end(&mut tar_bytes)
            .unwrap();
        tar_bytes.extend_from_slice(b"hidden");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &tar_bytes).unwrap();
        std::fs::write(root.join("trailing.tgz"), gz.finish().unwrap()).unwrap();
        let error = resolve(&source("trailing.tgz"), &root, Limits::default())
            .unwrap_err()
            .to_string();
        assert!(error.contains("data after the end"), "{error}");

        let fifo = root.join("fifo.tgz");
        let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            resolve(&source("fifo.tgz"), &root, Limits::default()),
            Err(SourceError::Chart(ContentError::UnsupportedEntry(_)))
        ));
    }
}
