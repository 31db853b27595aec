//! Dependencies (pure): which of a Manifest's `spec.dependsOn` keep it waiting and why, cycles
//! among them, which dependents keep a dependency from being deleted, and which of a
//! dependency's changes wake its dependents.
//!
//! A dependency is ready when its `Ready` condition is `True` for its current generation
//! (`observedGeneration == metadata.generation`: kstatus's rule, as Flux's `dependsOn` reads
//! it), and it is not being deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kube::{Resource, ResourceExt};

use crate::api::Manifest;

/// A Manifest named by `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DependencyKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl DependencyKey {
    /// The key of `manifest` itself.
    pub fn of(manifest: &Manifest) -> Self {
        Self {
            namespace: manifest.namespace().unwrap_or_default(),
            name: manifest.name_any(),
        }
    }
}

impl fmt::Display for DependencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The Manifests `manifest` depends on, in the order its `spec.dependsOn` names them, each once;
/// a reference without a namespace is in the Manifest's own.
pub fn dependencies(manifest: &Manifest) -> Vec<DependencyKey> {
    let own = manifest.namespace().unwrap_or_default();
    let mut seen = BTreeSet::new();
    manifest
        .spec
        .depends_on
        .iter()
        .map(|d| DependencyKey {
            namespace: d.namespace.clone().unwrap_or_else(|| own.clone()),
            name: d.name.clone(),
        })
        .filter(|key| seen.insert(key.clone()))
        .collect()
}

/// Why a dependency cannot be waited for: the pass stops with a permanent error (`Stalled`)
/// until the spec changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DependencyError {
    /// the dependencies form a cycle: none of them can ever become ready.
    #[error("dependency cycle: {0} (remove one of these dependsOn)")]
    Cycle(String),
    /// the dependency is in another namespace, which the operator's flags refuse.
    #[error(
        "dependency {0} is in another namespace, and this operator refuses those (--cross-namespace-dependencies=false, the default in impersonation mode)"
    )]
    CrossNamespace(DependencyKey),
}

impl DependencyError {
    /// The static category: the Ready reason, the Event reason and the metric label.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Cycle(_) => "DependencyCycle",
            Self::CrossNamespace(_) => "DependencyRefused",
        }
    }
}

/// The first dependency of `manifest` outside its own namespace, refused when cross-namespace
/// dependencies are not `allowed`.
pub fn check_namespaces(manifest: &Manifest, allowed: bool) -> Result<(), DependencyError> {
    let own = manifest.namespace().unwrap_or_default();
    match dependencies(manifest)
        .into_iter()
        .find(|d| d.namespace != own)
    {
        Some(other) if !allowed => Err(DependencyError::CrossNamespace(other)),
        _ => Ok(()),
    }
}

/// Where a dependency stands, as a dependent sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// `Ready=True` at its current generation.
    Ready,
    /// No such Manifest.
    Missing,
    /// It is being deleted.
    Deleting,
    /// `Ready` is not `True` (or there is no status yet): its reason, if any.
    NotReady(Option<String>),
    /// `Ready=True`, but for an older generation than its spec's: its new spec is not applied.
    Stale {
        /// The generation `Ready` was observed at.
        observed: Option<i64>,
        /// The Manifest's generation.
        generation: Option<i64>,
    },
}

impl Standing {
    /// How `dependency` (`None`: not found) stands.
    pub fn of(dependency: Option<&Manifest>) -> Self {
        let Some(dependency) = dependency else {
            return Self::Missing;
        };
        if dependency.meta().deletion_timestamp.is_some() {
            return Self::Deleting;
        }
        let ready = dependency
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
        let generation = dependency.meta().generation;
        match ready {
            Some(c) if c.status == "True" && c.observed_generation == generation => Self::Ready,
            Some(c) if c.status == "True" => Self::Stale {
                observed: c.observed_generation,
                generation,
            },
            Some(c) => Self::NotReady(Some(c.reason.clone()).filter(|r| !r.is_empty())),
            None => Self::NotReady(None),
        }
    }

