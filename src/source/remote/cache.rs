//! The on-disk chart cache: verified archives by sha256 digest, re-checked when found, under a
//! hard byte cap (least recently used evicted first, never one in use; an archive that does not
//! fit is refused).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{FetchError, check};
use crate::source::{Limits, ResolvedChart};

/// Archives used (stored or found) more recently than this are not evicted: a render reads the
/// file after the resolve returns its path. They count against the cap all the same.
pub(super) const IN_USE: Duration = Duration::from_secs(600);

/// Temporary files (of writes a crash interrupted) older than this are removed.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// The file whose lock makes "make room, then write" one step across threads and processes
/// sharing the directory.
const LOCK_FILE: &str = ".lock";

/// Verified archives on disk, `sha256-<hex>.tgz`, never more than `max_bytes` in total
/// (temporary files included); temporary files of interrupted writes go after an hour.
#[derive(Clone, Debug)]
pub(super) struct ChartCache {
    pub(super) dir: PathBuf,
    pub(super) max_bytes: u64,
    /// Files used more recently than this are not evicted.
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

    /// Under the directory's lock: makes room for the archive (or refuses it), writes it to a
    /// temporary file of its own (created exclusively with a random name) and renames it into
    /// place. The lock makes the cap hold with concurrent stores, also of other replicas
    /// sharing the directory.
    pub(super) fn store(&self, hex: &str, bytes: &[u8]) -> Result<PathBuf, FetchError> {
        use std::io::Write;
        std::fs::create_dir_all(&self.dir).map_err(|e| Self::error(&self.dir, e))?;
        let lock_path = self.dir.join(LOCK_FILE);
        let lock = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Self::error(&lock_path, e))?;
        lock.lock().map_err(|e| Self::error(&lock_path, e))?;
        let path = self.path(hex);
        self.make_room(bytes.len() as u64, &path)?;
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
        drop(lock);
        Ok(path)
    }

    /// Evicts the least recently used archives not in use until `needed` more bytes fit under
    /// the cap (`replaced`, the same archive's file, is freed by the rename); refuses when
    /// they cannot. Temporary files count (a write under way holds the lock, so every one
    /// here is a leftover) and go once stale.
    fn make_room(&self, needed: u64, replaced: &Path) -> Result<(), FetchError> {
        let full = |in_use| FetchError::CacheFull {
            needed,
            in_use,
            limit: self.max_bytes,
        };
        if needed > self.max_bytes {
            return Err(full(0));
        }
        let entries = std::fs::read_dir(&self.dir).map_err(|e| Self::error(&self.dir, e))?;
        let mut files = Vec::new();
        let mut total = 0u64;
        for entry in entries.filter_map(Result::ok) {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            let (name, path) = (entry.file_name(), entry.path());
            let name = name.to_string_lossy();
            let age = metadata.modified().ok().and_then(|at| at.elapsed().ok());
            if name.ends_with(".tmp") && age.is_some_and(|age| age > STALE_TEMPORARY) {
                let _ = std::fs::remove_file(&path);
            } else if name.starts_with("sha256-") && path != replaced {
                total += metadata.len();
                // A file of unknown age may be about to be read by a render.
                let in_use = age.is_none_or(|age| age < self.in_use);
                files.push((age.unwrap_or_default(), metadata.len(), path, in_use));
            } else if path != replaced {
                total += metadata.len();
            }
        }
        // Oldest use first.
        files.sort_by_key(|f| std::cmp::Reverse(f.0));
        for (_, size, path, in_use) in &files {
            if total + needed <= self.max_bytes {
                break;
            }
            if !in_use && std::fs::remove_file(path).is_ok() {
                tracing::info!(path = %path.display(), "evicted from the chart cache");
                total -= size;
            }
        }
        if total + needed > self.max_bytes {
            let held = files.iter().filter(|f| f.3).map(|f| f.1).sum();
            return Err(full(held));
        }
        Ok(())
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

    fn cache(dir: &Path, max_bytes: u64) -> ChartCache {
        ChartCache {
            dir: dir.join("charts"),
            max_bytes,
            in_use: IN_USE,
        }
    }

    /// Bytes of every file in the directory.
    fn total(cache: &ChartCache) -> u64 {
        std::fs::read_dir(&cache.dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    }

    /// Ages are set, not waited for: the order does not hang on timestamp resolution.
    #[test]
    fn the_cap_holds_evicting_the_least_recently_used_but_not_what_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let archives: Vec<Vec<u8>> = (0..4).map(archive).collect();
        let hexes: Vec<String> = archives
            .iter()
            .map(|a| format!("{:x}", Sha256::digest(a)))
            .collect();
        let size = archives[0].len() as u64;
        // Room for two and a half archives.
        let cache = cache(dir.path(), size * 5 / 2);
        let limits = Limits::default();
        // Leftovers of interrupted writes: one from two hours ago, one recent (it counts).
        std::fs::create_dir_all(&cache.dir).unwrap();
        let (stale, fresh) = (cache.dir.join(".a.1.0.tmp"), cache.dir.join(".b.1.1.tmp"));
        std::fs::write(&stale, b"partial").unwrap();
        std::fs::write(&fresh, b"partial").unwrap();
        set_age(&stale, Duration::from_secs(7200));

        // Two archives just stored (a render may be about to read each): a third does not fit
        // and is refused, for now (files in use age out).
        for (hex, bytes) in hexes.iter().zip(&archives).take(2) {
            cache.store(hex, bytes).unwrap();
        }
        assert!(
            !stale.exists() && fresh.exists(),
            "stale temporary files go"
        );
        let error = cache.store(&hexes[2], &archives[2]).unwrap_err();
        assert!(
            matches!(error, FetchError::CacheFull { needed, in_use, .. } if needed == size && in_use == 2 * size),
            "{error:?}"
        );
        assert!(!error.is_permanent(), "{error}");
        assert!(!cache.path(&hexes[2]).exists());
        assert!(total(&cache) <= cache.max_bytes, "never over the cap");
        // Storing an archive again replaces it, it does not count twice.
        cache.store(&hexes[1], &archives[1]).unwrap();

        // Used 3 and 4 hours ago; then 1 is found again (marked used now), and 2 stored: the
        // least recently used not in use goes, 0.
        set_age(&cache.path(&hexes[0]), Duration::from_secs(3 * 3600));
        set_age(&cache.path(&hexes[1]), Duration::from_secs(4 * 3600));
        assert!(cache.lookup(&hexes[1], limits).unwrap().is_some());
        cache.store(&hexes[2], &archives[2]).unwrap();
        let present: Vec<bool> = hexes.iter().map(|h| cache.path(h).exists()).collect();
        assert_eq!(present, [false, true, true, false]);
        // 1 and 2 an hour old, 2 less so: 1 goes for 3.
        set_age(&cache.path(&hexes[1]), Duration::from_secs(2 * 3600));
        set_age(&cache.path(&hexes[2]), Duration::from_secs(3600));
        cache.store(&hexes[3], &archives[3]).unwrap();
        let present: Vec<bool> = hexes.iter().map(|h| cache.path(h).exists()).collect();
        assert_eq!(present, [false, false, true, true]);
        assert!(total(&cache) <= cache.max_bytes, "never over the cap");

        // An archive larger than the whole cache never fits: permanent.
        let tiny = ChartCache {
            max_bytes: size - 1,
            ..cache.clone()
        };
        let error = tiny.store(&hexes[0], &archives[0]).unwrap_err();
        assert!(error.is_permanent(), "{error}");
        assert!(
            error.to_string().contains("--chart-cache-max-bytes"),
            "{error}"
        );

        // A file whose content changed is not served, and is removed.
        let path = cache.path(&hexes[3]);
        std::fs::write(&path, b"tampered").unwrap();
        assert!(cache.lookup(&hexes[3], limits).unwrap().is_none());
        assert!(!path.exists());
    }

    /// Eight stores at once, room for two: exactly two are written, the cap holds. Without the
    /// directory lock several see room and write (this fails: the archives are large enough
    /// for the writes to overlap).
    #[test]
    fn concurrent_stores_never_exceed_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        // The store writes what it is given (the caller verified it): plain bytes will do.
        let archives: Vec<Vec<u8>> = (10..18).map(|n| vec![n; 4 << 20]).collect();
        let size = archives[0].len() as u64;
        let cache = cache(dir.path(), size * 5 / 2);
        std::fs::create_dir_all(&cache.dir).unwrap();
        let start = std::sync::Barrier::new(archives.len());
        let stored = std::thread::scope(|scope| {
            let stores: Vec<_> = archives
                .iter()
                .map(|bytes| {
                    let (cache, start) = (&cache, &start);
                    scope.spawn(move || {
                        let hex = format!("{:064x}", bytes[0]);
                        start.wait();
                        cache.store(&hex, bytes)
                    })
                })
                .collect();
            stores
                .into_iter()
                .map(|s| s.join().unwrap())
                .filter(Result::is_ok)
                .count()
        });
        assert_eq!(stored, 2);
        assert!(total(&cache) <= cache.max_bytes, "{} bytes", total(&cache));
    }
}
