//! A Helm repository's `index.yaml`: the parts that are read, parsed without expanding aliases.

use std::collections::HashMap;

use serde::Deserialize;

use super::error::FetchError;

/// A repository's `index.yaml`, the parts that are read.
#[derive(Debug, Deserialize)]
pub(super) struct Index {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    #[serde(default)]
    pub(super) entries: HashMap<String, Vec<IndexEntry>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct IndexEntry {
    pub(super) version: String,
    #[serde(default)]
    pub(super) digest: Option<String>,
    #[serde(default)]
    pub(super) urls: Vec<String>,
}

/// Parses an `index.yaml`. Anchors and aliases are refused before decoding: `helm repo index`
/// never writes them, and a decoder copies an alias's target at every use, so a small document
/// could expand to gigabytes. Errors say where and what kind, never quote the content (the body
/// may come from anywhere a redirect led).
pub(super) fn parse_index(bytes: &[u8]) -> Result<Index, FetchError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| FetchError::BadIndex(format!("not UTF-8 (at byte {})", e.valid_up_to())))?;
    refuse_aliases(text)?;
    let index: Index = serde_yaml_ng::from_str(text).map_err(|e| {
        FetchError::BadIndex(match e.location() {
            Some(at) => format!(
                "not a Helm repository index (line {}, column {})",
                at.line(),
                at.column()
            ),
            None => "not a Helm repository index".into(),
        })
    })?;
    if index.api_version.as_deref().is_none_or(str::is_empty) {
        return Err(FetchError::BadIndex("no apiVersion".into()));
    }
    Ok(index)
}

/// Refuses any anchor or alias before decoding ([`crate::source::yaml::refuse_aliases`]).
fn refuse_aliases(text: &str) -> Result<(), FetchError> {
    crate::source::yaml::refuse_aliases(text).map_err(|e| {
        FetchError::BadIndex(match e {
            crate::source::yaml::YamlRefusal::Alias { line, column } => {
                format!("YAML anchors and aliases are not accepted (line {line}, column {column})")
            }
            other => other.to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_indexes_are_refused() {
        let good = b"apiVersion: v1\nentries:\n  web:\n  - version: 1.0.0\n    digest: abc\n    urls: [web-1.0.0.tgz]\n";
        assert_eq!(
            parse_index(good).unwrap().entries["web"][0].version,
            "1.0.0"
        );
        for bad in [
            &b"<html>not found</html>"[..],
            b"entries: {}\n",
            b"apiVersion: v1\nentries: [1, 2]\n",
            b"apiVersion: v1\nentries:\n  web:\n  - urls: [x]\n",
            b"apiVersion: v1\nentries: {web: [\n",
        ] {
            assert!(
                matches!(parse_index(bad), Err(FetchError::BadIndex(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// A small index whose aliases would expand to 1024 copies of a 64 KiB string (64 MiB;
    /// the same shape with a 7 MiB string and tens of thousands of aliases is hundreds of GB):
    /// refused before decoding, as is any anchor or alias.
    #[test]
    fn indexes_with_anchors_or_aliases_are_refused_unexpanded() {
        let mut bomb = format!(
            "apiVersion: v1\nx: &a \"{}\"\nentries:\n  web:\n",
            "v".repeat(64 << 10)
        );
        for _ in 0..1024 {
            bomb.push_str("  - {version: *a}\n");
        }
        assert!(bomb.len() < 100 << 10, "the document itself is small");
        let error = parse_index(bomb.as_bytes()).unwrap_err().to_string();
        assert!(
            error.contains("anchors and aliases are not accepted"),
            "{error}"
        );
        for other in [
            "apiVersion: v1\nentries:\n  web: &w\n  - version: 1.0.0\n",
            "apiVersion: v1\nbase: &b {version: 1.0.0}\nentries:\n  web:\n  - <<: *b\n",
        ] {
            let error = parse_index(other.as_bytes()).unwrap_err().to_string();
            assert!(error.contains("anchors and aliases"), "{other}: {error}");
        }
        // Nesting deeper than the decoder reads (its time is quadratic in the depth).
        let deep = format!("apiVersion: v1\nentries: {}", "[".repeat(1 << 20));
        let error = parse_index(deep.as_bytes()).unwrap_err().to_string();
        assert!(error.contains("nested deeper than 128 levels"), "{error}");
        // `&` and `*` inside scalars are text, not anchors.
        let plain = "apiVersion: v1\nentries:\n  web:\n  - version: 1.0.0\n    description: a & b *c\n    urls: [\"web.tgz?a=1&b=*\"]\n";
        assert_eq!(
            parse_index(plain.as_bytes()).unwrap().entries["web"].len(),
            1
        );
    }

    /// Errors say where, never what: the body may be anything a redirect reached.
    #[test]
    fn index_errors_quote_no_content() {
        for body in [
            &b"secret-token-1234"[..],
            b"{\"AccessKeyId\": \"secret-token-1234\"}",
            b"apiVersion: v1\nentries:\n  web:\n  - version: [secret-token-1234]\n",
            b"apiVersion: v1\nentries: {web: [secret-token-1234\n",
            b"\xff secret-token-1234",
        ] {
            let error = parse_index(body).unwrap_err().to_string();
            assert!(!error.contains("secret"), "{error}");
            assert!(
                error.contains("line") || error.contains("byte") || error.contains("apiVersion"),
                "{error}"
            );
        }
    }
}
