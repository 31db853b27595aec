//! Chart archives: a `.tgz` checked as helm will read it, within the chart's budget of files and
//! bytes (nested subchart archives included).

use std::cell::Cell;
use std::io::Read;
use std::path::Component;
use std::rc::Rc;

use super::chart::{ContentError, Limits};

/// Counts files and unpacked bytes of a chart, subcharts included, against the limits.
pub(super) struct Budget {
    limits: Limits,
    files: usize,
    bytes: u64,
    /// Bytes decompressed from the chart's archives so far, tar headers included: shared with
    /// the [`Counted`] reader of each archive being read.
    unpacked: Rc<Cell<u64>>,
}

impl Budget {
    pub(super) fn new(limits: Limits) -> Self {
        Self {
            limits,
            files: 0,
            bytes: 0,
            unpacked: Rc::new(Cell::new(0)),
        }
    }

    /// What a chart's tar streams may unpack to in all: its bytes, a header and padding
    /// (1 KiB) per file, and 1 MiB for long names and extended headers (Go's `archive/tar`,
    /// which helm uses, allows each of those at most 1 MiB).
    fn unpack_cap(&self) -> u64 {
        self.limits
            .max_bytes
            .saturating_add(self.limits.max_files as u64 * 1024)
            .saturating_add(1 << 20)
    }

    pub(super) fn add(&mut self, files: usize, bytes: u64) -> Result<(), ContentError> {
        self.files += files;
        self.bytes += bytes;
        if self.files > self.limits.max_files {
            return Err(ContentError::TooLarge {
                what: "files",
                limit: self.limits.max_files as u64,
            });
        }
        if self.bytes > self.limits.max_bytes {
            return Err(ContentError::TooLarge {
                what: "bytes",
                limit: self.limits.max_bytes,
            });
        }
        Ok(())
    }
}

/// A decompressed tar stream that fails once the chart's archives together have unpacked more
/// than the cap. The tar crate reads GNU long names, PAX headers and sparse maps into memory
/// before the check sees their entry, whatever their size: without this count, a small gzip
/// bomb in a long name took all the memory of a replica.
struct Counted<R> {
    inner: R,
    unpacked: Rc<Cell<u64>>,
    cap: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        let total = self.unpacked.get().saturating_add(read as u64);
        self.unpacked.set(total);
        if total > self.cap {
            return Err(std::io::Error::other(
                "the archive unpacks to too many bytes",
            ));
        }
        Ok(read)
    }
}

/// How deep archives may nest (a chart's `charts/*.tgz`, their `charts/*.tgz`, …).
const MAX_NESTING: usize = 4;

