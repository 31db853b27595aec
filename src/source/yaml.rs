//! YAML from untrusted sources read without expanding anything: anchors and aliases refused.
//!
//! serde_yaml_ng (like every decoder) copies an alias's target at each use, and its guard
//! counts alias uses, not bytes copied: a 270 KB document with one 64 KiB anchor used 4000
//! times decodes to 256 MiB (review of 2026-12-01, § Reproduced). Expansion is refused, not
//! bounded in bytes: counting the bytes each alias would copy needs a second decoder of our
//! own, while `helm repo index`, `kubectl` and Helm's own output never write anchors (hand-written
//! values files sometimes do: those are refused and must be written out). One function serves `index.yaml`, `valuesFrom` values,
//! rendered output and kubeconfigs.
//!
//! Nesting deeper than the decoders accept is refused too: libyaml (serde_yaml_ng's and
//! serde_yaml's parser) takes time quadratic in the depth of flow collections before its
//! recursion limit stops the decoding — 16 KB of `[` took 2 s, so a 1 MiB ConfigMap would hold
//! a worker thread for hours, out of reach of the pass deadline.

use yaml_rust2::parser::{Event, Parser};

/// Why a document was refused before decoding (positions count from 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlRefusal {
    /// the text could not be read to check it, and it may hold anchors or aliases.
    #[error("not valid YAML (line {line}, column {column}: {reason})")]
    Invalid {
        /// Line of the error.
        line: usize,
        /// Column of the error.
        column: usize,
        /// The parser's reason (about the structure, never quoting the text).
        reason: String,
    },
    /// the text holds an anchor (`&a`) or an alias (`*a`, `<<: *a`).
    #[error("YAML anchors and aliases are not allowed (line {line}, column {column})")]
    Alias {
        /// Line of the first anchor or alias.
        line: usize,
        /// Its column.
        column: usize,
    },
    /// the text nests collections deeper than [`MAX_DEPTH`].
    #[error(
        "YAML nested deeper than {MAX_DEPTH} levels is not allowed (line {line}, column {column})"
    )]
    TooDeep {
        /// Line of the first collection too deep.
        line: usize,
        /// Its column.
        column: usize,
    },
}

/// The deepest nesting of collections accepted: the decoders' own limit (serde_yaml_ng and
/// serde_yaml stop at 128), so nothing they would read is refused.
pub const MAX_DEPTH: usize = 128;

/// Reads the YAML events of `text` (a stream of any number of documents; reading events
/// expands nothing) and refuses the first anchor or alias. Never quotes the text: it may be a
/// Secret's.
///
/// yaml-rust2 is stricter than libyaml (serde_yaml_ng's, and like it Helm's and kubectl's
/// parsers) in places — e.g. a multi-line quoted string whose continuation lines are indented
/// less than its key (yaml-rust2 #40), which a template that quotes a multi-line value renders.
/// Text it cannot read is let through when nothing in it could be an anchor or an alias (no `&`
/// or `*` starting a token): the decoder then decides, and there is nothing to expand.
///
/// Collections nested deeper than [`MAX_DEPTH`] are refused as well (at the first one, or where
/// the parser stopped); text the parser cannot read is let through only when no run of flow
/// brackets could nest that deep either.
pub fn refuse_aliases(text: &str) -> Result<(), YamlRefusal> {
    checked_nodes(text).map(|_| ())
}

