//! Chart values: merging `valuesFrom` documents and inline values (pure).

use serde_json::{Map, Value};

use crate::source::yaml::{YamlRefusal, refuse_aliases};

/// Why a values document is unusable.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ValuesError {
    /// the document is not YAML.
    #[error("{source_name}: values are not valid YAML: {message}")]
    Yaml {
        /// Where the document came from, e.g. `ConfigMap/web-values key values.yaml`.
        source_name: String,
        /// The parser's message.
        message: String,
    },
    /// the document holds YAML anchors or aliases (refused before decoding: their expansion is
    /// unbounded in bytes), or is not YAML.
    #[error("{source_name}: {refusal}")]
    Refused {
        /// Where the document came from.
        source_name: String,
        /// What was refused, and where.
        #[source]
        refusal: YamlRefusal,
    },
    /// the document is YAML but not a map.
    #[error("{0}: values must be a YAML map")]
    NotAMap(String),
    /// a Secret's values are not UTF-8 text.
    #[error("{0}: values are not UTF-8 text")]
    NotUtf8(String),
}

/// Parses one values document (a YAML map; an empty document is an empty map). Anchors and
/// aliases are refused before anything is decoded.
pub fn parse(source_name: &str, text: &str) -> Result<Map<String, Value>, ValuesError> {
    refuse_aliases(text).map_err(|refusal| ValuesError::Refused {
        source_name: source_name.to_owned(),
        refusal,
    })?;
    let value: Value = serde_yaml_ng::from_str(text).map_err(|e| ValuesError::Yaml {
        source_name: source_name.to_owned(),
        message: e.to_string(),
    })?;
    match value {
        Value::Null => Ok(Map::new()),
        Value::Object(map) => Ok(map),
        _ => Err(ValuesError::NotAMap(source_name.to_owned())),
    }
}

/// Merges `overlay` into `base` the way Helm coalesces values files: maps merge key by key,
/// anything else (lists, scalars, `null`) replaces. A `null` is kept so that Helm removes the
/// chart's default for that key.
pub fn merge(base: &mut Map<String, Value>, overlay: Map<String, Value>) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(Value::Object(existing)), Value::Object(incoming)) => merge(existing, incoming),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn maps_merge_deeply_and_everything_else_replaces() {
        let mut base =
            map(json!({"image": {"repo": "nginx", "tag": "1"}, "ports": [80, 443], "debug": true}));
        merge(
            &mut base,
            map(json!({"image": {"tag": "2"}, "ports": [8080], "debug": null, "extra": 1})),
        );
        assert_eq!(
            Value::Object(base),
            json!({"image": {"repo": "nginx", "tag": "2"}, "ports": [8080], "debug": null, "extra": 1})
        );
    }

    #[test]
    fn documents_must_be_maps() {
        assert_eq!(parse("cm", "").unwrap(), Map::new());
        assert_eq!(parse("cm", "a: 1").unwrap(), map(json!({"a": 1})));
        assert_eq!(parse("cm", "- 1"), Err(ValuesError::NotAMap("cm".into())));
        // Not YAML: the decoder's error (nothing in it could be an alias) …
        assert!(matches!(
            parse("cm", "a: [1"),
            Err(ValuesError::Yaml { .. })
        ));
        // … or, when it might hold one, the check's.
        assert!(matches!(
            parse("cm", "a: [*b"),
            Err(ValuesError::Refused {
                refusal: YamlRefusal::Invalid { .. },
                ..
            })
        ));
    }

    /// The review's 270 KB document that decodes to 256 MiB: refused, naming its source.
    #[test]
    fn aliases_are_refused_with_the_source_named() {
        let mut bomb = format!("big: &a \"{}\"\nlist:\n", "v".repeat(64 << 10));
        bomb.push_str(&"- *a\n".repeat(4000));
        let source = "valuesFrom[1] ConfigMap x key y";
        let error = parse(source, &bomb).unwrap_err();
        assert_eq!(
            error.to_string(),
            "valuesFrom[1] ConfigMap x key y: YAML anchors and aliases are not allowed (line 1, column 9)"
        );
        assert!(matches!(
            parse("s", "a: {<<: *b}"),
            Err(ValuesError::Refused { .. })
        ));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// Text of YAML tokens in any order: mostly not YAML, anchors and aliases among them.
        fn yamlish() -> impl Strategy<Value = String> {
            let token = prop::sample::select(vec![
                "a",
                "b: ",
                ": ",
                "- ",
                "\n",
                "  ",
                "&x ",
                "*x",
                "<<: ",
                "[",
                "]",
                "{",
                "}",
                ",",
                "'q'",
                "\"d\"",
                "~",
                "1",
                "é",
                "#c",
                "---\n",
                "? ",
                "!!str ",
                "\t",
                "|\n",
                "&",
                "*",
                "\\",
                "\"\\x00\"",
            ]);
            prop::collection::vec(token, 0..40).prop_map(|tokens| tokens.concat())
        }

        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                "[a-z&*:#'\" -]{0,8}".prop_map(Value::from),
            ];
            leaf.prop_recursive(4, 32, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                    prop::collection::btree_map("[a-z&*]{1,6}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn values_map() -> impl Strategy<Value = Map<String, Value>> {
            prop::collection::btree_map("[a-z]{1,4}", value(), 0..5)
                .prop_map(|m| m.into_iter().collect())
        }

        fn json_len(map: &Map<String, Value>) -> usize {
            serde_json::to_vec(map).unwrap().len()
        }

        proptest! {
            /// Any text: refused or decoded, never a panic; what is decoded is at most a
            /// constant times the text (nothing was expanded).
            #[test]
            fn any_text_is_refused_or_decoded_without_expansion(text in yamlish()) {
                if let Ok(map) = parse("cm", &text) {
                    prop_assert!(json_len(&map) <= 8 * text.len() + 64, "{:?}", text);
                }
            }

            /// What a YAML serializer writes is read back unchanged; the same text with an
            /// anchor and an alias added is refused, naming the source.
            #[test]
            fn serialized_values_pass_and_aliases_in_them_are_refused(map in values_map()) {
                let text = serde_yaml_ng::to_string(&map).unwrap();
                prop_assert_eq!(&parse("cm", &text).unwrap(), &map);
                let aliased = format!("anchored: &a {{k: v}}\n{text}aliased: *a\n");
                let refused = matches!(
                    parse("cm", &aliased),
                    Err(ValuesError::Refused { refusal: YamlRefusal::Alias { .. }, .. })
                );
                prop_assert!(refused, "{}", aliased);
            }

            /// Nesting of any depth is refused or decoded, never a stack overflow.
            #[test]
            fn deep_nesting_never_overflows(depth in 1usize..20_000, flow in any::<bool>()) {
                let text = if flow {
                    format!("a: {}{}", "[".repeat(depth), "]".repeat(depth))
                } else {
                    (0..depth.min(300)).map(|i| format!("{}k:\n", " ".repeat(i))).collect()
                };
                let _ = parse("cm", &text);
            }

            /// A merge keeps every key of the overlay and is never larger than its inputs.
            #[test]
            fn merges_are_bounded_by_their_inputs(base in values_map(), overlay in values_map()) {
                let bound = json_len(&base) + json_len(&overlay);
                let mut merged = base;
                merge(&mut merged, overlay.clone());
                prop_assert!(json_len(&merged) <= bound);
                prop_assert!(overlay.keys().all(|k| merged.contains_key(k)));
            }
        }
    }
}
