//! Drift modes and foreign managers (pure): the `Drifted` condition's bounded message, the
//! checked list of managers whose changes a drift pass reverts (`spec.drift.overrideManagers`
//! and `--drift-override-managers`), and the `managedFields` that hand their fields to
//! module-manager so that its next apply reverts them (docs/reconcile.md, "Drift modes").
//!
//! The take-over follows Flux (fluxcd/pkg `ssa/patch.go`, `PatchReplaceFieldsManagers`): the
//! entries of the named managers are dropped and their fields merged into the applier's own
//! `Apply` entry; the applier's next apply, which does not send the fields they added, releases
//! them (removed), and sets its own value on the fields they changed.

use serde_json::{Map, Value};

use super::drift::{Pointer, applied_by, insert};
use super::status::DriftCondition;
use super::{PlanError, describe};
use crate::api::{DriftMode, InventoryEntry};

/// Most objects the `Drifted` message names; the rest are counted.
pub const MAX_OBJECTS: usize = 5;
/// Most field paths the message names per object; the rest are counted.
pub const MAX_PATHS: usize = 5;
/// Most managers `spec.drift.overrideManagers` and the flag may name together.
pub const MAX_MANAGERS: usize = 32;

/// What a drift pass found on one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriftedObject {
    /// The object.
    pub id: InventoryEntry,
    /// What differs: JSON pointers of fields; empty when the object is missing.
    pub paths: Vec<String>,
}

/// Whether a pass checks its objects for drift: a drift pass (`drift_pass`: nothing changed
/// since the last pass that applied everything) in `warn` mode, or in `enabled` mode one of the
/// timer's (`timer`: not asked for, over a Ready module — a pass asked for repairs without a
/// report). Never in `disabled` mode.
pub fn checks(mode: DriftMode, drift_pass: bool, timer: bool) -> bool {
    drift_pass
        && match mode {
            DriftMode::Warn => true,
            DriftMode::Enabled => timer,
            DriftMode::Disabled => false,
        }
}

/// The `Drifted` condition a pass leaves; `None` keeps the previous one. `changed`: the pass
/// applied a changed render or spec in full; `checked`: it looked at its objects and `found`
/// is what it found (a pass that only re-read a rollout did not look: `None`).
pub fn condition(
    mode: DriftMode,
    changed: bool,
    checked: bool,
    found: &[DriftedObject],
) -> Option<DriftCondition> {
    if mode == DriftMode::Disabled {
        return Some(DriftCondition::clear(
            "DriftDisabled",
            "spec.drift.mode is disabled: no drift pass",
        ));
    }
    if changed {
        return Some(DriftCondition::clear(
            "Applied",
            "the render was applied in full",
        ));
    }
    if !checked {
        return None;
    }
    Some(match message(mode, found) {
        Some((reason, message)) => DriftCondition {
            drifted: true,
            reason,
            message,
        },
        None => DriftCondition::clear("NoDrift", "the last drift pass found no drift"),
    })
}

/// The `Drifted` condition's reason and message for `found` (`None`: no drift found), under
/// `mode`; at most [`MAX_OBJECTS`] objects and [`MAX_PATHS`] paths each are named, the rest
/// counted — the message never grows with the module.
pub fn message(mode: DriftMode, found: &[DriftedObject]) -> Option<(&'static str, String)> {
    if found.is_empty() {
        return None;
    }
    let named: Vec<String> = found.iter().take(MAX_OBJECTS).map(object_line).collect();
    let mut text = format!(
        "{} object(s) differ from the chart: {}",
        found.len(),
        named.join("; ")
    );
    if found.len() > MAX_OBJECTS {
        text.push_str(&format!(
            "; and {} more (at most {MAX_OBJECTS} objects and {MAX_PATHS} paths each are named)",
            found.len() - MAX_OBJECTS
        ));
    }
    Some(match mode {
        DriftMode::Warn => {
            text.push_str(" — not repaired (spec.drift.mode: warn)");
            ("DriftDetected", text)
        }
        _ => {
            text.push_str(" — repaired");
            ("DriftRepaired", text)
        }
    })
}

