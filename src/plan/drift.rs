//! Drift without fighting other controllers: `spec.driftIgnore` rules, the fields an apply
//! yields to an autoscaler, and the fields a new apply would release that are handed over first.
//!
//! Server-side apply releases a field the applier stops sending; a released field nobody else
//! owns is removed or reset to its default (a Deployment's `replicas` to 1). Kubernetes' own
//! advice ("Server-Side Apply", § Transferring ownership) is to apply the live value under
//! another field manager first, then apply without the field: that is [`handover`].

use serde_json::{Map, Value};

use super::{PlanError, RenderedObject};
use crate::api::{DriftIgnoreRule, DriftIgnoreTarget, InventoryEntry};

/// The field manager that holds a field module-manager stops setting until another manager
/// (an autoscaler, a person) changes it.
pub const HANDOVER_MANAGER: &str = "module-manager-handover";

/// The one field written through the scale subresource of the built-in workloads (by the
/// HorizontalPodAutoscaler, KEDA's HPAs, `kubectl scale`).
const REPLICAS: &str = "/spec/replicas";

/// A checked JSON pointer (RFC 6901): its unescaped segments, never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pointer(Vec<String>);

impl Pointer {
    /// Parses and checks a pointer; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err("a JSON pointer starts with '/'");
        };
        let mut segments = Vec::new();
        for raw in rest.split('/') {
            if raw.is_empty() {
                return Err("a JSON pointer has no empty segments");
            }
            if raw == "-" {
                return Err("'-' (past the end of a list) names no field");
            }
            // A position in a list: the field would be released at the next apply but could
            // not be handed over (server-side apply keys list elements by their merge key, not
            // their position), so the API server would remove it — refused rather than lost.
            if raw.bytes().all(|b| b.is_ascii_digit()) {
                return Err(
                    "a path through a list position is not supported (its field could not be kept at its live value)",
                );
            }
            segments.push(unescape(raw)?);
        }
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        match segments.as_slice() {
            ["apiVersion" | "kind", ..] | ["metadata"] => {
                Err("the object's type cannot be ignored")
            }
            ["metadata", "name" | "namespace" | "uid", ..] => {
                Err("the object's identity cannot be ignored")
            }
            ["metadata", "labels"] | ["metadata", "labels", "modulemanager.io/manifest-uid"] => {
                Err("the modulemanager.io/manifest-uid label cannot be ignored")
            }
            _ => Ok(Self(segments.into_iter().map(str::to_owned).collect())),
        }
    }

    /// Its unescaped segments (field names: a list position is refused by [`Self::parse`]).
    pub fn segments(&self) -> &[String] {
        &self.0
    }

    /// The value at this pointer in `value`, if any.
    pub fn get<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        self.0.iter().try_fold(value, |node, segment| match node {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?),
            _ => None,
        })
    }

    /// Removes the value at this pointer from `value`; whether there was one.
    pub fn remove(&self, value: &mut Value) -> bool {
        let Some((last, parents)) = self.0.split_last() else {
            return false;
        };
        let parent = parents.iter().try_fold(value, |node, segment| match node {
            Value::Object(map) => map.get_mut(segment),
            Value::Array(items) => items.get_mut(segment.parse::<usize>().ok()?),
            _ => None,
        });
        match parent {
            Some(Value::Object(map)) => map.remove(last).is_some(),
            Some(Value::Array(items)) => match last.parse::<usize>() {
                Ok(index) if index < items.len() => {
                    items.remove(index);
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }
}

fn unescape(raw: &str) -> Result<String, &'static str> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match (c, c == '~') {
            (_, false) => out.push(c),
            _ => match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                _ => return Err("'~' must be followed by 0 or 1 (~0 is '~', ~1 is '/')"),
            },
        }
    }
    Ok(out)
}

/// `spec.driftIgnore`, checked: each rule's target and pointers.
#[derive(Clone, Debug, Default)]
pub struct IgnoreRules(Vec<(DriftIgnoreTarget, Vec<Pointer>)>);