/// [`refuse_aliases`], and the number of nodes (scalars, sequences, mappings) the text holds,
/// counted on the way: a decoder's memory grows with them. For text the parser cannot read and
/// lets through, a bound from the text: twice its indicators (`:` `,` `-` `?` `[` `{`), one of
/// which every node but the first needs, plus one.
pub fn checked_nodes(text: &str) -> Result<usize, YamlRefusal> {
    let mut parser = Parser::new_from_str(text);
    let mut depth = 0usize;
    let mut nodes = 0usize;
    loop {
        let (event, at) = match parser.next_token() {
            Ok(next) => next,
            Err(e) => {
                let (line, column) = (e.marker().line(), e.marker().col() + 1);
                if flow_depth(text) > MAX_DEPTH {
                    // yaml-rust2 stops at 255 flow levels, and may scan that far ahead.
                    return Err(YamlRefusal::TooDeep { line, column });
                }
                if !may_hold_aliases(text) {
                    return Ok(nodes_at_most(text));
                }
                return Err(YamlRefusal::Invalid {
                    line,
                    column,
                    reason: e.info().to_owned(),
                });
            }
        };
        let (line, column) = (at.line(), at.col() + 1);
        let anchored = match event {
            Event::StreamEnd => return Ok(nodes),
            Event::Alias(_) => true,
            Event::Scalar(_, _, anchor, _) => {
                nodes += 1;
                anchor != 0
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                nodes += 1;
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(YamlRefusal::TooDeep { line, column });
                }
                anchor != 0
            }
            Event::SequenceEnd | Event::MappingEnd => {
                depth = depth.saturating_sub(1);
                false
            }
            _ => false,
        };
        if anchored {
            return Err(YamlRefusal::Alias { line, column });
        }
    }
}

/// At least the number of nodes in `text`, from its indicators.
fn nodes_at_most(text: &str) -> usize {
    let indicators = text
        .bytes()
        .filter(|b| matches!(b, b':' | b',' | b'-' | b'?' | b'[' | b'{'))
        .count();
    indicators.saturating_mul(2).saturating_add(1)
}

