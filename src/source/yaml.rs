//! YAML from untrusted sources read without expanding anything: anchors and aliases refused.
//!
//! serde_yaml_ng (like every decoder) copies an alias's target at each use, and its guard
//! counts alias uses, not bytes copied: a 270 KB document with one 64 KiB anchor used 4000
//! times decodes to 256 MiB (review of 2026-12-01, § Reproduced). Expansion is refused, not
//! bounded in bytes: counting the bytes each alias would copy needs a second decoder of our
//! own, while `helm repo index`, `kubectl` and Helm's own output never write anchors, so the
//! refusal costs real inputs nothing. One function serves `index.yaml`, `valuesFrom` values,
//! rendered output and kubeconfigs.

use yaml_rust2::parser::{Event, Parser};

/// Why a document was refused before decoding (positions count from 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlRefusal {
    /// the text is not YAML at all.
    #[error("not valid YAML (line {line}, column {column})")]
    Invalid {
        /// Line of the error.
        line: usize,
        /// Column of the error.
        column: usize,
    },
    /// the text holds an anchor (`&a`) or an alias (`*a`, `<<: *a`).
    #[error("YAML anchors and aliases are not allowed (line {line}, column {column})")]
    Alias {
        /// Line of the first anchor or alias.
        line: usize,
        /// Its column.
        column: usize,
    },
}

/// Reads the YAML events of `text` (a stream of any number of documents; reading events
/// expands nothing) and refuses the first anchor or alias. Never quotes the text: it may be a
/// Secret's.
pub fn refuse_aliases(text: &str) -> Result<(), YamlRefusal> {
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, at) = parser.next_token().map_err(|e| YamlRefusal::Invalid {
            line: e.marker().line(),
            column: e.marker().col() + 1,
        })?;
        let anchored = match event {
            Event::StreamEnd => return Ok(()),
            Event::Alias(_) => true,
            Event::Scalar(_, _, anchor, _)
            | Event::SequenceStart(anchor, _)
            | Event::MappingStart(anchor, _) => anchor != 0,
            _ => false,
        };
        if anchored {
            return Err(YamlRefusal::Alias {
                line: at.line(),
                column: at.col() + 1,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The review's shape: one 64 KiB anchor used 4000 times (256 MiB decoded) in a 270 KB
    /// document is refused before any of it is expanded.
    #[test]
    fn anchors_and_aliases_are_refused_unexpanded() {
        let mut bomb = format!("big: &a \"{}\"\nlist:\n", "v".repeat(64 << 10));
        for _ in 0..4000 {
            bomb.push_str("- *a\n");
        }
        assert!(bomb.len() < 300 << 10);
        assert_eq!(
            refuse_aliases(&bomb),
            Err(YamlRefusal::Alias { line: 1, column: 9 })
        );
        for bad in [
            "a: &x 1\n",
            "a: &x {b: 1}\n",
            "a: &x [1]\n",
            "kind: ConfigMap\n---\nmetadata: &m {name: x}\nother: {<<: *m}\n",
        ] {
            assert!(
                matches!(refuse_aliases(bad), Err(YamlRefusal::Alias { .. })),
                "{bad:?}"
            );
        }
        // An alias of an anchor of no (or another) document: refused as well.
        assert!(refuse_aliases("base: &x {b: 1}\n---\nc: *x\n").is_err());
        assert!(refuse_aliases("c: *x\n").is_err());
        assert_eq!(
            refuse_aliases("a: &x 1\n").unwrap_err().to_string(),
            "YAML anchors and aliases are not allowed (line 1, column 7)"
        );
    }

    #[test]
    fn plain_yaml_and_text_with_ampersands_pass() {
        for good in [
            "",
            "a: 1\n",
            "a: 'x & y *z'\nb: \"&c\"\nc: a&b\n",
            "---\na: 1\n---\n---\nb: [1, 2]\n",
            "url: web.tgz?a=1&b=*\n",
        ] {
            assert_eq!(refuse_aliases(good), Ok(()), "{good:?}");
        }
        assert!(matches!(
            refuse_aliases("a: [1\n"),
            Err(YamlRefusal::Invalid { .. })
        ));
    }
}