fn object_line(object: &DriftedObject) -> String {
    let what = if object.paths.is_empty() {
        "missing".to_owned()
    } else {
        let mut paths: Vec<&str> = object
            .paths
            .iter()
            .take(MAX_PATHS)
            .map(String::as_str)
            .collect();
        let more = object.paths.len().saturating_sub(MAX_PATHS);
        let extra = format!("+{more} more");
        if more > 0 {
            paths.push(&extra);
        }
        paths.join(", ")
    };
    format!("{} ({what})", describe(&object.id))
}

/// The managers whose changes are reverted: the operator's and the Manifest's, without
/// duplicates. Refused (a permanent error): module-manager's own managers (`reserved`), an
/// empty name, more than [`MAX_MANAGERS`].
pub fn override_managers(
    operator: &[String],
    manifest: &[String],
    reserved: &[&str],
) -> Result<Vec<String>, PlanError> {
    let mut managers: Vec<String> = Vec::new();
    for name in operator.iter().chain(manifest) {
        if name.is_empty() || reserved.contains(&name.as_str()) {
            return Err(PlanError::OverrideManager {
                name: name.clone(),
                reason: "module-manager's own managers (and an empty name) cannot be overridden",
            });
        }
        if !managers.contains(name) {
            managers.push(name.clone());
        }
    }
    if managers.len() > MAX_MANAGERS {
        return Err(PlanError::OverrideManager {
            name: format!("{} managers", managers.len()),
            reason: "at most 32 managers may be overridden",
        });
    }
    Ok(managers)
}

/// Whether a `managedFields` entry is one of `managers`' writes to the object's fields: the
/// object itself or its scale subresource (`kubectl scale`), not its status.
fn foreign(entry: &Value, managers: &[String]) -> bool {
    let subresource = entry.get("subresource").and_then(Value::as_str);
    entry
        .get("manager")
        .and_then(Value::as_str)
        .is_some_and(|m| managers.iter().any(|o| o == m))
        && matches!(subresource, None | Some("" | "scale"))
}

/// Whether a take-over may rewrite `live`'s `managedFields`: it carries this Manifest's label
/// (`manifest_uid`) and is the object the Manifest recorded (`recorded_uid`, when there is one)
/// — not another object made under the name with a copied label.
pub fn may_take_over(
    label: Option<&str>,
    live_uid: Option<&str>,
    manifest_uid: &str,
    recorded_uid: Option<&str>,
) -> bool {
    label == Some(manifest_uid) && recorded_uid.is_none_or(|r| live_uid == Some(r))
}

/// The `managedFields` of `live` with the fields of `managers` moved into `own`'s `Apply`
/// entry (made when missing): their entries are dropped, less the fields `left` to others
/// (`spec.driftIgnore`, `replicas` left to an autoscaler: the apply that follows does not send
/// them, so taking them over would remove them) and `status`, which stay with them. `None` when
/// there is nothing to take over.
pub fn take_over(
    live: &Value,
    managers: &[String],
    own: &str,
    left: &[Pointer],
) -> Option<Vec<Value>> {
    let entries = live.pointer("/metadata/managedFields")?.as_array()?;
    let mut fields = Value::Object(Map::new());
    for entry in entries.iter().filter(|e| foreign(e, managers)) {
        union(&mut fields, &split(entry, left).0);
    }
    if empty(&fields) {
        return None;
    }
    let mut kept: Vec<Value> = Vec::with_capacity(entries.len() + 1);
    let mut merged = false;
    for entry in entries {
        let mut entry = entry.clone();
        if foreign(&entry, managers) {
            let (_, theirs) = split(&entry, left);
            if empty(&theirs) {
                continue;
            }
            entry["fieldsV1"] = theirs;
        } else if !merged && applied_by(&entry, own) {
            union(&mut fields, entry.get("fieldsV1").unwrap_or(&Value::Null));
            entry["fieldsV1"] = fields.clone();
            merged = true;
        }
        kept.push(entry);
    }
    if !merged {
        kept.push(serde_json::json!({
            "manager": own, "operation": "Apply", "fieldsType": "FieldsV1",
            "apiVersion": live.get("apiVersion").cloned().unwrap_or(Value::Null),
            "fieldsV1": fields,
        }));
    }
    Some(kept)
}

