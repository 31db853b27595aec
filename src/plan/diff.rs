//! Diff (pure): what the next pass would change — the fields of a live object that its
//! server-side dry-run apply changes, without the bookkeeping noise, Secret values redacted —
//! and the hooks a pass would run. `module-manager diff` shows it.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::api::{HookRun, HookRunPhase, InventoryEntry};
use crate::plan::Hook;

/// Metadata the API server keeps for itself: it changes on every write (or differs between a
/// dry run and the stored object) without saying anything about the object.
const NOISY_METADATA: [&str; 6] = [
    "managedFields",
    "resourceVersion",
    "generation",
    "uid",
    "creationTimestamp",
    "selfLink",
];

/// What a Secret's value shows in a diff: never the value itself.
pub const REDACTED: &str = "***";

/// One field that would change: its JSON pointer and its value before and after (`None`: absent).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FieldChange {
    /// JSON pointer of the field (RFC 6901), e.g. `/data/greeting`.
    pub path: String,
    /// The live value; `None` when the pass adds the field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    /// The value after the pass; `None` when the pass removes the field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
}

/// What the next pass would do to one object of the render.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "action")]
pub enum ObjectChange {
    /// The object does not exist: it would be created.
    Create,
    /// These fields would change.
    Update {
        /// The changed fields: by key, the live object's keys before the added ones.
        fields: Vec<FieldChange>,
    },
    /// The object exists without this Manifest's label: the pass would refuse to take it over.
    NotOwned,
}

/// One object of the diff.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObjectDiff {
    /// The object.
    pub object: InventoryEntry,
    /// What would happen to it.
    pub change: ObjectChange,
}

/// A hook the next pass would run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HookToRun {
    /// `pre-install`, `post-upgrade`, …
    pub event: &'static str,
    /// The hook object.
    pub object: InventoryEntry,
}

/// What the next pass would change.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Diff {
    /// Objects of the render that would be created or changed (unchanged ones are left out).
    pub objects: Vec<ObjectDiff>,
    /// Objects of the inventory the render no longer has: they would be pruned.
    pub prune: Vec<InventoryEntry>,
    /// Hooks that would run, in order.
    pub hooks: Vec<HookToRun>,
    /// What else the pass would do or not do: a failed hook run that stops it before anything
    /// is applied, a refused prune, a suspended Manifest.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Diff {
    /// Whether the pass would change anything.
    pub fn has_changes(&self) -> bool {
        !(self.objects.is_empty() && self.prune.is_empty() && self.hooks.is_empty())
    }
}

/// The object without what the API server keeps for itself: the metadata of
/// [`NOISY_METADATA`] and `status` (a pass never writes it).
pub fn without_noise(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
        if let Some(metadata) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for key in NOISY_METADATA {
                metadata.remove(key);
            }
        }
    }
    object
}

/// Whether `id` is a core Secret (its `data` and `stringData` hold secrets).
fn is_secret(id: &InventoryEntry) -> bool {
    id.group.is_empty() && id.kind == "Secret"
}

/// Replaces the values of a Secret's `data` and `stringData` in both versions: `***` where they
/// are equal, `*** (before)` and `*** (after)` where they differ (as `kubectl diff` masks them),
/// so that the diff says which keys change and never what they hold. Other objects are kept.
pub fn redact_secrets(id: &InventoryEntry, before: &mut Value, after: &mut Value) {
    if !is_secret(id) {
        return;
    }
    for field in ["data", "stringData"] {
        let old = before.get(field).and_then(Value::as_object).cloned();
        let new = after.get(field).and_then(Value::as_object).cloned();
        let masked = |own: &Option<Map<String, Value>>, other: &Option<Map<String, Value>>, tag| {
            own.as_ref().map(|own| {
                own.iter()
                    .map(|(key, value)| {
                        let same = other.as_ref().and_then(|o| o.get(key)) == Some(value);
                        let shown = if same {
                            REDACTED.to_owned()
                        } else {
                            format!("{REDACTED} ({tag})")
                        };
                        (key.clone(), Value::String(shown))
                    })
                    .collect::<Map<String, Value>>()
            })
        };
        let (old_masked, new_masked) = (masked(&old, &new, "before"), masked(&new, &old, "after"));
        if let (Some(masked), Some(map)) = (old_masked, before.as_object_mut()) {
            map.insert(field.into(), Value::Object(masked));
        }
        if let (Some(masked), Some(map)) = (new_masked, after.as_object_mut()) {
            map.insert(field.into(), Value::Object(masked));
        }
    }
}