/// The deepest run of flow brackets (`[`, `{` opened and not yet closed), counting those in
/// quoted and plain text too: at least the depth of flow collections.
fn flow_depth(text: &str) -> usize {
    let mut depth = 0usize;
    let mut deepest = 0;
    for b in text.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Whether `text` has an `&` or `*` that could start an anchor or an alias: at the start of a
/// line or after a space, a tab, `[`, `{`, `,` or `:`, and followed by a name character.
fn may_hold_aliases(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.iter().enumerate().any(|(i, &b)| {
        (b == b'&' || b == b'*')
            && (i == 0
                || matches!(
                    bytes[i - 1],
                    b'\n' | b' ' | b'\t' | b'[' | b'{' | b',' | b':'
                ))
            && bytes
                .get(i + 1)
                .is_some_and(|next| !next.is_ascii_whitespace() && !b",[]{}".contains(next))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes are counted as read; text the parser cannot read gets a bound no lower than the
    /// count.
    #[test]
    fn nodes_are_counted_or_bounded() {
        assert_eq!(checked_nodes("a: 1\nb: [1, 2]\n"), Ok(7));
        assert_eq!(checked_nodes("---\nk: v\n---\n- x\n"), Ok(5));
        assert_eq!(checked_nodes(""), Ok(0));
        // yaml-rust2 #40: a quoted line continued less indented; libyaml reads 2 nodes.
        let quoted = "a:\n  b: \"one\ntwo\"\n";
        let bound = checked_nodes(quoted).unwrap();
        assert!(bound >= 5, "{bound}");
        for text in ["- - - a\n", "{a: b, c: d}\n", "? a\n: b\n", "[a, [b, c]]\n"] {
            assert!(
                nodes_at_most(text) >= checked_nodes(text).unwrap(),
                "{text}"
            );
        }
    }

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
        // Not YAML, and nothing that could be an alias: left to the decoder.
        assert_eq!(refuse_aliases("a: [1\n"), Ok(()));
        assert!(matches!(
            refuse_aliases("a: [*b\n"),
            Err(YamlRefusal::Invalid { .. })
        ));
    }

    /// What yaml-rust2 cannot read but libyaml (Helm, kubectl, serde_yaml_ng) reads: let
    /// through when it cannot hold an alias, refused with the parser's reason when it might.
    #[test]
    fn text_only_libyaml_reads_is_let_through_when_it_cannot_hold_aliases() {
        let quoted = "metadata:\n  annotations:\n    description: \"line one\nline two\"\n";
        assert!(serde_yaml_ng::from_str::<serde_json::Value>(quoted).is_ok());
        assert!(
            yaml_rust2::YamlLoader::load_from_str(quoted).is_err(),
            "yaml-rust2 reads it now: this case no longer shows the fallback"
        );
        assert_eq!(refuse_aliases(quoted), Ok(()));
        let with_alias = format!("{quoted}other: &a 1\nmore: *a\n");
        match refuse_aliases(&with_alias) {
            Err(YamlRefusal::Invalid { reason, .. }) => assert!(!reason.is_empty()),
            other => panic!("{other:?}"),
        }
        assert!(!may_hold_aliases("a: \"x & y\", b: \"*\"\n"));
        assert!(may_hold_aliases("a: *x\n") && may_hold_aliases("- &x 1\n"));
    }

    fn nested(depth: usize) -> String {
        format!("a: {}{}\n", "[".repeat(depth - 1), "]".repeat(depth - 1))
    }

    /// Regression: libyaml's time is quadratic in the depth of flow collections, before its
    /// recursion limit stops the decoding (16 KB of `[` took 2 s in a debug build, so 1 MiB
    /// would take hours). What the decoder reads (128 levels) passes; one level more, which
    /// the decoder refuses anyway, is refused before decoding, open or closed, flow or block,
    /// and in text the parser cannot read.
    #[test]
    fn nesting_deeper_than_the_decoder_reads_is_refused_before_decoding() {
        let deepest = nested(MAX_DEPTH);
        assert_eq!(refuse_aliases(&deepest), Ok(()));
        assert!(serde_yaml_ng::from_str::<serde_json::Value>(&deepest).is_ok());
        let deeper = nested(MAX_DEPTH + 1);
        assert!(serde_yaml_ng::from_str::<serde_json::Value>(&deeper).is_err());
        assert_eq!(
            refuse_aliases(&deeper),
            Err(YamlRefusal::TooDeep {
                line: 1,
                column: 3 + MAX_DEPTH
            })
        );
        let open = format!("a: {}", "[".repeat(100_000));
        assert!(matches!(
            refuse_aliases(&open),
            Err(YamlRefusal::TooDeep { .. })
        ));
        let flow_maps = format!("a: {}1", "{a: ".repeat(100_000));
        assert!(matches!(
            refuse_aliases(&flow_maps),
            Err(YamlRefusal::TooDeep { .. })
        ));
        let block: String = (0..=MAX_DEPTH)
            .map(|i| format!("{}k:\n", " ".repeat(i)))
            .collect();
        assert!(matches!(
            refuse_aliases(&block),
            Err(YamlRefusal::TooDeep { .. })
        ));
        // Text only libyaml reads, then deep brackets: not let through.
        let quoted = "description: \"line one\nline two\"\n";
        assert_eq!(refuse_aliases(quoted), Ok(()));
        let hidden = format!("{quoted}b: {}", "[".repeat(10_000));
        assert!(matches!(
            refuse_aliases(&hidden),
            Err(YamlRefusal::TooDeep { .. })
        ));
        assert_eq!(
            refuse_aliases(&deeper).unwrap_err().to_string(),
            format!(
                "YAML nested deeper than 128 levels is not allowed (line 1, column {})",
                3 + MAX_DEPTH
            )
        );
    }

    /// The figure behind the test above: the decoder's time on flow nesting 4000 and 16 000
    /// deep against the check's (`cargo test -p module-manager --lib
    /// measure_the_decoder_on_deep_nesting -- --ignored --nocapture`).
    #[test]
    #[ignore = "a measurement: prints times"]
    fn measure_the_decoder_on_deep_nesting() {
        for depth in [4000, 16_000] {
            let text = format!("a: {}", "[".repeat(depth));
            let started = std::time::Instant::now();
            let checked = refuse_aliases(&text);
            let check = started.elapsed();
            let started = std::time::Instant::now();
            let decoded = serde_yaml_ng::from_str::<serde_json::Value>(&text).is_ok();
            let decode = started.elapsed();
            println!(
                "{depth} open brackets: the check {check:?} ({checked:?}), the decoder {decode:?} (decoded: {decoded}), {:.0} times the check",
                decode.as_secs_f64() / check.as_secs_f64()
            );
        }
    }
}
