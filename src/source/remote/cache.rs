//! The on-disk chart cache: verified archives by sha256 digest, re-checked when found, under a
//! hard byte cap (least recently used evicted first, never one in use; an archive that does not
//! fit is refused); and the one access rule for a cached archive: it is served only to a
//! [`Fetcher`] (origin and credentials) that downloaded and verified it itself. The checks an
//! archive passes before it is stored and when it is found again are [`check`]'s.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::credentials::Auth;
use super::error::FetchError;
use crate::source::archive::{Budget, check_archive};
use crate::source::{ContentError, Limits, ResolvedChart};

/// Archives used (stored or found) more recently than this are not evicted: a render reads the
/// file after the resolve returns its path. They count against the cap all the same.
pub(super) const IN_USE: Duration = Duration::from_secs(600);

/// Temporary files (of writes a crash interrupted) older than this are removed.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// The file whose lock makes "make room, then write" one step across threads and processes
/// sharing the directory.
const LOCK_FILE: &str = ".lock";

/// Most fetchers remembered per archive (the oldest is forgotten: it downloads again).
const MAX_FETCHERS: usize = 32;
/// Bytes of one fetcher in a `.fetchers` file (64 hex digits and a newline).
const FETCHER_LINE: usize = 65;

/// Who downloaded an archive: where from (the chart URL of the index, query included, or an OCI
/// registry's repository) and with which credentials (their fingerprint, or none), as one hash:
/// neither a URL's query nor a fingerprint is kept. A cached archive is served to a request only
/// when the same origin with the same credentials downloaded and verified it: a digest named by
/// another repository, registry or Secret is no proof that its bytes may be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Fetcher(String);

impl Fetcher {
    /// The fetcher of `origin` with `credentials` (`None`: anonymous).
    pub(super) fn new(origin: &str, credentials: Option<&Auth>) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"module-manager chart fetcher v1\0");
        hash.update(origin.as_bytes());
        hash.update(b"\0");
        hash.update(credentials.map_or("anonymous", |a| a.fingerprint.as_str()));
        Self(format!("{:x}", hash.finalize()))
    }
}