/// The fields that differ between `before` and `after`, as JSON pointers: objects are compared
/// key by key, lists of the same length item by item, anything else (and lists whose length
/// changes) as a whole.
pub fn field_changes(before: &Value, after: &Value) -> Vec<FieldChange> {
    let mut changes = Vec::new();
    compare("", Some(before), Some(after), &mut changes);
    changes
}

fn compare(path: &str, before: Option<&Value>, after: Option<&Value>, out: &mut Vec<FieldChange>) {
    match (before, after) {
        (Some(Value::Object(old)), Some(Value::Object(new))) => {
            let keys = old
                .keys()
                .chain(new.keys().filter(|k| !old.contains_key(*k)));
            for key in keys {
                let child = format!("{path}/{}", escape(key));
                compare(&child, old.get(key), new.get(key), out);
            }
        }
        (Some(Value::Array(old)), Some(Value::Array(new))) if old.len() == new.len() => {
            for (i, (old, new)) in old.iter().zip(new).enumerate() {
                compare(&format!("{path}/{i}"), Some(old), Some(new), out);
            }
        }
        (old, new) if old != new => out.push(FieldChange {
            path: if path.is_empty() {
                "/".into()
            } else {
                path.into()
            },
            before: old.cloned(),
            after: new.cloned(),
        }),
        _ => {}
    }
}

/// A key as a JSON pointer token (RFC 6901: `~` → `~0`, `/` → `~1`).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// What a pass would do to an existing object: `live` as stored, `applied` as the dry-run apply
/// returned it; `None` when nothing would change.
pub fn object_change(id: &InventoryEntry, live: &Value, applied: &Value) -> Option<ObjectChange> {
    let (mut before, mut after) = (without_noise(live), without_noise(applied));
    redact_secrets(id, &mut before, &mut after);
    let fields = field_changes(&before, &after);
    (!fields.is_empty()).then_some(ObjectChange::Update { fields })
}