impl IgnoreRules {
    /// Checks every rule; the first bad pointer is a permanent error naming its rule.
    pub fn parse(rules: &[DriftIgnoreRule]) -> Result<Self, PlanError> {
        let mut parsed = Vec::with_capacity(rules.len());
        for (index, rule) in rules.iter().enumerate() {
            let mut pointers = Vec::with_capacity(rule.paths.len());
            for path in &rule.paths {
                let pointer = Pointer::parse(path).map_err(|reason| PlanError::DriftIgnore {
                    rule: index,
                    path: path.clone(),
                    reason,
                })?;
                pointers.push(pointer);
            }
            parsed.push((rule.target.clone().unwrap_or_default(), pointers));
        }
        Ok(Self(parsed))
    }

    /// The pointers of every rule whose target matches `id`.
    pub fn pointers(&self, id: &InventoryEntry) -> Vec<&Pointer> {
        self.0
            .iter()
            .filter(|(target, _)| matches(target, id))
            .flat_map(|(_, pointers)| pointers)
            .collect()
    }
}

fn matches(target: &DriftIgnoreTarget, id: &InventoryEntry) -> bool {
    let field = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
    field(&target.group, &id.group)
        && field(&target.kind, &id.kind)
        && field(&target.name, &id.name)
        && field(&target.namespace, &id.namespace)
}

/// Whether the kind has the built-in scale subresource on `spec.replicas`.
fn scalable(id: &InventoryEntry) -> bool {
    matches!(
        (id.group.as_str(), id.kind.as_str()),
        ("apps", "Deployment" | "StatefulSet" | "ReplicaSet") | ("", "ReplicationController")
    )
}

/// What one object's apply looks like under the drift rules.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    /// The body to apply now: the render, less the ignored fields once the object exists.
    pub body: Value,
    /// The body of the applies after this one (the render less the ignored fields): a field
    /// module-manager owns that is missing here is released by the next apply.
    pub steady: Value,
    /// The fields that may be released and must be handed over when module-manager owns
    /// them: the rules' pointers and, on the built-in workloads, `/spec/replicas`.
    pub candidates: Vec<Pointer>,
}

/// Prepares `object`'s apply: without the fields `rules` ignore when the object `exists`
/// (was applied before), with them on its first apply (the chart's value is the start).
pub fn prepare(object: &RenderedObject, rules: &IgnoreRules, exists: bool) -> Prepared {
    let mut candidates: Vec<Pointer> = rules.pointers(&object.id).into_iter().cloned().collect();
    let mut steady = object.body.clone();
    for pointer in &candidates {
        pointer.remove(&mut steady);
    }
    if scalable(&object.id) {
        let replicas = Pointer::parse(REPLICAS).expect("a valid pointer");
        if !candidates.contains(&replicas) {
            candidates.push(replicas);
        }
    }
    Prepared {
        body: if exists {
            steady.clone()
        } else {
            object.body.clone()
        },
        steady,
        candidates,
    }
}

impl Prepared {
    /// Whether the next apply may release a candidate: one is missing from the steady body
    /// (whether module-manager owns it, only the live object says).
    pub fn may_release(&self) -> bool {
        self.candidates
            .iter()
            .any(|p| p.get(&self.steady).is_none())
    }

    /// The fields left to others: the candidates the steady body lacks (`spec.driftIgnore`'s,
    /// and a built-in workload's `replicas` when the chart leaves them to an autoscaler). A
    /// take-over of override managers' fields leaves these with their owners
    /// ([`super::drift_report::take_over`]).
    pub fn left_alone(&self) -> Vec<Pointer> {
        self.candidates
            .iter()
            .filter(|p| p.get(&self.steady).is_none())
            .cloned()
            .collect()
    }