/// Verified archives on disk, `sha256-<hex>.tgz`, each with the fetchers that downloaded it
/// (`sha256-<hex>.fetchers`, at most [`MAX_FETCHERS`] lines), never more than `max_bytes` in
/// total (fetcher and temporary files included); temporary files of interrupted writes go after
/// an hour.
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

    fn fetchers_path(&self, hex: &str) -> PathBuf {
        self.dir.join(format!("sha256-{hex}.fetchers"))
    }

    fn error(path: &Path, error: std::io::Error) -> FetchError {
        FetchError::Cache {
            path: path.display().to_string(),
            error,
        }
    }

    /// The fetchers that downloaded the archive with this digest, oldest first (none when the
    /// file is missing; lines that are not a fetcher are skipped).
    fn fetchers(&self, hex: &str) -> Result<Vec<String>, FetchError> {
        let path = self.fetchers_path(hex);
        let mut text = String::new();
        match std::fs::File::open(&path) {
            Ok(file) => file
                .take((MAX_FETCHERS * FETCHER_LINE) as u64)
                .read_to_string(&mut text)
                .map_err(|e| Self::error(&path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Self::error(&path, e)),
        };
        Ok(text
            .lines()
            .filter(|line| line.len() == 64 && line.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(str::to_owned)
            .collect())
    }

    /// The archive with this digest if `fetcher` downloaded it (the access rule: no other
    /// request is served from the cache), it is cached, still has that digest and passes the
    /// checks; a corrupt or failing file is removed. A hit marks the file as recently used.
    pub(super) fn lookup(
        &self,
        hex: &str,
        fetcher: &Fetcher,
        limits: Limits,
    ) -> Result<Option<ResolvedChart>, FetchError> {
        if !self.fetchers(hex)?.contains(&fetcher.0) {
            return Ok(None);
        }
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

    /// Under the directory's lock: makes room for the archive and its fetchers (or refuses
    /// them), writes each to a temporary file of its own (created exclusively with a random
    /// name) and renames it into place; `fetcher`, which downloaded and verified the archive,
    /// is added to its fetchers (the oldest beyond [`MAX_FETCHERS`] forgotten). The lock makes
    /// the cap hold with concurrent stores, also of other replicas sharing the directory.
    pub(super) fn store(
        &self,
        hex: &str,
        bytes: &[u8],
        fetcher: &Fetcher,
    ) -> Result<PathBuf, FetchError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Self::error(&self.dir, e))?;
        let lock_path = self.dir.join(LOCK_FILE);
        let lock = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Self::error(&lock_path, e))?;
        lock.lock().map_err(|e| Self::error(&lock_path, e))?;
        let mut fetchers = self.fetchers(hex)?;
        fetchers.retain(|known| *known != fetcher.0);
        fetchers.push(fetcher.0.clone());
        let forgotten = fetchers.len().saturating_sub(MAX_FETCHERS);
        let lines: String = fetchers[forgotten..]
            .iter()
            .map(|f| format!("{f}\n"))
            .collect();
        let (path, fetchers_path) = (self.path(hex), self.fetchers_path(hex));
        let needed = (bytes.len() + lines.len()) as u64;
        self.make_room(needed, [&path, &fetchers_path])?;
        self.write(hex, &path, bytes)?;
        self.write(hex, &fetchers_path, lines.as_bytes())?;
        drop(lock);
        Ok(path)
    }

    /// Writes `bytes` to a temporary file and renames it to `path` (under the lock).
    fn write(&self, hex: &str, path: &Path, bytes: &[u8]) -> Result<(), FetchError> {
        use std::io::Write;
        let mut temporary = tempfile::Builder::new()
            .prefix(&format!(".{hex}."))
            .suffix(".tmp")
            .tempfile_in(&self.dir)
            .map_err(|e| Self::error(&self.dir, e))?;
        temporary
            .write_all(bytes)
            .map_err(|e| Self::error(temporary.path(), e))?;
        temporary
            .persist(path)
            .map_err(|e| Self::error(path, e.error))?;
        Ok(())
    }

    /// Evicts the least recently used archives not in use (each with its fetchers) until
    /// `needed` more bytes fit under the cap (`replaced`, the archive's and its fetchers' files,
    /// are freed by the rename); refuses when they cannot. Temporary files count (a write under
    /// way holds the lock, so every one here is a leftover) and go once stale; fetchers of an
    /// archive that is gone (a crash between two removals) go.
    fn make_room(&self, needed: u64, replaced: [&Path; 2]) -> Result<(), FetchError> {
        let full = |in_use| FetchError::CacheFull {
            needed,
            in_use,
            limit: self.max_bytes,
        };
        if needed > self.max_bytes {
            return Err(full(0));
        }
        let entries = std::fs::read_dir(&self.dir).map_err(|e| Self::error(&self.dir, e))?;
        let mut archives = Vec::new();
        let mut fetchers = std::collections::HashMap::new();
        let mut total = 0u64;
        for entry in entries.filter_map(Result::ok) {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            let (name, path) = (entry.file_name(), entry.path());
            let name = name.to_string_lossy();
            let age = metadata.modified().ok().and_then(|at| at.elapsed().ok());
            if replaced.contains(&path.as_path()) {
                continue;
            }
            if name.ends_with(".tmp") && age.is_some_and(|age| age > STALE_TEMPORARY) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            total += metadata.len();
            if name.starts_with("sha256-") && name.ends_with(".tgz") {
                // A file of unknown age may be about to be read by a render.
                let in_use = age.is_none_or(|age| age < self.in_use);
                archives.push((age.unwrap_or_default(), metadata.len(), path, in_use));
            } else if name.starts_with("sha256-") && name.ends_with(".fetchers") {
                fetchers.insert(path.with_extension("tgz"), (path, metadata.len()));
            }
        }
        let orphans = fetchers_without_archive(&fetchers, &archives, replaced[0]);
        let mut remove_fetchers = |archive: &Path, total: &mut u64| {
            if let Some((path, size)) = fetchers.remove(archive)
                && std::fs::remove_file(&path).is_ok()
            {
                *total -= size;
            }
        };
        for orphan in orphans {
            remove_fetchers(&orphan, &mut total);
        }
        // Oldest use first.
        archives.sort_by_key(|f| std::cmp::Reverse(f.0));
        for (_, size, path, in_use) in &archives {
            if total + needed <= self.max_bytes {
                break;
            }
            if !in_use && std::fs::remove_file(path).is_ok() {
                tracing::info!(path = %path.display(), "evicted from the chart cache");
                total -= size;
                remove_fetchers(path, &mut total);
            }
        }
        if total + needed > self.max_bytes {
            let held = archives.iter().filter(|f| f.3).map(|f| f.1).sum();
            return Err(full(held));
        }
        Ok(())
    }
}