/// The hooks that the run `run` still has to run, in order: the rest of its current phase and
/// the phases after it (a run that is done or failed runs none).
pub fn hooks_to_run(hooks: &[Hook], run: &HookRun) -> Vec<HookToRun> {
    let pending = |phase| super::hooks::event(run.operation, phase);
    let phases: &[HookRunPhase] = match run.phase {
        HookRunPhase::PreHooks => &[HookRunPhase::PreHooks, HookRunPhase::PostHooks],
        HookRunPhase::Objects | HookRunPhase::PostHooks => &[HookRunPhase::PostHooks],
        HookRunPhase::Done | HookRunPhase::Failed => &[],
    };
    let mut out = Vec::new();
    for &phase in phases {
        let Some(event) = pending(phase) else {
            continue;
        };
        let current = phase == run.phase;
        out.extend(
            hooks
                .iter()
                .filter(|h| h.runs_on(event))
                .filter(|h| !(current && run.completed.contains(&h.object.id)))
                .map(|h| HookToRun {
                    event: event.as_str(),
                    object: h.object.id.clone(),
                }),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::HookOperation;
    use crate::plan::{HookEvent, RenderedObject};
    use serde_json::json;

    fn id(kind: &str, name: &str) -> InventoryEntry {
        InventoryEntry {
            group: String::new(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: "apps".into(),
            name: name.into(),
        }
    }

    fn live(data: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web", "namespace": "apps", "resourceVersion": "41",
                "uid": "u-1", "generation": 3, "creationTimestamp": "2026-12-01T00:00:00Z",
                "managedFields": [{"manager": "module-manager"}], "labels": {"a": "1"}},
            "data": data,
            "status": {"phase": "x"},
        })
    }

    #[test]
    fn bookkeeping_alone_is_no_change() {
        let before = live(json!({"greeting": "hi"}));
        let mut after = live(json!({"greeting": "hi"}));
        after["metadata"]["resourceVersion"] = json!("42");
        after["metadata"]["managedFields"] = json!([{"manager": "module-manager", "time": "t"}]);
        after["metadata"]["generation"] = json!(4);
        after["status"] = json!({"phase": "y"});
        assert_eq!(
            object_change(&id("ConfigMap", "web"), &before, &after),
            None
        );
    }

    #[test]
    fn changed_added_and_removed_fields_are_listed_by_pointer() {
        let before = live(json!({"greeting": "hi", "old": "x", "a/b": "1"}));
        let mut after = live(json!({"greeting": "hello", "new": "y", "a/b": "1"}));
        after["metadata"]["labels"]["a"] = json!("2");
        let Some(ObjectChange::Update { fields }) =
            object_change(&id("ConfigMap", "web"), &before, &after)
        else {
            panic!("an update");
        };
        let shown: Vec<(&str, Option<&Value>, Option<&Value>)> = fields
            .iter()
            .map(|f| (f.path.as_str(), f.before.as_ref(), f.after.as_ref()))
            .collect();
        assert_eq!(
            shown,
            [
                ("/data/greeting", Some(&json!("hi")), Some(&json!("hello"))),
                ("/data/old", Some(&json!("x")), None),
                ("/data/new", None, Some(&json!("y"))),
                ("/metadata/labels/a", Some(&json!("1")), Some(&json!("2"))),
            ]
        );
        // Pointer escaping, and a list item compared by index.
        let before = json!({"m": {"a/b~c": [1, 2, 3]}});
        let after = json!({"m": {"a/b~c": [1, 5, 3]}});
        assert_eq!(field_changes(&before, &after)[0].path, "/m/a~1b~0c/1");
        // A list that changes length is one change.
        let after = json!({"m": {"a/b~c": [1, 2]}});
        let changes = field_changes(&before, &after);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].after, Some(json!([1, 2])));
    }

    #[test]
    fn secret_values_never_show_only_which_keys_change() {
        let secret = |data: Value| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": data});
        let before = secret(json!({"same": "c2FtZQ==", "changed": "b2xk", "gone": "eA=="}));
        let after = secret(json!({"same": "c2FtZQ==", "changed": "bmV3", "added": "eQ=="}));
        let change = object_change(&id("Secret", "s"), &before, &after).unwrap();
        let text = serde_json::to_string(&change).unwrap();
        for value in ["c2FtZQ==", "b2xk", "bmV3", "eA==", "eQ=="] {
            assert!(!text.contains(value), "{value} leaked: {text}");
        }
        let ObjectChange::Update { fields } = change else {
            panic!("an update")
        };
        let paths: Vec<&str> = fields.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["/data/changed", "/data/gone", "/data/added"]);
        assert_eq!(fields[0].before, Some(json!("*** (before)")));
        assert_eq!(fields[0].after, Some(json!("*** (after)")));
        // A ConfigMap's data is shown as it is.
        let config = object_change(&id("ConfigMap", "s"), &before, &after).unwrap();
        assert!(serde_json::to_string(&config).unwrap().contains("bmV3"));
    }

    fn hook(name: &str, events: &[HookEvent]) -> Hook {
        Hook {
            object: RenderedObject {
                id: InventoryEntry {
                    group: "batch".into(),
                    kind: "Job".into(),
                    ..id("Job", name)
                },
                body: json!({}),
            },
            events: events.to_vec(),
            weight: 0,
            delete_policies: vec![],
            timeout: None,
        }
    }

    #[test]
    fn hooks_still_to_run_follow_the_run() {
        let hooks = [
            hook("migrate", &[HookEvent::PreUpgrade]),
            hook("seed", &[HookEvent::PreUpgrade, HookEvent::PreInstall]),
            hook("notify", &[HookEvent::PostUpgrade]),
        ];
        let run = |phase, completed: &[&str]| HookRun {
            operation: HookOperation::Upgrade,
            inputs_digest: String::new(),
            generation: None,
            id: "r".into(),
            phase,
            completed: completed
                .iter()
                .map(|n| {
                    hooks
                        .iter()
                        .find(|h| h.object.id.name == *n)
                        .unwrap()
                        .object
                        .id
                        .clone()
                })
                .collect(),
            running: None,
            message: None,
        };
        let names = |run: HookRun| -> Vec<String> {
            hooks_to_run(&hooks, &run)
                .into_iter()
                .map(|h| format!("{} {}", h.event, h.object.name))
                .collect()
        };
        assert_eq!(
            names(run(HookRunPhase::PreHooks, &[])),
            [
                "pre-upgrade migrate",
                "pre-upgrade seed",
                "post-upgrade notify"
            ]
        );
        assert_eq!(
            names(run(HookRunPhase::PreHooks, &["migrate"])),
            ["pre-upgrade seed", "post-upgrade notify"]
        );
        assert_eq!(
            names(run(HookRunPhase::Objects, &[])),
            ["post-upgrade notify"]
        );
        assert!(names(run(HookRunPhase::Done, &[])).is_empty());
        assert!(names(run(HookRunPhase::Failed, &[])).is_empty());
        let install = HookRun {
            operation: HookOperation::Install,
            ..run(HookRunPhase::PreHooks, &[])
        };
        assert_eq!(names(install), ["pre-install seed"]);
    }

    #[test]
    fn a_diff_has_changes_when_anything_would_happen() {
        let mut diff = Diff::default();
        assert!(!diff.has_changes());
        diff.prune.push(id("ConfigMap", "old"));
        assert!(diff.has_changes());
    }
}
