//! The on-disk chart cache: verified archives by sha256 digest, re-checked when found, bounded in
//! size (least recently used first, never one in use).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{FetchError, check};
use crate::source::{Limits, ResolvedChart};

/// Archives used (stored or found) more recently than this are not evicted: a render reads the
/// file after the resolve returns its path. The cache may exceed its size meanwhile.
pub(super) const IN_USE: Duration = Duration::from_secs(600);

/// Verified archives on disk, `sha256-<hex>.tgz`, bounded in total size; temporary files of interrupted writes go after an hour.
#[derive(Clone, Debug)]
pub(super) struct ChartCache {
    pub(super) dir: PathBuf,
    pub(super) max_bytes: u64,
    /// Files used more recently than this stay, whatever the size.
    pub(super) in_use: Duration,
}

impl ChartCache {
    fn path(&self, hex: &str) -> PathBuf {
        self.dir.join(format!("sha256-{hex}.tgz"))
    }

    fn error(path: &Path, error: std::io::Error) -> FetchError {
        FetchError::Cache {
            path: path.display().to_string(),
            error,
        }
    }

    /// The archive with this digest if it is cached, still has that digest and passes the
    /// checks; a corrupt or failing file is removed. A hit marks the file as recently used.
    pub(super) fn lookup(
        &self,
        hex: &str,
        limits: Limits,
    ) -> Result<Option<ResolvedChart>, FetchError> {
        let path = self.path(hex);
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Self::error(&path, e)),
        };
        let mut bytes = Vec::new();
        file.take(limits.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Self::error(&path, e))?;
        let intact = format!("{:x}", Sha256::digest(&bytes)) == hex
            && check(&path.display().to_string(), &bytes, limits).is_ok();
        if !intact {
            let _ = std::fs::remove_file(&path);
            return Ok(None);
        }
        if let Ok(file) = std::fs::File::options().append(true).open(&path) {
            let _ = file.set_modified(std::time::SystemTime::now());
        }
        Ok(Some(ResolvedChart {
            digest: format!("sha256:{hex}"),
            path,
        }))
    }

    /// Writes the archive to a temporary file of its own (created exclusively with a random
    /// name: replicas sharing the cache never write the same one), renames it into place, then
    /// evicts the least recently used others while the cache is over its size.
    pub(super) fn store(&self, hex: &str, bytes: &[u8]) -> Result<PathBuf, FetchError> {
        use std::io::Write;
        std::fs::create_dir_all(&self.dir).map_err(|e| Self::error(&self.dir, e))?;
        let path = self.path(hex);
        let mut temporary = tempfile::Builder::new()
            .prefix(&format!(".{hex}."))
            .suffix(".tmp")
            .tempfile_in(&self.dir)
            .map_err(|e| Self::error(&self.dir, e))?;
        temporary
            .write_all(bytes)
            .map_err(|e| Self::error(temporary.path(), e))?;
        temporary
            .persist(&path)
            .map_err(|e| Self::error(&path, e.error))?;
        self.evict(&path);
        Ok(path)
    }

    fn evict(&self, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let entries: Vec<_> = entries.filter_map(Result::ok).collect();
        // Temporary files of writes that never finished (a crash) go after an hour.
        for entry in &entries {
            let stale = entry.metadata().and_then(|m| m.modified()).is_ok_and(|at| {
                at.elapsed()
                    .is_ok_and(|age| age > Duration::from_secs(3600))
            });
            if entry.file_name().to_string_lossy().ends_with(".tmp") && stale {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .iter()
            .filter(|e| e.file_name().to_string_lossy().starts_with("sha256-"))
            .filter_map(|e| {
                let metadata = e.metadata().ok()?;
                Some((metadata.modified().ok()?, metadata.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|(_, size, _)| size).sum();
        files.sort();
        for (used, size, path) in files {
            if total <= self.max_bytes {
                break;
            }
            // A file used moments ago may be about to be read by a render.
            let in_use = used.elapsed().map_or(true, |age| age < self.in_use);
            if path != keep && !in_use && std::fs::remove_file(&path).is_ok() {
                tracing::info!(path = %path.display(), "evicted from the chart cache");
                total -= size;
            }
        }
    }
}

/// The hex of a `sha256:<hex>` or bare `<hex>` digest (lowercase; it names a cache file).
pub(super) fn sha256_hex(digest: &str) -> Result<String, FetchError> {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        // Not quoted: it may come from a server.
        Err(FetchError::BadDigest(
            "the digest is not a sha256 digest".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_hex_only() {
        let hex = "a".repeat(64);
        assert_eq!(sha256_hex(&hex).unwrap(), hex);
        assert_eq!(
            sha256_hex(&format!("sha256:{}", "A".repeat(64))).unwrap(),
            hex
        );
        for bad in [
            "",
            "sha512:abc",
            "../../etc/passwd",
            &"g".repeat(64),
            &"a".repeat(63),
        ] {
            assert!(
                matches!(sha256_hex(bad), Err(FetchError::BadDigest(_))),
                "{bad}"
            );
        }
    }

    fn archive(n: u8) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::none(),
        ));
        let content = vec![n; 200];
        let mut header = tar::Header::new_gnu();
        header.set_path("demo/Chart.yaml").unwrap();
        header.set_size(content.len() as u64);
        header.set_cksum();
        builder.append(&header, content.as_slice()).unwrap();
        builder.into_inner().unwrap().finish().unwrap()
    }

    fn set_age(path: &Path, age: Duration) {
        std::fs::File::options()
            .append(true)
            .open(path)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - age)
            .unwrap();
    }

    /// Ages are set, not waited for: the order does not hang on timestamp resolution.
    #[test]
    fn the_cache_evicts_the_least_recently_used_but_not_what_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let archives: Vec<Vec<u8>> = (0..4).map(archive).collect();
        let hexes: Vec<String> = archives
            .iter()
            .map(|a| format!("{:x}", Sha256::digest(a)))
            .collect();
        let size = archives[0].len() as u64;
        let cache = ChartCache {
            dir: dir.path().join("charts"),
            // Room for two and a half archives.
            max_bytes: size * 5 / 2,
            in_use: IN_USE,
        };
        let limits = Limits::default();
        // Leftovers of interrupted writes: one from two hours ago, one under way.
        std::fs::create_dir_all(&cache.dir).unwrap();
        let (stale, fresh) = (cache.dir.join(".a.1.0.tmp"), cache.dir.join(".b.1.1.tmp"));
        std::fs::write(&stale, b"partial").unwrap();
        std::fs::write(&fresh, b"partial").unwrap();
        set_age(&stale, Duration::from_secs(7200));

        // Three archives just stored (a render may be about to read each): none goes, though
        // the cache is over its size.
        for (hex, bytes) in hexes.iter().zip(&archives).take(3) {
            cache.store(hex, bytes).unwrap();
        }
        assert!(
            !stale.exists() && fresh.exists(),
            "stale temporary files go"
        );
        assert!(
            (0..3).all(|i| cache.path(&hexes[i]).exists()),
            "nothing in use is evicted"
        );
        let leftovers = std::fs::read_dir(&cache.dir)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().ends_with(".tmp")
            })
            .count();
        assert_eq!(leftovers, 1, "stores leave no temporary file");

        // Used 3, 4 and 1 hours ago; then 1 is found again (marked used now), and 3 stored:
        // the least recently used go, 0 then 2, until the rest fits.
        for (i, hours) in [(0, 3), (1, 4), (2, 1)] {
            set_age(&cache.path(&hexes[i]), Duration::from_secs(hours * 3600));
        }
        assert!(cache.lookup(&hexes[1], limits).unwrap().is_some());
        cache.store(&hexes[3], &archives[3]).unwrap();
        let present: Vec<bool> = hexes.iter().map(|h| cache.path(h).exists()).collect();
        assert_eq!(present, [false, true, false, true]);

        // A file whose content changed is not served, and is removed.
        let path = cache.path(&hexes[3]);
        std::fs::write(&path, b"tampered").unwrap();
        assert!(cache.lookup(&hexes[3], limits).unwrap().is_none());
        assert!(!path.exists());
    }
}