/// The archives named by fetcher files whose archive is not in `archives` (nor `written`).
fn fetchers_without_archive(
    fetchers: &std::collections::HashMap<PathBuf, (PathBuf, u64)>,
    archives: &[(Duration, u64, PathBuf, bool)],
    written: &Path,
) -> Vec<PathBuf> {
    fetchers
        .keys()
        .filter(|archive| *archive != written && !archives.iter().any(|a| a.2 == **archive))
        .cloned()
        .collect()
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

/// The checks a local `.tgz` gets.
pub(super) fn check(shown: &str, bytes: &[u8], limits: Limits) -> Result<(), FetchError> {
    if bytes.len() as u64 > limits.max_bytes {
        return Err(FetchError::Chart(ContentError::TooLarge {
            what: "bytes",
            limit: limits.max_bytes,
        }));
    }
    check_archive(shown, bytes, &mut Budget::new(limits), 0).map_err(FetchError::Chart)
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

    fn fetcher(origin: &str) -> Fetcher {
        Fetcher::new(origin, None)
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
        let one = fetcher("https://charts.example.com/demo.tgz");
        // An archive and its fetchers file (one line).
        let size = (archives[0].len() + FETCHER_LINE) as u64;
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
            cache.store(hex, bytes, &one).unwrap();
        }
        assert!(
            !stale.exists() && fresh.exists(),
            "stale temporary files go"
        );
        let error = cache.store(&hexes[2], &archives[2], &one).unwrap_err();
        let archive = archives[0].len() as u64;
        assert!(
            matches!(error, FetchError::CacheFull { needed, in_use, .. } if needed == size && in_use == 2 * archive),
            "{error:?}"
        );
        assert!(!error.is_permanent(), "{error}");
        assert!(!cache.path(&hexes[2]).exists());
        assert!(total(&cache) <= cache.max_bytes, "never over the cap");
        // Storing an archive again replaces it, it does not count twice.
        cache.store(&hexes[1], &archives[1], &one).unwrap();

        // Used 3 and 4 hours ago; then 1 is found again (marked used now), and 2 stored: the
        // least recently used not in use goes, 0.
        set_age(&cache.path(&hexes[0]), Duration::from_secs(3 * 3600));
        set_age(&cache.path(&hexes[1]), Duration::from_secs(4 * 3600));
        assert!(cache.lookup(&hexes[1], &one, limits).unwrap().is_some());
        cache.store(&hexes[2], &archives[2], &one).unwrap();
        let present: Vec<bool> = hexes.iter().map(|h| cache.path(h).exists()).collect();
        assert_eq!(present, [false, true, true, false]);
        assert!(
            !cache.fetchers_path(&hexes[0]).exists(),
            "an evicted archive's fetchers go with it"
        );
        // 1 and 2 an hour old, 2 less so: 1 goes for 3.
        set_age(&cache.path(&hexes[1]), Duration::from_secs(2 * 3600));
        set_age(&cache.path(&hexes[2]), Duration::from_secs(3600));
        cache.store(&hexes[3], &archives[3], &one).unwrap();
        let present: Vec<bool> = hexes.iter().map(|h| cache.path(h).exists()).collect();
        assert_eq!(present, [false, false, true, true]);
        assert!(total(&cache) <= cache.max_bytes, "never over the cap");

        // An archive larger than the whole cache never fits: permanent.
        let tiny = ChartCache {
            max_bytes: size - 1,
            ..cache.clone()
        };
        let error = tiny.store(&hexes[0], &archives[0], &one).unwrap_err();
        assert!(error.is_permanent(), "{error}");
        assert!(
            error.to_string().contains("--chart-cache-max-bytes"),
            "{error}"
        );

        // A file whose content changed is not served, and is removed.
        let path = cache.path(&hexes[3]);
        std::fs::write(&path, b"tampered").unwrap();
        assert!(cache.lookup(&hexes[3], &one, limits).unwrap().is_none());
        assert!(!path.exists());
    }

    /// A cached archive is served only to a fetcher that downloaded it: another origin, or the
    /// same origin with other credentials (or none), is a miss until it stores the archive
    /// itself. Each archive remembers its latest fetchers only, so the file stays small.
    #[test]
    fn an_archive_is_served_only_to_the_fetchers_that_downloaded_it() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(dir.path(), 1 << 20);
        let limits = Limits::default();
        let bytes = archive(7);
        let hex = format!("{:x}", Sha256::digest(&bytes));
        let private = fetcher("https://private.example.com/charts/demo-1.0.0.tgz");
        let public = fetcher("https://public.example.com/charts/demo-1.0.0.tgz");
        let with_query = fetcher("https://private.example.com/charts/demo-1.0.0.tgz?key=k");
        assert_ne!(private, with_query, "the query is part of the origin");
        cache.store(&hex, &bytes, &private).unwrap();
        assert!(cache.lookup(&hex, &private, limits).unwrap().is_some());
        for other in [&public, &with_query] {
            assert!(cache.lookup(&hex, other, limits).unwrap().is_none());
        }
        // The public origin downloads and verifies the archive: both are served now.
        cache.store(&hex, &bytes, &public).unwrap();
        for fetcher in [&private, &public] {
            assert!(cache.lookup(&hex, fetcher, limits).unwrap().is_some());
        }
        // No secret on disk: the file holds hashes only.
        let file = std::fs::read_to_string(cache.fetchers_path(&hex)).unwrap();
        assert!(
            !file.contains("example.com") && !file.contains("key=k"),
            "{file}"
        );
        // Bounded: the oldest fetchers are forgotten (they download again).
        for n in 0..MAX_FETCHERS {
            let origin = format!("https://mirror-{n}.example.com/demo.tgz");
            cache.store(&hex, &bytes, &fetcher(&origin)).unwrap();
        }
        assert_eq!(cache.fetchers(&hex).unwrap().len(), MAX_FETCHERS);
        let size = std::fs::metadata(cache.fetchers_path(&hex)).unwrap().len();
        assert_eq!(size, (MAX_FETCHERS * FETCHER_LINE) as u64);
        assert!(cache.lookup(&hex, &private, limits).unwrap().is_none());
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
                        cache.store(&hex, bytes, &fetcher("https://charts.example.com"))
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