/// A foreign entry's `fieldsV1` split in two: the fields to take over, and those that stay
/// with it (`left`, and `status`).
fn split(entry: &Value, left: &[Pointer]) -> (Value, Value) {
    let mut taken = entry.get("fieldsV1").cloned().unwrap_or(Value::Null);
    let mut theirs = Value::Object(Map::new());
    let status = [String::from("f:status")];
    let paths = left.iter().map(|p| {
        p.segments()
            .iter()
            .map(|s| format!("f:{s}"))
            .collect::<Vec<_>>()
    });
    for path in paths.chain(std::iter::once(status.to_vec())) {
        if let Some(node) = cut(&mut taken, &path) {
            insert(&mut theirs, &path, node);
        }
    }
    (taken, theirs)
}

/// Removes the node at `path` from a `fieldsV1` tree, with the parents it leaves empty (an
/// empty node would own its field whole).
fn cut(tree: &mut Value, path: &[String]) -> Option<Value> {
    let (first, rest) = path.split_first()?;
    let map = tree.as_object_mut()?;
    if rest.is_empty() {
        return map.remove(first);
    }
    let child = map.get_mut(first)?;
    let node = cut(child, rest)?;
    if empty(child) {
        map.remove(first);
    }
    Some(node)
}

/// Whether a `fieldsV1` tree owns nothing.
fn empty(tree: &Value) -> bool {
    tree.as_object().is_none_or(Map::is_empty)
}

