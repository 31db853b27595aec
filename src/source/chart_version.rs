//! The version of a local chart as its `Chart.yaml` says, for the command line's tables: read
//! only as far as needed and within bounds, `None` for anything missing, too large or invalid.

use std::io::Read;
use std::path::Path;

use super::local::read_bounded;
use super::yaml::refuse_aliases;

/// Most bytes of a `Chart.yaml` read for its version.
const CHART_YAML_MAX: u64 = 64 * 1024;
/// Most bytes of an archive's tar stream unpacked while looking for its `Chart.yaml`.
const UNPACKED_MAX: u64 = 16 * 1024 * 1024;
/// Longest version shown.
const VERSION_MAX: usize = 64;

/// The `version` of the `Chart.yaml` of the chart at `spec_path` (`spec.chart.path`) under
/// `root`, a directory or a `.tgz` (its top folder's `Chart.yaml`); `None` when the chart is not
/// there or outside `root`, or its `Chart.yaml` is missing, too large or has no valid version.
pub fn local_chart_version(spec_path: &str, root: &Path) -> Option<String> {
    let root = root.canonicalize().ok()?;
    let path = root.join(spec_path).canonicalize().ok()?;
    if !path.starts_with(&root) {
        return None;
    }
    let text = if path.is_dir() {
        let chart_yaml = path.join("Chart.yaml");
        // Not a link (the operator refuses them: it could lead out of the root), not empty
        // (files of /proc say 0 bytes, and some block when read).
        let meta = std::fs::symlink_metadata(&chart_yaml).ok()?;
        if !meta.is_file() || meta.len() == 0 {
            return None;
        }
        read_bounded(&chart_yaml, CHART_YAML_MAX).ok()?
    } else {
        archived_chart_yaml(&path)?
    };
    chart_yaml_version(std::str::from_utf8(&text).ok()?)
}

/// The `<top>/Chart.yaml` of the `.tgz` at `path`, unpacking at most [`UNPACKED_MAX`] bytes.
fn archived_chart_yaml(path: &Path) -> Option<Vec<u8>> {
    let meta = std::fs::metadata(path).ok()?;
    // A FIFO would block, and so may a file of /proc (which says 0 bytes); the compressed bytes
    // read are at most the file's size as it was, the unpacked ones at most UNPACKED_MAX.
    if !meta.is_file() || meta.len() == 0 {
        return None;
    }
    let file = std::fs::File::open(path).ok()?.take(meta.len());
    let unpacked = flate2::read::GzDecoder::new(file).take(UNPACKED_MAX);
    let mut archive = tar::Archive::new(unpacked);
    for entry in archive.entries().ok()? {
        let entry = entry.ok()?;
        let entry_path = entry.path().ok()?.into_owned();
        let mut parts = entry_path.components();
        let top_level_chart_yaml = parts.next().is_some()
            && parts.next().is_some_and(|c| c.as_os_str() == "Chart.yaml")
            && parts.next().is_none();
        if top_level_chart_yaml && entry.header().entry_type().is_file() {
            let mut content = Vec::new();
            entry
                .take(CHART_YAML_MAX + 1)
                .read_to_end(&mut content)
                .ok()?;
            return (content.len() as u64 <= CHART_YAML_MAX).then_some(content);
        }
    }
    None
}

/// The top-level `version` of a `Chart.yaml` text: a string (or number) of semantic-version
/// characters (`0-9A-Za-z.+-`), at most [`VERSION_MAX`] of them.
pub fn chart_yaml_version(text: &str) -> Option<String> {
    refuse_aliases(text).ok()?;
    let chart: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).ok()?;
    let version = match chart.get("version")? {
        serde_yaml_ng::Value::String(text) => text.clone(),
        serde_yaml_ng::Value::Number(number) => number.to_string(),
        _ => return None,
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-');
    (!version.is_empty() && version.len() <= VERSION_MAX && version.chars().all(plain))
        .then_some(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_yaml_version_is_read_when_plain() {
        let version = |text: &str| chart_yaml_version(text);
        assert_eq!(
            version("apiVersion: v2\nname: a\nversion: 1.2.3\n").as_deref(),
            Some("1.2.3")
        );
        assert_eq!(
            version("version: \"0.1.0-rc.1+b\"\n").as_deref(),
            Some("0.1.0-rc.1+b")
        );
        assert_eq!(version("version: 2\n").as_deref(), Some("2"));
        for bad in [
            "name: a\n",
            "version: \"\"\n",
            "version: [1]\n",
            "version: \"1.0\\e[31m\"\n",
            "version: 1 2\n",
            "a: &x 1\nversion: *x\n",
            "version: [\n",
        ] {
            assert_eq!(version(bad), None, "{bad:?}");
        }
        assert_eq!(version(&format!("version: \"{}\"\n", "1".repeat(65))), None);
    }

    fn tgz(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        for (path, content) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o644);
            builder.append_data(&mut header, path, *content).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn a_local_chart_version_comes_from_its_directory_or_archive_else_none() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("charts/web");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("Chart.yaml"), "name: web\nversion: 1.4.0\n").unwrap();
        let archive = tgz(&[
            ("web/values.yaml", b"a: 1\n"),
            ("web/charts/sub/Chart.yaml", b"version: 9.9.9\n"),
            ("web/Chart.yaml", b"version: 2.0.0\n"),
        ]);
        std::fs::write(root.path().join("web-2.0.0.tgz"), archive).unwrap();
        std::fs::write(root.path().join("bad.tgz"), b"not gzip").unwrap();
        let big = format!("version: 3.0.0\n#{}\n", "x".repeat(CHART_YAML_MAX as usize));
        std::fs::create_dir_all(root.path().join("big")).unwrap();
        std::fs::write(root.path().join("big/Chart.yaml"), big).unwrap();
        let version = |path: &str| local_chart_version(path, &root.path().join("charts/.."));
        assert_eq!(version("charts/web").as_deref(), Some("1.4.0"));
        assert_eq!(version("./charts/web/").as_deref(), Some("1.4.0"));
        assert_eq!(version("web-2.0.0.tgz").as_deref(), Some("2.0.0"));
        for missing in ["bad.tgz", "big", "nope", "charts", "../outside"] {
            assert_eq!(version(missing), None, "{missing}");
        }
        // Outside the root, although it exists.
        let inner = root.path().join("charts");
        assert_eq!(local_chart_version("../web-2.0.0.tgz", &inner), None);
    }

    /// A `Chart.yaml` that is a link (here to a file outside the root) is not followed, and an
    /// empty one (as every file of /proc says) is not read.
    #[test]
    fn a_linked_or_empty_chart_yaml_is_not_read() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(
            outside.path().join("Chart.yaml"),
            "version: 6.6.6
",
        )
        .unwrap();
        let root = tempfile::tempdir().unwrap();
        let linked = root.path().join("linked");
        std::fs::create_dir_all(&linked).unwrap();
        std::os::unix::fs::symlink(outside.path().join("Chart.yaml"), linked.join("Chart.yaml"))
            .unwrap();
        let empty = root.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        std::fs::write(empty.join("Chart.yaml"), "").unwrap();
        std::fs::write(root.path().join("empty.tgz"), "").unwrap();
        for path in ["linked", "empty", "empty.tgz"] {
            assert_eq!(local_chart_version(path, root.path()), None, "{path}");
        }
    }
}