    /// Why it keeps a dependent waiting, for the status message.
    fn describe(&self) -> String {
        let generation = |g: &Option<i64>| g.map_or_else(|| "?".to_owned(), |g| g.to_string());
        match self {
            Self::Ready => "Ready".to_owned(),
            Self::Missing => "not found".to_owned(),
            Self::Deleting => "being deleted".to_owned(),
            Self::NotReady(Some(reason)) => format!("not Ready ({reason})"),
            Self::NotReady(None) => "not Ready (no status yet)".to_owned(),
            Self::Stale {
                observed,
                generation: now,
            } => format!(
                "Ready for generation {} but its spec is at generation {} (not applied yet)",
                generation(observed),
                generation(now)
            ),
        }
    }
}

/// The message of a Manifest waiting for its dependencies, naming every one that is not ready
/// and why; `None` when all are ready.
pub fn waiting_message(standings: &[(DependencyKey, Standing)]) -> Option<String> {
    let waiting: Vec<String> = standings
        .iter()
        .filter(|(_, standing)| *standing != Standing::Ready)
        .map(|(key, standing)| format!("dependency {key} is {}", standing.describe()))
        .collect();
    (!waiting.is_empty()).then(|| format!("waiting: {}", waiting.join("; ")))
}

/// A cycle through `start` in `graph` (each Manifest's dependencies, as far as they were read),
/// as the path `start → … → start`; `None` when there is none. A Manifest depending on itself is
/// the cycle `start → start`.
pub fn find_cycle(
    start: &DependencyKey,
    graph: &BTreeMap<DependencyKey, Vec<DependencyKey>>,
) -> Option<Vec<DependencyKey>> {
    // Depth-first with an explicit stack of (node, index of the next edge to follow).
    let mut path = vec![start.clone()];
    let mut next_edge = vec![0usize];
    let mut visited = BTreeSet::new();
    while let Some(node) = path.last().cloned() {
        let edges = graph.get(&node).map_or(&[][..], Vec::as_slice);
        let index = next_edge.last_mut()?;
        let Some(target) = edges.get(*index) else {
            path.pop();
            next_edge.pop();
            continue;
        };
        *index += 1;
        if target == start {
            path.push(target.clone());
            return Some(path);
        }
        if visited.insert(target.clone()) {
            path.push(target.clone());
            next_edge.push(0);
        }
    }
    None
}

/// A cycle as the status shows it: `a/x → a/y → a/x`.
pub fn describe_cycle(cycle: &[DependencyKey]) -> String {
    let names: Vec<String> = cycle.iter().map(ToString::to_string).collect();
    names.join(" → ")
}

/// The dependents among `candidates` that keep `dependency` from being deleted: those of its
/// own namespace (a tenant's Manifest never holds another namespace's) that name it in
/// `spec.dependsOn` and have installed something (an inventory or hook objects; one that
/// never installed anything needs nothing of it, so two Manifests of a cycle, which never
/// install, do not keep each other), but not `dependency` itself, nor a dependent that is being
/// deleted too and that `dependency` itself depends on (a cycle of two that installed before it
/// was closed: each would wait for the other for good). Sorted.
pub fn holding_dependents<'a>(
    dependency: &Manifest,
    candidates: impl IntoIterator<Item = &'a Manifest>,
) -> Vec<DependencyKey> {
    let key = DependencyKey::of(dependency);
    let own = dependencies(dependency);
    let in_cycle_and_going =
        |m: &Manifest| m.meta().deletion_timestamp.is_some() && own.contains(&DependencyKey::of(m));
    let mut holding: Vec<DependencyKey> = candidates
        .into_iter()
        .filter(|m| DependencyKey::of(m) != key)
        .filter(|m| m.metadata.namespace == dependency.metadata.namespace)
        .filter(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| !s.inventory.is_empty() || !s.hook_objects.is_empty())
        })
        .filter(|m| dependencies(m).contains(&key))
        .filter(|m| !in_cycle_and_going(m))
        .map(DependencyKey::of)
        .collect();
    holding.sort();
    holding.dedup();
    holding
}