/// The union of two `fieldsV1` trees, into `into`.
fn union(into: &mut Value, from: &Value) {
    let (Some(into), Some(from)) = (into.as_object_mut(), from.as_object()) else {
        return;
    };
    for (key, sub) in from {
        let slot = into
            .entry(key.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        union(slot, sub);
    }
}

/// The fields `managers` own on `live` (the object and its scale subresource), as paths:
/// `/data/extra`, a list element by its key `/spec/containers[{"name":"app"}]/image`, less the
/// fields `left` to others (as [`take_over`]). What a warn-mode pass reports of them (it
/// reverts nothing). At most `limit` paths.
pub fn foreign_paths(
    live: &Value,
    managers: &[String],
    left: &[Pointer],
    limit: usize,
) -> Vec<String> {
    let Some(entries) = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    for entry in entries.iter().filter(|e| foreign(e, managers)) {
        leaves(&split(entry, left).0, "", &mut paths);
    }
    paths.sort();
    paths.dedup();
    paths.truncate(limit);
    paths
}

/// The leaf paths of a `fieldsV1` tree (a node whose only child is `.` counts as a leaf).
fn leaves(node: &Value, prefix: &str, out: &mut Vec<String>) {
    let Some(map) = node.as_object() else {
        return;
    };
    for (key, sub) in map.iter().filter(|(k, _)| k.as_str() != ".") {
        let path = match key.split_once(':') {
            Some(("f", name)) => {
                format!("{prefix}/{}", name.replace('~', "~0").replace('/', "~1"))
            }
            Some((_, element)) => format!("{prefix}[{element}]"),
            None => format!("{prefix}/{key}"),
        };
        let children = sub
            .as_object()
            .map_or(0, |m| m.keys().filter(|k| *k != ".").count());
        if children == 0 {
            out.push(path);
        } else {
            leaves(sub, &path, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(name: &str) -> InventoryEntry {
        InventoryEntry {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_message_names_objects_and_paths_within_bounds() {
        assert_eq!(message(DriftMode::Enabled, &[]), None);
        let one = DriftedObject {
            id: id("a"),
            paths: vec!["/data/mode".into()],
        };
        let (reason, text) = message(DriftMode::Warn, std::slice::from_ref(&one)).unwrap();
        assert_eq!(reason, "DriftDetected");
        assert_eq!(
            text,
            "1 object(s) differ from the chart: ConfigMap/ns/a (/data/mode) — not repaired (spec.drift.mode: warn)"
        );
        let many: Vec<DriftedObject> = (0..40)
            .map(|i| DriftedObject {
                id: id(&format!("c{i}")),
                paths: (0..100).map(|p| format!("/data/k{p}")).collect(),
            })
            .collect();
        let (reason, text) = message(DriftMode::Enabled, &many).unwrap();
        assert_eq!(reason, "DriftRepaired");
        assert!(text.starts_with("40 object(s) differ"), "{text}");
        assert!(text.contains("/data/k4, +95 more"), "{text}");
        assert!(!text.contains("/data/k5"), "{text}");
        assert!(text.contains("c4 (") && !text.contains("c5 ("), "{text}");
        assert!(text.contains("and 35 more (at most 5 objects"), "{text}");
        assert!(text.len() < 2000, "bounded: {}", text.len());
        let missing = DriftedObject {
            id: id("gone"),
            paths: vec![],
        };
        let (_, text) = message(DriftMode::Enabled, &[missing]).unwrap();
        assert!(text.contains("ConfigMap/ns/gone (missing)"), "{text}");
    }

    #[test]
    fn override_managers_merge_and_refuse_our_own() {
        let reserved = ["module-manager", "module-manager-handover"];
        let ok = override_managers(
            &["kubectl-edit".into()],
            &["kubectl-edit".into(), "kubectl".into()],
            &reserved,
        )
        .unwrap();
        assert_eq!(ok, ["kubectl-edit", "kubectl"]);
        let error = override_managers(&[], &["module-manager".into()], &reserved).unwrap_err();
        assert!(error.to_string().contains("\"module-manager\""), "{error}");
        assert!(override_managers(&["".into()], &[], &reserved).is_err());
        let lots: Vec<String> = (0..33).map(|i| format!("m{i}")).collect();
        assert!(override_managers(&lots, &[], &reserved).is_err());
    }

    fn live() -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"managedFields": [
            {"manager": "module-manager", "operation": "Apply", "apiVersion": "v1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:counter": {}}}},
            {"manager": "other-writer", "operation": "Update", "apiVersion": "v1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:mode": {}, "f:extra": {}}}},
            {"manager": "kubectl", "operation": "Update", "subresource": "scale",
             "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            {"manager": "other-writer", "operation": "Update", "subresource": "status",
             "fieldsV1": {"f:status": {"f:phase": {}}}},
            {"manager": "someone-else", "operation": "Update",
             "fieldsV1": {"f:data": {"f:theirs": {}}}}
        ]}})
    }

    #[test]
    fn a_take_over_merges_the_foreign_fields_into_our_apply_entry() {
        let managers = ["other-writer".to_owned(), "kubectl".to_owned()];
        let entries = take_over(&live(), &managers, "module-manager", &[]).unwrap();
        let names: Vec<(&str, Option<&str>)> = entries
            .iter()
            .map(|e| (e["manager"].as_str().unwrap(), e["subresource"].as_str()))
            .collect();
        // Status entries and other managers stay; the named ones go.
        assert_eq!(
            names,
            [
                ("module-manager", None),
                ("other-writer", Some("status")),
                ("someone-else", None)
            ]
        );
        assert_eq!(
            entries[0]["fieldsV1"],
            json!({"f:data": {"f:counter": {}, "f:mode": {}, "f:extra": {}},
                   "f:spec": {"f:replicas": {}}})
        );
        assert_eq!(
            take_over(&live(), &["nobody".into()], "module-manager", &[]),
            None
        );
        assert_eq!(take_over(&live(), &[], "module-manager", &[]), None);
        // No apply entry of ours yet: one is made.
        let mut other = live();
        other["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .remove(0);
        let entries = take_over(&other, &["other-writer".into()], "module-manager", &[]).unwrap();
        let ours = entries.last().unwrap();
        assert_eq!(ours["manager"], "module-manager");
        assert_eq!(ours["operation"], "Apply");
        assert_eq!(ours["apiVersion"], "v1");
    }

    #[test]
    fn foreign_paths_are_the_leaves_the_managers_own() {
        let managers = ["other-writer".to_owned(), "kubectl".to_owned()];
        assert_eq!(
            foreign_paths(&live(), &managers, &[], 10),
            ["/data/extra", "/data/mode", "/spec/replicas"]
        );
        assert_eq!(foreign_paths(&live(), &managers, &[], 1), ["/data/extra"]);
        let listed = json!({"metadata": {"managedFields": [{"manager": "m", "operation": "Update",
            "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:a/b": {}}},
                         "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}}}}}}]}});
        assert_eq!(
            foreign_paths(&listed, &["m".into()], &[], 10),
            [
                "/metadata/annotations/a~1b",
                "/spec/containers[{\"name\":\"app\"}]/image"
            ]
        );
    }

    fn pointer(text: &str) -> Pointer {
        Pointer::parse(text).unwrap()
    }

    #[test]
    fn a_take_over_leaves_ignored_and_yielded_fields_and_status_with_their_owner() {
        let live = json!({"apiVersion": "apps/v1", "metadata": {"managedFields": [
            {"manager": "module-manager", "operation": "Apply", "apiVersion": "apps/v1",
             "fieldsV1": {"f:spec": {"f:template": {}}}},
            {"manager": "kubectl-edit", "operation": "Update", "apiVersion": "apps/v1",
             "fieldsV1": {"f:spec": {"f:replicas": {}, "f:paused": {}},
                          "f:metadata": {"f:annotations": {".": {}, "f:a": {}}},
                          "f:status": {"f:phase": {}}}}
        ]}});
        let managers = ["kubectl-edit".to_owned()];
        let left = [pointer("/spec/replicas"), pointer("/metadata/annotations")];
        let entries = take_over(&live, &managers, "module-manager", &left).unwrap();
        assert_eq!(
            entries[0]["fieldsV1"],
            json!({"f:spec": {"f:template": {}, "f:paused": {}}}),
            "only the fields the apply sends are taken over"
        );
        assert_eq!(entries[1]["manager"], "kubectl-edit");
        assert_eq!(
            entries[1]["fieldsV1"],
            json!({"f:spec": {"f:replicas": {}},
                   "f:metadata": {"f:annotations": {".": {}, "f:a": {}}},
                   "f:status": {"f:phase": {}}}),
            "what is left to them stays theirs"
        );
        assert_eq!(
            foreign_paths(&live, &managers, &left, 10),
            ["/spec/paused"],
            "warn mode reports no ignored field"
        );
        // Only fields left to them: nothing to take over, nothing written.
        let only_left = [pointer("/spec"), pointer("/metadata/annotations")];
        assert_eq!(
            take_over(&live, &managers, "module-manager", &only_left),
            None
        );
        assert!(foreign_paths(&live, &managers, &only_left, 10).is_empty());
    }

    #[test]
    fn only_the_recorded_object_is_taken_over() {
        let ours = Some("manifest");
        assert!(may_take_over(ours, Some("a"), "manifest", Some("a")));
        assert!(may_take_over(ours, Some("a"), "manifest", None));
        assert!(
            !may_take_over(ours, Some("b"), "manifest", Some("a")),
            "re-created under the name with our label"
        );
        assert!(!may_take_over(
            Some("other"),
            Some("a"),
            "manifest",
            Some("a")
        ));
        assert!(!may_take_over(None, Some("a"), "manifest", None));
    }

    #[test]
    fn which_passes_check_and_what_they_leave() {
        use DriftMode::{Disabled, Enabled, Warn};
        assert!(checks(Warn, true, false));
        assert!(checks(Enabled, true, true));
        assert!(
            !checks(Enabled, true, false),
            "asked for: repaired, not reported"
        );
        assert!(!checks(Disabled, true, true));
        assert!(!checks(Warn, false, true), "a changed render is applied");
        let found = [DriftedObject {
            id: id("a"),
            paths: vec!["/data/mode".into()],
        }];
        let reason = |c: Option<DriftCondition>| c.map(|c| (c.drifted, c.reason));
        assert_eq!(
            reason(condition(Warn, false, true, &found)),
            Some((true, "DriftDetected"))
        );
        assert_eq!(
            reason(condition(Enabled, false, true, &found)),
            Some((true, "DriftRepaired"))
        );
        assert_eq!(
            reason(condition(Warn, false, true, &[])),
            Some((false, "NoDrift"))
        );
        // A pass that did not look (it re-read a rollout) keeps what the last one found.
        assert_eq!(reason(condition(Warn, false, false, &[])), None);
        assert_eq!(
            reason(condition(Warn, true, false, &[])),
            Some((false, "Applied"))
        );
        assert_eq!(
            reason(condition(Disabled, false, false, &[])),
            Some((false, "DriftDisabled"))
        );
    }
}