/// Checks an archive as helm will read it: every gzip member (helm reads them all), every entry
/// a regular file or directory with a relative path without `..`, nested `.tgz` subcharts
/// likewise, the bytes really decompressed (not the headers' claims) within the budget, and
/// nothing but zero padding after the tar end marker; all the archives' tar streams together
/// within [`Budget::unpack_cap`], headers and long names included.
pub(super) fn check_archive(
    shown: &str,
    bytes: &[u8],
    budget: &mut Budget,
    depth: usize,
) -> Result<(), ContentError> {
    let (unpacked, cap) = (budget.unpacked.clone(), budget.unpack_cap());
    let archive_error = |source| {
        if unpacked.get() > cap {
            return ContentError::TooLarge {
                what: "bytes unpacked (tar headers included)",
                limit: cap,
            };
        }
        ContentError::Archive {
            path: shown.to_owned(),
            source,
        }
    };
    if depth > MAX_NESTING {
        return Err(archive_error(std::io::Error::other(
            "archives nested too deep",
        )));
    }
    let mut archive = tar::Archive::new(Counted {
        inner: flate2::read::MultiGzDecoder::new(bytes),
        unpacked: budget.unpacked.clone(),
        cap,
    });
    for entry in archive.entries().map_err(archive_error)? {
        let mut entry = entry.map_err(archive_error)?;
        let entry_path = entry.path().map_err(archive_error)?.into_owned();
        let shown_entry = entry_path.display().to_string();
        if entry_path
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(ContentError::UnsafePath(shown_entry));
        }
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() || kind.is_dir() {
            continue;
        }
        if !kind.is_file() {
            return Err(ContentError::UnsupportedEntry(shown_entry));
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap()
    }

    /// A `.tgz` of tar entries `(name, kind, size)`, each followed by `size` zero bytes and
    /// its padding: gzip members (which helm and the check read one after the other) of 1 MiB
    /// of zeros each, so a bomb is cheap to build.
    fn zero_filled(entries: &[(&str, tar::EntryType, u64)]) -> Vec<u8> {
        const MIB: u64 = 1 << 20;
        let mebibyte = gzip(&[0; MIB as usize]);
        let mut archive = Vec::new();
        for (name, kind, size) in entries {
            let mut header = tar::Header::new_gnu();
            header.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
            header.set_entry_type(*kind);
            header.set_size(*size);
            header.set_mode(0o644);
            header.set_cksum();
            archive.extend(gzip(header.as_bytes()));
            let padded = size.div_ceil(512) * 512;
            for _ in 0..padded / MIB {
                archive.extend_from_slice(&mebibyte);
            }
            archive.extend(gzip(&vec![0; (padded % MIB) as usize]));
        }
        archive.extend(gzip(&[0; 1024]));
        archive
    }

    fn check(bytes: &[u8], limits: Limits) -> Result<(), ContentError> {
        check_archive("chart.tgz", bytes, &mut Budget::new(limits), 0)
    }

    const SMALL: Limits = Limits {
        max_files: 10,
        max_bytes: 1 << 20,
    };

    /// Regression: the tar crate reads a GNU long name, long link or PAX header into memory
    /// whole before the check sees its entry, and skips a directory's data unread by the
    /// check. A long name of 1 GiB of zeros is a 1 MiB `.tgz` and took 1 GiB of a replica's
    /// memory; every byte unpacked now counts against the cap, whatever entry it belongs to.
    #[test]
    fn headers_long_names_and_skipped_data_count_against_the_cap() {
        let cap = Budget::new(SMALL).unpack_cap();
        let huge = 4 * cap;
        let file = tar::EntryType::Regular;
        for (what, entries) in [
            (
                "a GNU long name",
                vec![
                    ("././@LongLink", tar::EntryType::GNULongName, huge),
                    ("demo/Chart.yaml", file, 10),
                ],
            ),
            (
                "a GNU long link",
                vec![
                    ("././@LongLink", tar::EntryType::GNULongLink, huge),
                    ("demo/Chart.yaml", file, 10),
                ],
            ),
            (
                "a PAX header",
                vec![
                    ("PaxHeaders/x", tar::EntryType::XHeader, huge),
                    ("demo/Chart.yaml", file, 10),
                ],
            ),
            (
                "a PAX global header",
                vec![("pax_global_header", tar::EntryType::XGlobalHeader, huge)],
            ),
            (
                "a directory's data",
                vec![("demo/", tar::EntryType::Directory, huge)],
            ),
        ] {
            let archive = zero_filled(&entries);
            assert!(
                archive.len() < (cap / 50) as usize,
                "{what}: {}",
                archive.len()
            );
            match check(&archive, SMALL) {
                Err(ContentError::TooLarge { what: unit, limit }) => {
                    assert_eq!(
                        (unit, limit),
                        ("bytes unpacked (tar headers included)", cap)
                    )
                }
                other => panic!("{what}: {other:?}"),
            }
        }
        // Within the cap: a long name and a directory of the usual size pass.
        let usual = zero_filled(&[
            ("././@LongLink", tar::EntryType::GNULongName, 200),
            ("demo/", tar::EntryType::Directory, 0),
            ("demo/Chart.yaml", file, 10),
        ]);
        assert!(check(&usual, SMALL).is_ok());
    }

    /// The figure behind the test above: the peak memory of checking a 256 KiB archive whose
    /// GNU long name is 256 MiB of zeros (`cargo test -p module-manager --lib
    /// measure_the_memory_of_a_long_name_bomb -- --ignored --nocapture`).
    #[test]
    #[ignore = "a measurement: prints the peak memory of one check"]
    fn measure_the_memory_of_a_long_name_bomb() {
        let bomb = zero_filled(&[
            ("././@LongLink", tar::EntryType::GNULongName, 256 << 20),
            ("demo/Chart.yaml", tar::EntryType::Regular, 10),
        ]);
        let peak_kib = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
            line.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        let before = peak_kib();
        let outcome = check(&bomb, Limits::default());
        let after = peak_kib();
        println!(
            "a {} KiB archive holding a 256 MiB long name: peak RSS {before} KiB before the check, {after} KiB after (+{} MiB); {outcome:?}",
            bomb.len() >> 10,
            (after - before) >> 10
        );
    }

    fn file(path: &str, content: &[u8]) -> Generated {
        Generated {
            path: path.into(),
            kind: tar::EntryType::Regular,
            content: content.to_vec(),
        }
    }

    /// Links, devices, FIFOs, contiguous and sparse files are refused naming the entry; more files than
    /// the cap, a cut archive and subcharts nested past the limit are refused too.
    #[test]
    fn special_entries_too_many_files_cut_archives_and_deep_nesting_are_refused() {
        for kind in [
            tar::EntryType::Link,
            tar::EntryType::Symlink,
            tar::EntryType::Char,
            tar::EntryType::Block,
            tar::EntryType::Fifo,
            tar::EntryType::Continuous,
        ] {
            let entry = Generated {
                kind,
                ..file("demo/templates/x", b"")
            };
            match check(&archive_of(&[entry]), Limits::default()) {
                Err(ContentError::UnsupportedEntry(path)) => assert_eq!(path, "demo/templates/x"),
                other => panic!("{kind:?}: {other:?}"),
            }
        }
        // A sparse file: refused by the tar reader already (its map is not a number).
        let sparse = Generated {
            kind: tar::EntryType::GNUSparse,
            ..file("demo/templates/x", b"")
        };
        assert!(check(&archive_of(&[sparse]), Limits::default()).is_err());
        let eleven: Vec<_> = (0..11).map(|i| file(&format!("demo/f{i}"), b"x")).collect();
        assert!(matches!(
            check(&archive_of(&eleven), SMALL),
            Err(ContentError::TooLarge {
                what: "files",
                limit: 10
            })
        ));
        assert!(check(&archive_of(&eleven[..10]), SMALL).is_ok());

        let whole = archive_of(&[file("demo/Chart.yaml", &[b'x'; 4000])]);
        let cut = check(&whole[..whole.len() / 2], Limits::default()).unwrap_err();
        assert!(matches!(cut, ContentError::Archive { .. }), "{cut:?}");

        let mut nested = archive_of(&[file("demo/Chart.yaml", b"name: demo\n")]);
        for level in 1..=MAX_NESTING + 1 {
            nested = archive_of(&[file("demo/charts/sub.tgz", &nested)]);
            let outcome = check(&nested, Limits::default());
            assert_eq!(
                outcome.is_ok(),
                level <= MAX_NESTING,
                "{level}: {outcome:?}"
            );
        }
        let error = check(&nested, Limits::default()).unwrap_err().to_string();
        assert!(error.contains("nested too deep"), "{error}");
    }

    /// An entry of a generated archive.
    #[derive(Clone, Debug)]
    struct Generated {
        path: String,
        kind: tar::EntryType,
        content: Vec<u8>,
    }

    /// A `.tgz` of the entries, names written raw (`set_path` would refuse `..`), ended by
    /// the two zero blocks of a tar end marker.
    fn archive_of(entries: &[Generated]) -> Vec<u8> {
        let mut tar = Vec::new();
        for entry in entries {
            let mut header = tar::Header::new_gnu();
            header.as_gnu_mut().unwrap().name[..entry.path.len()]
                .copy_from_slice(entry.path.as_bytes());
            header.set_entry_type(entry.kind);
            header.set_size(entry.content.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.extend_from_slice(header.as_bytes());
            tar.extend_from_slice(&entry.content);
            tar.resize(tar.len().div_ceil(512) * 512, 0);
        }
        tar.extend_from_slice(&[0; 1024]);
        gzip(&tar)
    }

    mod properties {
        use proptest::prelude::*;
        use tar::EntryType;

        use super::*;

        /// Paths of up to four segments, `..`, `.`, empty ones and a leading `/` among them.
        fn path() -> impl Strategy<Value = String> {
            let segment = prop::sample::select(vec![
                "demo",
                "templates",
                "..",
                ".",
                "",
                "a b",
                "Chart.yaml",
                "é",
                "-",
            ]);
            (any::<bool>(), prop::collection::vec(segment, 1..5)).prop_map(
                |(absolute, segments)| {
                    format!("{}{}", if absolute { "/" } else { "" }, segments.join("/"))
                },
            )
        }

        fn entry() -> impl Strategy<Value = Generated> {
            let kind = prop::sample::select(vec![
                EntryType::Regular,
                EntryType::Regular,
                EntryType::Directory,
                EntryType::Symlink,
                EntryType::Link,
                EntryType::Char,
                EntryType::Block,
                EntryType::Fifo,
                EntryType::Continuous,
            ]);
            (path(), kind, prop::collection::vec(any::<u8>(), 0..700)).prop_map(
                |(path, kind, content)| Generated {
                    path,
                    kind,
                    content,
                },
            )
        }

        fn escapes(path: &str) -> bool {
            path.starts_with('/') || path.split('/').any(|s| s == "..")
        }

        proptest! {
            /// Accepted exactly when no path escapes, every entry is a file or a directory, and
            /// the files fit the caps (the bytes of the end marker's second block included).
            #[test]
            fn archives_are_accepted_exactly_when_safe_and_within_the_caps(
                entries in prop::collection::vec(entry(), 0..8),
                max_files in 0usize..6,
                max_bytes in 0u64..3000,
            ) {
                let limits = Limits { max_files, max_bytes };
                let files: Vec<_> = entries.iter().filter(|e| e.kind == EntryType::Regular).collect();
                let bytes = files.iter().map(|e| e.content.len() as u64).sum::<u64>() + 512;
                let safe = entries.iter().all(|e| {
                    !escapes(&e.path) && matches!(e.kind, EntryType::Regular | EntryType::Directory)
                });
                let expected = safe && files.len() <= max_files && bytes <= max_bytes;
                let outcome = check(&archive_of(&entries), limits);
                prop_assert_eq!(outcome.is_ok(), expected, "{:?}", outcome);
                if entries.iter().any(|e| escapes(&e.path)) {
                    prop_assert!(outcome.is_err());
                }
            }

            /// A path escaping the chart is refused at any depth of packaged subcharts.
            #[test]
            fn escaping_paths_are_refused_in_nested_archives(
                inner in prop::collection::vec(entry(), 1..5),
                depth in 1usize..4,
            ) {
                let mut archive = archive_of(&inner);
                for _ in 0..depth {
                    archive = archive_of(&[Generated {
                        path: "demo/charts/sub.tgz".into(),
                        kind: EntryType::Regular,
                        content: archive,
                    }]);
                }
                let outcome = check(&archive, Limits::default());
                if inner.iter().any(|e| escapes(&e.path)) {
                    prop_assert!(outcome.is_err());
                }
                if escapes(&inner[0].path) {
                    prop_assert!(
                        matches!(outcome, Err(ContentError::UnsafePath(_))),
                        "{:?}",
                        outcome
                    );
                }
            }

            /// Damaged archives (cut short, a byte changed, or any bytes at all) are refused or
            /// accepted, never a panic.
            #[test]
            fn damaged_archives_never_panic(
                entries in prop::collection::vec(entry(), 0..4),
                cut in any::<prop::sample::Index>(),
                flip in any::<(prop::sample::Index, u8)>(),
                noise in prop::collection::vec(any::<u8>(), 0..2000),
            ) {
                let archive = archive_of(&entries);
                let _ = check(&archive[..cut.index(archive.len() + 1)], Limits::default());
                let mut flipped = archive.clone();
                let at = flip.0.index(flipped.len());
                flipped[at] ^= flip.1;
                let _ = check(&flipped, Limits::default());
                let _ = check(&noise, Limits::default());
            }
        }
    }
}