/// What of a depended-on Manifest its dependents wait for: a change of it wakes them. Status
/// writes that change none of it (messages, digests, the inventory) do not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signal {
    uid: Option<String>,
    generation: Option<i64>,
    standing: Standing,
}

impl Signal {
    /// The signal of `manifest`.
    pub fn of(manifest: &Manifest) -> Self {
        let standing = match Standing::of(Some(manifest)) {
            // The reason of a dependency that is not ready does not matter to its dependents.
            Standing::NotReady(_) => Standing::NotReady(None),
            other => other,
        };
        Self {
            uid: manifest.uid(),
            generation: manifest.meta().generation,
            standing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn manifest(namespace: &str, name: &str, depends_on: Value, status: Value) -> Manifest {
        serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": name, "namespace": namespace, "generation": 2, "uid": name},
            "spec": {"module": name, "chart": {"path": "p"}, "dependsOn": depends_on},
            "status": status,
        }))
        .unwrap()
    }

    fn key(namespace: &str, name: &str) -> DependencyKey {
        DependencyKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn ready_at(generation: i64) -> Value {
        json!({"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
            "observedGeneration": generation, "lastTransitionTime": "2026-12-01T00:00:00Z"}]})
    }

    #[test]
    fn dependencies_default_to_the_own_namespace_each_once() {
        let m = manifest(
            "a",
            "x",
            json!([{"name": "db"}, {"name": "db", "namespace": "a"}, {"name": "q", "namespace": "b"}]),
            json!({}),
        );
        assert_eq!(dependencies(&m), [key("a", "db"), key("b", "q")]);
        assert_eq!(
            check_namespaces(&m, false),
            Err(DependencyError::CrossNamespace(key("b", "q")))
        );
        assert_eq!(check_namespaces(&m, true), Ok(()));
        let local = manifest("a", "y", json!([{"name": "db"}]), json!({}));
        assert_eq!(check_namespaces(&local, false), Ok(()));
    }

    #[test]
    fn a_dependency_is_ready_only_at_its_current_generation() {
        let of = |status: Value| Standing::of(Some(&manifest("a", "db", json!([]), status)));
        assert_eq!(of(ready_at(2)), Standing::Ready);
        assert_eq!(
            of(ready_at(1)),
            Standing::Stale {
                observed: Some(1),
                generation: Some(2)
            }
        );
        assert_eq!(of(json!({})), Standing::NotReady(None));
        let progressing = json!({"conditions": [{"type": "Ready", "status": "False",
            "reason": "Progressing", "message": "", "observedGeneration": 2,
            "lastTransitionTime": "2026-12-01T00:00:00Z"}]});
        assert_eq!(
            of(progressing),
            Standing::NotReady(Some("Progressing".into()))
        );
        assert_eq!(Standing::of(None), Standing::Missing);
        let mut deleting = manifest("a", "db", json!([]), ready_at(2));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(Standing::of(Some(&deleting)), Standing::Deleting);
    }

    #[test]
    fn the_message_names_each_dependency_that_blocks_and_why() {
        let standings = [
            (key("a", "ok"), Standing::Ready),
            (key("a", "gone"), Standing::Missing),
            (
                key("b", "old"),
                Standing::Stale {
                    observed: Some(1),
                    generation: Some(3),
                },
            ),
            (
                key("a", "slow"),
                Standing::NotReady(Some("Progressing".into())),
            ),
        ];
        let message = waiting_message(&standings).unwrap();
        assert_eq!(
            message,
            "waiting: dependency a/gone is not found; dependency b/old is Ready for generation 1 \
             but its spec is at generation 3 (not applied yet); dependency a/slow is not Ready \
             (Progressing)"
        );
        assert_eq!(waiting_message(&standings[..1]), None, "all ready");
        assert_eq!(waiting_message(&[]), None);
    }

    #[test]
    fn cycles_are_found_through_the_start_only() {
        let graph = |edges: &[(&str, &[&str])]| -> BTreeMap<DependencyKey, Vec<DependencyKey>> {
            edges
                .iter()
                .map(|(from, to)| (key("n", from), to.iter().map(|t| key("n", t)).collect()))
                .collect()
        };
        let names = |cycle: Option<Vec<DependencyKey>>| {
            cycle.map(|c| c.into_iter().map(|k| k.name).collect::<Vec<_>>())
        };
        let two = graph(&[("a", &["b"]), ("b", &["a"])]);
        assert_eq!(
            names(find_cycle(&key("n", "a"), &two)).unwrap(),
            ["a", "b", "a"]
        );
        let own = graph(&[("a", &["a"])]);
        assert_eq!(names(find_cycle(&key("n", "a"), &own)).unwrap(), ["a", "a"]);
        let long = graph(&[
            ("a", &["x", "b"]),
            ("x", &[]),
            ("b", &["c"]),
            ("c", &["d", "a"]),
        ]);
        assert_eq!(
            names(find_cycle(&key("n", "a"), &long)).unwrap(),
            ["a", "b", "c", "a"]
        );
        // A diamond is no cycle; a cycle that does not pass through the start is not this
        // Manifest's (its members report it), and the walk ends.
        let diamond = graph(&[("a", &["b", "c"]), ("b", &["d"]), ("c", &["d"]), ("d", &[])]);
        assert_eq!(find_cycle(&key("n", "a"), &diamond), None);
        let elsewhere = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["b"])]);
        assert_eq!(find_cycle(&key("n", "a"), &elsewhere), None);
        assert_eq!(
            describe_cycle(&[key("n", "a"), key("m", "b"), key("n", "a")]),
            "n/a → m/b → n/a"
        );
    }

    #[test]
    fn only_dependents_of_its_namespace_that_installed_something_hold_a_deletion() {
        let installed = json!({"inventory": [{"group": "", "version": "v1", "kind": "ConfigMap",
            "namespace": "a", "name": "c"}]});
        let db = key("a", "db");
        let candidates = [
            manifest("a", "app", json!([{"name": "db"}]), installed.clone()),
            manifest("a", "api", json!([{"name": "db"}]), installed.clone()),
            manifest(
                "b",
                "other",
                json!([{"name": "db", "namespace": "a"}]),
                installed.clone(),
            ),
            manifest("a", "waiting", json!([{"name": "db"}]), json!({})),
            manifest(
                "a",
                "unrelated",
                json!([{"name": "cache"}]),
                installed.clone(),
            ),
            manifest("a", "db", json!([{"name": "db"}]), installed.clone()),
        ];
        let dependency = manifest("a", "db", json!([{"name": "app"}]), installed.clone());
        assert_eq!(DependencyKey::of(&dependency), db);
        // b/other installed something and depends on a/db, but is another tenant's: it never
        // holds a/db's deletion.
        assert_eq!(
            holding_dependents(&dependency, &candidates),
            [key("a", "api"), key("a", "app")]
        );
        // A cycle of two that installed before it closed, both being deleted: app (which db
        // depends on) no longer holds db; api still does.
        let mut going = candidates.clone();
        going[0].metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(holding_dependents(&dependency, &going), [key("a", "api")]);
        // A dependent being deleted that db does not depend on still holds it.
        let plain = manifest("a", "db", json!([]), installed);
        assert_eq!(
            holding_dependents(&plain, &going),
            [key("a", "api"), key("a", "app")]
        );
    }

    #[test]
    fn a_signal_changes_with_readiness_and_generation_not_with_messages() {
        let with = |status: Value| Signal::of(&manifest("a", "db", json!([]), status));
        let not_ready = |reason: &str| {
            json!({"conditions": [{"type": "Ready", "status": "False", "reason": reason,
                "message": reason, "observedGeneration": 2,
                "lastTransitionTime": "2026-12-01T00:00:00Z"}]})
        };
        assert_eq!(
            with(not_ready("Progressing")),
            with(not_ready("HookRunning"))
        );
        assert_ne!(with(not_ready("Progressing")), with(ready_at(2)));
        assert_ne!(with(ready_at(1)), with(ready_at(2)));
        let mut later = manifest("a", "db", json!([]), ready_at(2));
        later.metadata.generation = Some(3);
        assert_ne!(Signal::of(&later), with(ready_at(2)), "a new spec");
    }
}