    /// The candidates a [`handover`] body holds, as pointers (for a log line: paths, never
    /// values, which may be a Secret's).
    pub fn handed_over(&self, handover: &Value) -> Vec<String> {
        self.candidates
            .iter()
            .filter(|p| p.get(&self.steady).is_none() && p.get(handover).is_some())
            .map(ToString::to_string)
            .collect()
    }
}

impl std::fmt::Display for Pointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for segment in &self.0 {
            write!(f, "/{}", segment.replace('~', "~0").replace('/', "~1"))?;
        }
        Ok(())
    }
}

/// `applied` (a dry run of the apply) as the pass leaves the object: the fields [`handover`]
/// would hand over first keep their live values (the dry run, without the handover, shows them
/// released — reset to their defaults or removed). For `module-manager diff`.
pub fn after_handover(prepared: &Prepared, live: &Value, manager: &str, applied: &mut Value) {
    let Some(body) = handover(prepared, live, manager) else {
        return;
    };
    for pointer in &prepared.candidates {
        if let Some(value) = pointer.get(&body) {
            insert(applied, &pointer.0, value.clone());
        }
    }
}

/// The handover apply for `live` before [`Prepared::steady`] is applied by `manager`: the
/// candidates `manager` owns (its `Apply` entry in `managedFields`) that the steady body lacks,
/// at their live values, with the object's type and name — or `None` when nothing would be
/// released. Fields inside lists are not handed over (their elements are keyed by the schema).
pub fn handover(prepared: &Prepared, live: &Value, manager: &str) -> Option<Value> {
    let owned = owned_fields(live, manager)?;
    let mut fields = Value::Object(Map::new());
    for pointer in &prepared.candidates {
        if pointer.get(&prepared.steady).is_some() {
            continue; // still applied: not released
        }
        let Some(value) = owned_value(pointer, live, owned) else {
            continue;
        };
        insert(&mut fields, &pointer.0, value);
    }
    if fields.as_object().is_some_and(Map::is_empty) {
        return None;
    }
    let mut metadata = Map::new();
    for key in ["name", "namespace"] {
        if let Some(value) = live.pointer(&format!("/metadata/{key}")) {
            metadata.insert(key.into(), value.clone());
        }
    }
    let mut body = fields;
    let map = body.as_object_mut()?;
    for key in ["apiVersion", "kind"] {
        map.insert(key.into(), live.get(key)?.clone());
    }
    let existing = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    existing.as_object_mut()?.extend(metadata);
    Some(body)
}

/// The `fieldsV1` of `manager`'s apply on the object (not a subresource's).
fn owned_fields<'v>(live: &'v Value, manager: &str) -> Option<&'v Value> {
    live.pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .find(|entry| applied_by(entry, manager))?
        .get("fieldsV1")
}

/// Whether a `managedFields` entry is `manager`'s apply of the object (not a subresource's).
pub fn applied_by(entry: &Value, manager: &str) -> bool {
    entry["manager"] == manager
        && entry["operation"] == "Apply"
        && entry
            .get("subresource")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
}

/// The live value at `pointer`, restricted to what `owned` (a `fieldsV1` tree) holds of it;
/// `None` when the manager owns nothing there or the path runs through a list.
fn owned_value(pointer: &Pointer, live: &Value, owned: &Value) -> Option<Value> {
    let mut fields = owned;
    let mut node = live;
    for segment in &pointer.0 {
        fields = fields.get(format!("f:{segment}"))?;
        node = node.as_object()?.get(segment)?;
    }
    restrict(node, fields)
}

/// `live` restricted to the fields of a `fieldsV1` subtree: maps by their `f:` children; a
/// leaf, or a list, whole.
fn restrict(live: &Value, fields: &Value) -> Option<Value> {
    let children: Vec<(&str, &Value)> = fields
        .as_object()?
        .iter()
        .filter_map(|(key, sub)| Some((key.strip_prefix("f:")?, sub)))
        .collect();
    match live {
        Value::Object(map) if !children.is_empty() => {
            let kept: Map<String, Value> = children
                .into_iter()
                .filter_map(|(name, sub)| Some((name.to_owned(), restrict(map.get(name)?, sub)?)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        other => Some(other.clone()),
    }
}

/// Puts `value` at `path` in `into` (a JSON object tree, a body or a `fieldsV1` tree), making
/// the objects on the way.
pub(super) fn insert(into: &mut Value, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = into;
    for segment in parents {
        let Some(map) = node.as_object_mut() else {
            return;
        };
        node = map
            .entry(segment.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if let Some(map) = node.as_object_mut() {
        map.insert(last.clone(), value);
    }
}

/// The field manager of the HorizontalPodAutoscaler controller's writes (through the scale
/// subresource): it owns `spec.replicas` of a workload an HPA scaled, also after the HPA is gone.
pub const AUTOSCALER_CONTROLLER: &str = "kube-controller-manager";

/// The managers other than [`HANDOVER_MANAGER`] that an apply conflict (HTTP 409) names for
/// `spec.replicas` of a built-in workload (which only autoscalers and `kubectl scale` write,
/// through the scale subresource, besides the chart). `message` is the API server's: `Apply
/// failed with 1 conflict: conflict with "kube-controller-manager" using apps/v1:
/// .spec.replicas`, or `conflicts with "<manager>" …:` lines each followed by one `- <path>`
/// line per field.
pub fn replicas_held_by(id: &InventoryEntry, message: &str) -> Vec<String> {
    if !scalable(id) {
        return Vec::new();
    }
    let held = conflicts(message)
        .into_iter()
        .filter(|(manager, path)| path == ".spec.replicas" && manager != HANDOVER_MANAGER);
    held.map(|(manager, _)| manager).collect()
}

/// The fields of an apply conflict left to their owner: `spec.replicas`, when a manager of
/// [`replicas_held_by`] holds it — the HPA controller only while an HPA targets the workload
/// (`autoscaled`): once the chart (or anyone) removed it, its leftover ownership does not keep
/// the chart's value out. [`HANDOVER_MANAGER`] only holds a field until someone changes it: a
/// chart that sets `replicas` again takes it back.
pub fn yielded(held_by: &[String], autoscaled: bool) -> Vec<Pointer> {
    let kept = held_by
        .iter()
        .any(|manager| manager != AUTOSCALER_CONTROLLER || autoscaled);
    if kept {
        vec![Pointer::parse(REPLICAS).expect("a valid pointer")]
    } else {
        Vec::new()
    }
}

/// The (manager, field path) pairs an apply conflict message names.
fn conflicts(message: &str) -> Vec<(String, String)> {
    let manager_of = |text: &str| -> String {
        let quoted = text.split_once('"').map_or("", |(_, rest)| rest);
        quoted
            .split_once('"')
            .map_or(quoted, |(name, _)| name)
            .to_owned()
    };
    if let Some((_, conflict)) = message.split_once("with 1 conflict: conflict with ") {
        return conflict
            .rsplit_once(": ")
            .map(|(manager, path)| vec![(manager_of(manager), path.trim().to_owned())])
            .unwrap_or_default();
    }
    let mut manager = String::new();
    let mut pairs = Vec::new();
    for line in message.lines() {
        if let Some((_, about)) = line.split_once("conflicts with ") {
            manager = manager_of(about);
        } else if let Some(path) = line.trim().strip_prefix("- ") {
            pairs.push((manager.clone(), path.trim().to_owned()));
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(group: &str, kind: &str, name: &str) -> InventoryEntry {
        InventoryEntry {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn rules(rules: Value) -> IgnoreRules {
        IgnoreRules::parse(&serde_json::from_value::<Vec<DriftIgnoreRule>>(rules).unwrap()).unwrap()
    }

    fn deployment(replicas: Option<i64>) -> RenderedObject {
        let mut body = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}}});
        if let Some(replicas) = replicas {
            body["spec"]["replicas"] = json!(replicas);
        }
        RenderedObject {
            id: id("apps", "Deployment", "web"),
            body,
        }
    }

    /// A live object whose `managedFields` give `mine` to module-manager's apply and `theirs`
    /// to another manager.
    fn live(body: &Value, mine: Value, theirs: Value) -> Value {
        let mut live = body.clone();
        live["metadata"]["managedFields"] = json!([
            {"manager": "module-manager", "operation": "Apply", "apiVersion": "apps/v1",
             "fieldsType": "FieldsV1", "fieldsV1": mine},
            {"manager": "kube-controller-manager", "operation": "Update", "subresource": "scale",
             "apiVersion": "apps/v1", "fieldsType": "FieldsV1", "fieldsV1": theirs},
        ]);
        live
    }

    #[test]
    fn pointers_follow_rfc_6901_and_refuse_what_cannot_be_ignored() {
        let pointer = Pointer::parse("/metadata/annotations/example.com~1owner~0x").unwrap();
        assert_eq!(
            pointer.0,
            ["metadata", "annotations", "example.com/owner~x"]
        );
        for (bad, why) in [
            ("", "starts with '/'"),
            ("spec/replicas", "starts with '/'"),
            ("/", "empty segments"),
            ("/spec//replicas", "empty segments"),
            ("/data/a~2b", "'~' must be followed"),
            ("/data/a~", "'~' must be followed"),
            ("/spec/containers/-", "past the end"),
            ("/kind", "type"),
            ("/metadata", "type"),
            ("/metadata/name", "identity"),
            ("/metadata/namespace", "identity"),
            ("/metadata/labels", "manifest-uid"),
            (
                "/metadata/labels/modulemanager.io~1manifest-uid",
                "manifest-uid",
            ),
        ] {
            let error = Pointer::parse(bad).unwrap_err();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
        assert!(Pointer::parse("/metadata/labels/team").is_ok());
        let text = "/metadata/annotations/example.com~1owner~0x";
        assert_eq!(Pointer::parse(text).unwrap().to_string(), text);
    }

    #[test]
    fn a_bad_rule_is_a_permanent_error_naming_the_rule_and_the_pointer() {
        let rules: Vec<DriftIgnoreRule> = serde_json::from_value(json!([
            {"paths": ["/spec/replicas"]},
            {"paths": ["/data/ok", "data/counter"], "target": {"kind": "ConfigMap"}},
        ]))
        .unwrap();
        let error = IgnoreRules::parse(&rules).unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec.driftIgnore[1]: invalid path \"data/counter\": a JSON pointer starts with '/'"
        );
        assert!(
            crate::reconcile::ReconcileError::Plan(error).is_permanent(),
            "a bad rule waits for a spec change"
        );
    }

    #[test]
    fn rules_apply_to_the_objects_their_target_names() {
        let rules = rules(json!([
            {"paths": ["/data/a"], "target": {"kind": "ConfigMap", "name": "settings"}},
            {"paths": ["/metadata/annotations/x"]},
            {"paths": ["/spec/replicas"], "target": {"group": "apps", "namespace": "other"}},
        ]));
        let names = |id: &InventoryEntry| -> Vec<String> {
            rules.pointers(id).iter().map(|p| p.0.join("/")).collect()
        };
        assert_eq!(
            names(&id("", "ConfigMap", "settings")),
            ["data/a", "metadata/annotations/x"]
        );
        assert_eq!(
            names(&id("", "ConfigMap", "other")),
            ["metadata/annotations/x"]
        );
        let mut elsewhere = id("apps", "Deployment", "web");
        assert_eq!(names(&elsewhere), ["metadata/annotations/x"]);
        elsewhere.namespace = "other".into();
        assert_eq!(
            names(&elsewhere),
            ["metadata/annotations/x", "spec/replicas"]
        );
    }

    #[test]
    fn ignored_fields_are_applied_only_on_the_first_apply() {
        let rules = rules(json!([{"paths": ["/data/counter", "/data/absent"]}]));
        let object = RenderedObject {
            id: id("", "ConfigMap", "c"),
            body: json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c"}, "data": {"counter": "0", "mode": "fast"}}),
        };
        let first = prepare(&object, &rules, false);
        assert_eq!(
            first.body, object.body,
            "the chart's value is where it starts"
        );
        let later = prepare(&object, &rules, true);
        assert_eq!(later.body["data"], json!({"mode": "fast"}));
        assert_eq!(later.steady, later.body);
        assert_eq!(first.steady, later.steady);
        assert!(later.may_release());
    }

    #[test]
    fn replicas_the_chart_stops_setting_are_handed_over_at_their_live_value() {
        let before = deployment(Some(2));
        let live = live(
            &before.body,
            json!({"f:spec": {"f:replicas": {}, "f:template": {}}}),
            json!({}),
        );
        let after = prepare(&deployment(None), &IgnoreRules::default(), true);
        assert!(after.may_release());
        assert_eq!(
            handover(&after, &live, "module-manager"),
            Some(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "ns"}, "spec": {"replicas": 2}}))
        );
        // Still set by the chart: nothing released, nothing handed over.
        let kept = prepare(&before, &IgnoreRules::default(), true);
        assert!(!kept.may_release());
        assert_eq!(handover(&kept, &live, "module-manager"), None);
    }

    #[test]
    fn nothing_is_handed_over_that_module_manager_does_not_own() {
        let after = prepare(&deployment(None), &IgnoreRules::default(), true);
        // The autoscaler took `replicas` over (ownership moves with a changed value): releasing
        // cannot reset it.
        let taken = live(
            &deployment(Some(5)).body,
            json!({"f:spec": {"f:template": {}}}),
            json!({"f:spec": {"f:replicas": {}}}),
        );
        assert_eq!(handover(&after, &taken, "module-manager"), None);
        // No apply entry of ours at all.
        assert_eq!(
            handover(&after, &deployment(Some(2)).body, "module-manager"),
            None
        );
        // The field is gone from the live object.
        let gone = live(
            &deployment(None).body,
            json!({"f:spec": {"f:replicas": {}}}),
            json!({}),
        );
        assert_eq!(handover(&after, &gone, "module-manager"), None);
    }

    #[test]
    fn a_rule_that_newly_covers_owned_fields_hands_over_only_what_module_manager_owns() {
        let rules = rules(json!([{"paths": ["/metadata/annotations", "/data/counter"]}]));
        let object = RenderedObject {
            id: id("", "ConfigMap", "c"),
            body: json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "namespace": "ns", "annotations": {"a": "1"}},
                "data": {"counter": "0", "mode": "fast"}}),
        };
        let mut live = object.body.clone();
        live["metadata"]["annotations"]["theirs"] = json!("t");
        live["data"]["counter"] = json!("7");
        live["metadata"]["managedFields"] = json!([{"manager": "module-manager",
            "operation": "Apply", "fieldsV1": {
                "f:metadata": {"f:annotations": {".": {}, "f:a": {}}},
                "f:data": {"f:counter": {}, "f:mode": {}}}}]);
        let prepared = prepare(&object, &rules, true);
        let body = handover(&prepared, &live, "module-manager").unwrap();
        assert_eq!(
            body,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "namespace": "ns", "annotations": {"a": "1"}},
                "data": {"counter": "7"}})
        );
        assert_eq!(
            prepared.handed_over(&body),
            ["/metadata/annotations", "/data/counter"]
        );
        // What `diff` shows: the dry run (without the handover) released the fields; after it
        // they keep their live values.
        let mut dry_run = json!({"metadata": {"name": "c"}, "data": {"mode": "fast"}});
        after_handover(&prepared, &live, "module-manager", &mut dry_run);
        assert_eq!(dry_run["data"], json!({"mode": "fast", "counter": "7"}));
        assert_eq!(dry_run["metadata"]["annotations"], json!({"a": "1"}));
    }

    #[test]
    fn pointers_through_lists_are_refused() {
        // Stripped but not handed over, the field would be released and removed by the API
        // server (an image: the Deployment refused; resources: silently dropped).
        let parsed = IgnoreRules::parse(
            &serde_json::from_value::<Vec<DriftIgnoreRule>>(
                json!([{"paths": ["/data/a", "/spec/template/spec/containers/0/image"]}]),
            )
            .unwrap(),
        );
        let error = parsed.unwrap_err().to_string();
        assert!(error.contains("spec.driftIgnore[0]"), "{error}");
        assert!(error.contains("list position"), "{error}");
        assert!(Pointer::parse("/spec/containers/1").is_err());
        assert!(Pointer::parse("/data/a1").is_ok());
    }

    #[test]
    fn only_replicas_conflicts_of_workloads_are_yielded() {
        let one = "Apply failed with 1 conflict: conflict with \"kube-controller-manager\" \
                   using apps/v1: .spec.replicas";
        let workload = id("apps", "Deployment", "web");
        assert_eq!(
            yielded(&replicas_held_by(&workload, one), true),
            [Pointer::parse(REPLICAS).unwrap()]
        );
        assert!(yielded(&replicas_held_by(&id("", "ConfigMap", "c"), one), true).is_empty());
        let many = "Apply failed with 2 conflicts: conflicts with \"hpa\" using apps/v1 at \
                    2026-12-02T01:00:00Z:\n- .spec.replicas\nconflicts with \"kubectl-edit\" \
                    using apps/v1:\n- .spec.template.spec.containers[name=\"web\"].image";
        let pair = |manager: &str, path: &str| (manager.to_owned(), path.to_owned());
        assert_eq!(
            conflicts(many),
            [
                pair("hpa", ".spec.replicas"),
                pair(
                    "kubectl-edit",
                    ".spec.template.spec.containers[name=\"web\"].image"
                )
            ]
        );
        assert_eq!(yielded(&replicas_held_by(&workload, many), true).len(), 1);
        let other = "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using \
                     apps/v1: .spec.template.spec.containers[name=\"web\"].image";
        assert!(yielded(&replicas_held_by(&workload, other), true).is_empty());
        // The handover manager only holds the field: a chart that sets it again takes it back.
        let held = "Apply failed with 1 conflict: conflict with \"module-manager-handover\": \
                    .spec.replicas";
        assert_eq!(
            conflicts(held),
            [pair("module-manager-handover", ".spec.replicas")]
        );
        assert!(yielded(&replicas_held_by(&workload, held), true).is_empty());
    }

    /// Issue 31 item 5: the HPA controller's ownership of `replicas` keeps the chart's value
    /// out only while an HPA targets the workload; any other manager (`kubectl scale`, a
    /// custom autoscaler) keeps it out whatever exists.
    #[test]
    fn the_hpa_controllers_replicas_are_kept_only_while_an_hpa_targets_the_workload() {
        let workload = id("apps", "Deployment", "web");
        let by = |manager: &str| {
            format!(
                "Apply failed with 1 conflict: conflict with \"{manager}\" with subresource \
                 \"scale\" using apps/v1: .spec.replicas"
            )
        };
        let hpa = replicas_held_by(&workload, &by(AUTOSCALER_CONTROLLER));
        assert_eq!(hpa, [AUTOSCALER_CONTROLLER]);
        assert_eq!(yielded(&hpa, true).len(), 1, "an HPA targets it");
        assert!(yielded(&hpa, false).is_empty(), "no HPA any more");
        let kubectl = replicas_held_by(&workload, &by("kubectl"));
        assert_eq!(yielded(&kubectl, false).len(), 1, "a person scaled it");
        assert!(yielded(&[], true).is_empty(), "nobody holds it");
    }
}
