//! Plan (pure): split rendered documents into CRDs, hooks and objects, order them as Helm
//! installs them, give namespaced objects their namespace, and decide what to prune.

pub mod applied_stamps;
pub mod deletion_pace;
pub mod dependencies;
pub mod diff;
pub mod drift;
pub mod drift_report;
pub mod history;
pub mod hooks;
pub mod ownership;
pub mod readiness;
pub mod rollout;
pub mod status;
pub mod tenancy;
pub mod trigger;
pub mod unchanged;

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::Value;

use crate::api::InventoryEntry;

/// An object `x` of `group`/`kind` (version `v1`) in namespace `ns`, for tests.
#[cfg(test)]
pub(crate) fn test_object(group: &str, kind: &str) -> InventoryEntry {
    InventoryEntry {
        group: group.into(),
        version: "v1".into(),
        kind: kind.into(),
        namespace: "ns".into(),
        name: "x".into(),
    }
}

/// Helm's install order by kind (`helm.sh/helm/v4/pkg/release/v1/util/kind_sorter.go`).
/// Kinds not listed come after these, ordered by name. Deletion and pruning use the reverse.
const INSTALL_ORDER: &[&str] = &[
    "PriorityClass",
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "SecretList",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleList",
    "ClusterRoleBinding",
    "ClusterRoleBindingList",
    "Role",
    "RoleList",
    "RoleBinding",
    "RoleBindingList",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
];

/// Errors in the rendered documents themselves (a chart bug, not a cluster problem).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    /// a document is not valid YAML.
    #[error("rendered output{} is not valid YAML: {error}", from_template(template.as_deref()))]
    Yaml {
        /// The template it came from (helm's `# Source:` line), if named.
        template: Option<String>,
        /// The parser's message.
        error: String,
    },
    /// the rendered output holds YAML anchors or aliases (refused before decoding: their
    /// expansion is unbounded in bytes), or nests deeper than the decoder reads.
    #[error("rendered output{}: {refusal}", from_template(template.as_deref()))]
    Aliases {
        /// The template it came from (helm's `# Source:` line), if named.
        template: Option<String>,
        /// What was refused, and where.
        #[source]
        refusal: crate::source::yaml::YamlRefusal,
    },
    /// the rendered output holds more YAML nodes than a render may (its decoded form would take
    /// many times the output's bytes in memory).
    #[error(
        "the rendered output has more than {max} YAML nodes (maps, lists and values), the most a render may have: one per {BYTES_PER_NODE} bytes of the output cap"
    )]
    TooManyNodes {
        /// The most a render may have.
        max: usize,
    },
    /// a document is not a Kubernetes object.
    #[error("rendered document {}is not a Kubernetes object: {reason}", match template {
        Some(template) => format!("from {template} "),
        None => format!("{index} "),
    })]
    NotAnObject {
        /// Position of the document in the output, from 0.
        index: usize,
        /// The template it came from (helm's `# Source:` line), if named.
        template: Option<String>,
        /// What is missing.
        reason: &'static str,
    },
    /// two documents describe the same object.
    #[error("{0} is rendered twice")]
    Duplicate(String),
    /// a hook annotation could not be read.
    #[error("{object}: invalid {annotation} {value:?}: {expected}")]
    HookAnnotation {
        /// The hook object.
        object: String,
        /// The annotation.
        annotation: &'static str,
        /// Its value.
        value: String,
        /// What it may hold.
        expected: &'static str,
    },
    /// the render has more objects (CRDs, objects and hooks) than the cap.
    #[error(
        "the render has {count} objects, more than the limit of {max} per render (--max-objects-per-render)"
    )]
    TooManyObjects {
        /// Objects rendered.
        count: usize,
        /// The cap.
        max: usize,
    },
    /// the inventory and hook objects recorded in the status would be too large for one
    /// Kubernetes object (etcd refuses objects over 1.5 MiB).
    #[error(
        "the inventory would take about {bytes} bytes of the Manifest's status, more than the limit of {max} (--max-inventory-bytes; etcd refuses objects over 1.5 MiB)"
    )]
    InventoryTooLarge {
        /// Estimated bytes.
        bytes: usize,
        /// The cap.
        max: usize,
    },
    /// the API server does not serve the object's kind.
    #[error("{0}: the target cluster does not serve this kind")]
    UnknownKind(String),
    /// a `spec.driftIgnore` rule names a path that is not a usable JSON pointer.
    #[error("spec.driftIgnore[{rule}]: invalid path {path:?}: {reason}")]
    DriftIgnore {
        /// The rule's position in `spec.driftIgnore`, from 0.
        rule: usize,
        /// The path as written.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `spec.drift.overrideManagers` (with `--drift-override-managers`) names a manager that
    /// cannot be overridden.
    #[error("spec.drift.overrideManagers: {name:?}: {reason}")]
    OverrideManager {
        /// The manager, as written.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
}

/// One object of a render.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedObject {
    /// Identity: group, version, kind, namespace (filled in by [`assign_namespaces`]), name.
    pub id: InventoryEntry,
    /// The object as JSON, as it is applied.
    pub body: Value,
}

/// The Helm annotation that makes an object a hook: comma-separated events.
pub const HOOK_ANNOTATION: &str = "helm.sh/hook";
/// The hook's weight (an integer string; lower runs first; default 0).
pub const HOOK_WEIGHT_ANNOTATION: &str = "helm.sh/hook-weight";
/// The hook's delete policies (comma-separated; default `before-hook-creation`).
pub const HOOK_DELETE_POLICY_ANNOTATION: &str = "helm.sh/hook-delete-policy";
/// module-manager's own: how long a hook may run (`90s`, `10m`, `1h`) before it counts as failed.
pub const HOOK_TIMEOUT_ANNOTATION: &str = "modulemanager.io/hook-timeout";

/// When a hook runs (`helm.sh/hook`). Rollback hooks are accepted and never run: module-manager
/// does not roll back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookEvent {
    /// Before the objects of a first install are applied.
    PreInstall,
    /// After the objects of a first install are ready.
    PostInstall,
    /// Before the objects of an upgrade are applied.
    PreUpgrade,
    /// After the objects of an upgrade are ready.
    PostUpgrade,
    /// Before the objects are deleted.
    PreDelete,
    /// After the objects are gone.
    PostDelete,
    /// Helm's rollback (never run).
    PreRollback,
    /// Helm's rollback (never run).
    PostRollback,
}

impl HookEvent {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PreInstall => "pre-install",
            Self::PostInstall => "post-install",
            Self::PreUpgrade => "pre-upgrade",
            Self::PostUpgrade => "post-upgrade",
            Self::PreDelete => "pre-delete",
            Self::PostDelete => "post-delete",
            Self::PreRollback => "pre-rollback",
            Self::PostRollback => "post-rollback",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [
            Self::PreInstall,
            Self::PostInstall,
            Self::PreUpgrade,
            Self::PostUpgrade,
            Self::PreDelete,
            Self::PostDelete,
            Self::PreRollback,
            Self::PostRollback,
        ]
        .into_iter()
        .find(|e| e.as_str() == text)
    }
}

/// When a hook object is deleted (`helm.sh/hook-delete-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeletePolicy {
    /// The previous instance is deleted (and waited for) before the hook runs again.
    BeforeHookCreation,
    /// Deleted once every hook of its phase succeeded.
    HookSucceeded,
    /// Deleted when it fails.
    HookFailed,
}

impl DeletePolicy {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "before-hook-creation" => Some(Self::BeforeHookCreation),
            "hook-succeeded" => Some(Self::HookSucceeded),
            "hook-failed" => Some(Self::HookFailed),
            _ => None,
        }
    }
}

/// A Helm hook (a migration step) and when it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Hook {
    /// The hook object.
    pub object: RenderedObject,
    /// Events it runs on.
    pub events: Vec<HookEvent>,
    /// `helm.sh/hook-weight`: lower runs first.
    pub weight: i64,
    /// `helm.sh/hook-delete-policy`; `[BeforeHookCreation]` when the annotation is absent or
    /// empty, as in Helm.
    pub delete_policies: Vec<DeletePolicy>,
    /// `modulemanager.io/hook-timeout`, if set.
    pub timeout: Option<std::time::Duration>,
}

impl Hook {
    /// Whether the hook has this delete policy.
    pub fn has_policy(&self, policy: DeletePolicy) -> bool {
        self.delete_policies.contains(&policy)
    }

    /// Whether the hook runs on this event.
    pub fn runs_on(&self, event: HookEvent) -> bool {
        self.events.contains(&event)
    }
}

/// A render split and ordered for applying.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// CustomResourceDefinitions: applied first, and waited for.
    pub crds: Vec<RenderedObject>,
    /// Every other non-hook object, in Helm's install order.
    pub objects: Vec<RenderedObject>,
    /// Hooks, ordered by weight, then kind order, then name. Not part of the inventory.
    pub hooks: Vec<Hook>,
}

/// Caps on one render: checked before anything of it is recorded or applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanLimits {
    /// Most objects (CRDs, objects, hooks) in one render.
    pub max_objects: usize,
    /// Most bytes the inventory and hook objects may take in the status (as JSON, the way the
    /// API server stores a custom resource): well under etcd's 1.5 MiB per object, which also
    /// holds the spec, the conditions and `managedFields`.
    pub max_inventory_bytes: usize,
}

impl Default for PlanLimits {
    fn default() -> Self {
        Self {
            max_objects: 5_000,
            max_inventory_bytes: 1024 * 1024,
        }
    }
}

/// The bytes of `status.inventoryUids` for these objects, and of `status.appliedStamps` when
/// `stamped` (a remote target), less their braces: `"<key>":"<uid>",` and `"<key>":"<stamp>",`
/// each (a UID is 36 characters, a stamp 16).
fn uid_bytes<'e>(objects: impl Iterator<Item = &'e InventoryEntry>, stamped: bool) -> usize {
    let keys: BTreeSet<String> = objects.map(ownership::uid_key).collect();
    let stamp = |key: &String| if stamped { key.len() + 22 } else { 0 };
    keys.iter().map(|key| key.len() + 42 + stamp(key)).sum()
}

/// Refuses a plan over `limits`: too many objects, or an inventory that, with the entries
/// `previous` lists (kept until pruned) and the hook objects, would be too large for the
/// status. The estimate is the entries' JSON, as the status carries them, and the objects' UIDs
/// (`status.inventoryUids`, not for hooks) and, when `stamped` (a remote target), their stamps
/// (`status.appliedStamps`).
pub fn check_limits(
    plan: &Plan,
    previous: &[InventoryEntry],
    previous_hooks: &[InventoryEntry],
    limits: PlanLimits,
    stamped: bool,
) -> Result<(), PlanError> {
    let count = plan.crds.len() + plan.objects.len() + plan.hooks.len();
    if count > limits.max_objects {
        return Err(PlanError::TooManyObjects {
            count,
            max: limits.max_objects,
        });
    }
    let recorded: BTreeSet<&InventoryEntry> = previous
        .iter()
        .chain(previous_hooks)
        .chain(plan.applied().map(|o| &o.id))
        .chain(plan.hooks.iter().map(|h| &h.object.id))
        .collect();
    // `[e1,e2,…]`: each entry's JSON and a comma.
    let bytes = recorded
        .iter()
        .map(|e| serde_json::to_vec(e).map_or(0, |v| v.len() + 1))
        .sum::<usize>()
        + 1
        + uid_bytes(
            previous.iter().chain(plan.applied().map(|o| &o.id)),
            stamped,
        );
    if bytes > limits.max_inventory_bytes {
        return Err(PlanError::InventoryTooLarge {
            bytes,
            max: limits.max_inventory_bytes,
        });
    }
    Ok(())
}

impl Plan {
    /// CRDs and objects in install order: what the inventory records.
    pub fn applied(&self) -> impl Iterator<Item = &RenderedObject> {
        self.crds.iter().chain(&self.objects)
    }

    /// The inventory this plan produces once applied.
    pub fn inventory(&self) -> Vec<InventoryEntry> {
        self.applied().map(|o| o.id.clone()).collect()
    }
}

/// `n` and `noun` (a countable one, `"object"`, `"hook object"`) in the singular or plural:
/// "1 object", "2 objects" — the counts the status messages give.
pub fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Human-readable `kind/namespace/name` of an inventory entry.
pub fn describe(id: &InventoryEntry) -> String {
    if id.namespace.is_empty() {
        format!("{}/{}", id.kind, id.name)
    } else {
        format!("{}/{}/{}", id.kind, id.namespace, id.name)
    }
}

/// ` of <template>` when the template is known.
fn from_template(template: Option<&str>) -> String {
    template.map(|t| format!(" of {t}")).unwrap_or_default()
}

/// Parses `helm template` output (multi-document YAML) into objects, expanding `List` kinds and
/// skipping empty documents. A document that is not an object is named by the template it
/// came from: helm starts each with `# Source: <chart>/templates/<file>`.
pub fn parse_documents(yaml: &str) -> Result<Vec<RenderedObject>, PlanError> {
    parse_documents_within(yaml, usize::MAX)
}

/// Bytes of the output cap per YAML node a render may have. Decoded, a node takes about 100
/// bytes (a `serde_json::Value`, a map entry, its key) and the decoder's buffered events about
/// as much again while a document is decoded: 16 MiB of one-line keys (6 bytes a node, 2.75
/// million nodes) peaked at 537 MB, 32 times its bytes. At one node per 16 bytes of the cap a
/// render peaks at about 12 times the cap. The repository's charts render 10 to 17 bytes a
/// node, so a real render meets this cap only past ~10 MiB of output (at the default cap).
pub const BYTES_PER_NODE: usize = 16;

/// The most YAML nodes a render whose output is capped at `max_output` bytes may have.
pub fn max_nodes(max_output: usize) -> usize {
    max_output / BYTES_PER_NODE
}

/// [`parse_documents`] of a render that may hold at most `max_nodes` YAML nodes, counted
/// before anything is decoded.
pub fn parse_documents_within(
    yaml: &str,
    max_nodes: usize,
) -> Result<Vec<RenderedObject>, PlanError> {
    let mut objects = Vec::new();
    let mut index = 0;
    let mut nodes = 0usize;
    for chunk in split_documents(yaml) {
        if chunk.trim().is_empty() {
            continue;
        }
        let template = source_line(chunk);
        nodes = nodes.saturating_add(refuse_aliases(chunk, template)?);
        if nodes > max_nodes {
            return Err(PlanError::TooManyNodes { max: max_nodes });
        }
        let at = |index, reason| PlanError::NotAnObject {
            index,
            template: template.map(str::to_owned),
            reason,
        };
        for document in serde_yaml_ng::Deserializer::from_str(chunk) {
            let value = Value::deserialize(document).map_err(|e| PlanError::Yaml {
                template: template.map(str::to_owned),
                error: e.to_string(),
            })?;
            if value.is_null() {
                index += 1;
                continue;
            }
            if value
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List"))
                && let Some(items) = value.get("items").and_then(Value::as_array)
            {
                for item in items {
                    objects.push(object(item.clone()).map_err(|r| at(index, r))?);
                }
            } else {
                objects.push(object(value).map_err(|r| at(index, r))?);
            }
            index += 1;
        }
    }
    Ok(objects)
}

/// The documents of a YAML stream, split where helm splits its own output: at lines that are
/// `---` (or start with `--- `), which open a document.
fn split_documents(yaml: &str) -> Vec<&str> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in yaml.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if bare == "---" || bare.starts_with("--- ") {
            chunks.push(&yaml[start..offset]);
            // The rest of the marker line (`--- {a: b}`) belongs to the new document.
            start = offset + 3;
        }
        offset += line.len();
    }
    chunks.push(&yaml[start..]);
    chunks
}

/// Refuses YAML anchors and aliases in one document, before it is decoded (their expansion is
/// unbounded in bytes); line and column count from the document's start. Its nodes (at most).
fn refuse_aliases(document: &str, template: Option<&str>) -> Result<usize, PlanError> {
    use crate::source::yaml::YamlRefusal;
    let template = template.map(str::to_owned);
    crate::source::yaml::checked_nodes(document).map_err(|refusal| match refusal {
        YamlRefusal::Alias { .. } | YamlRefusal::TooDeep { .. } => {
            PlanError::Aliases { template, refusal }
        }
        YamlRefusal::Invalid {
            line,
            column,
            reason,
        } => PlanError::Yaml {
            template,
            error: format!("line {line}, column {column}: {reason}"),
        },
    })
}

/// The template named by a document's `# Source: ` comment line, if any.
fn source_line(document: &str) -> Option<&str> {
    document
        .lines()
        .find_map(|line| line.strip_prefix("# Source: "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The object of one document, or what it lacks.
fn object(body: Value) -> Result<RenderedObject, &'static str> {
    if !body.is_object() {
        return Err("not a mapping");
    }
    let api_version = body
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or("no apiVersion")?;
    let kind = body.get("kind").and_then(Value::as_str).ok_or("no kind")?;
    let metadata = body.get("metadata").ok_or("no metadata")?;
    let name = metadata
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("no metadata.name")?;
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    let namespace = metadata
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let id = InventoryEntry {
        group: group.to_owned(),
        version: version.to_owned(),
        kind: kind.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    Ok(RenderedObject { id, body })
}

/// Position of a kind in Helm's install order; unknown kinds sort after all known ones.
fn install_rank(kind: &str) -> (usize, &str) {
    match INSTALL_ORDER.iter().position(|k| *k == kind) {
        Some(i) => (i, ""),
        None => (INSTALL_ORDER.len(), kind),
    }
}

fn install_key(id: &InventoryEntry) -> ((usize, &str), &str, &str) {
    (install_rank(&id.kind), &id.namespace, &id.name)
}

fn is_crd(id: &InventoryEntry) -> bool {
    id.kind == "CustomResourceDefinition" && id.group == "apiextensions.k8s.io"
}

fn annotation<'a>(object: &'a RenderedObject, key: &str) -> Option<&'a str> {
    object
        .body
        .pointer("/metadata/annotations")?
        .get(key)?
        .as_str()
}

/// Splits objects into CRDs, hooks and the rest, each in the order they are applied.
/// Test hooks (`test`, `test-success`) are dropped, as `helm template --skip-tests` would. An
/// object whose `helm.sh/hook` names Helm 2's `crd-install` is applied as a plain object (a CRD
/// with the CRDs), as Argo CD does (Helm 3 skips it as an unknown hook).
pub fn plan(objects: Vec<RenderedObject>) -> Result<Plan, PlanError> {
    let mut seen = BTreeSet::new();
    let mut plan = Plan::default();
    for object in objects {
        if !seen.insert(object.id.clone()) {
            return Err(PlanError::Duplicate(describe(&object.id)));
        }
        let hook = match annotation(&object, HOOK_ANNOTATION) {
            Some(events) if !split_list(events).any(|e| e == "crd-install") => {
                let events: Vec<String> = split_list(events)
                    .filter(|e| !e.starts_with("test"))
                    .collect();
                if events.is_empty() {
                    continue; // only test hooks
                }
                Some(events)
            }
            _ => None,
        };
        if let Some(events) = hook {
            plan.hooks.push(hook_of(object, &events)?);
        } else if is_crd(&object.id) {
            plan.crds.push(object);
        } else {
            plan.objects.push(object);
        }
    }
    plan.crds.sort_by(|a, b| a.id.name.cmp(&b.id.name));
    plan.objects
        .sort_by(|a, b| install_key(&a.id).cmp(&install_key(&b.id)));
    // Helm's order (`pkg/action/hooks.go`, `hookByWeight`): weight, then kind in install order
    // (unknown kinds last, by kind), then name.
    plan.hooks.sort_by(|a, b| hook_key(a).cmp(&hook_key(b)));
    Ok(plan)
}

fn hook_key(hook: &Hook) -> (i64, (usize, &str), &str, &str) {
    let id = &hook.object.id;
    (hook.weight, install_rank(&id.kind), &id.name, &id.namespace)
}

/// Reads a hook's annotations.
fn hook_of(object: RenderedObject, events: &[String]) -> Result<Hook, PlanError> {
    let invalid = |annotation, value: &str, expected| PlanError::HookAnnotation {
        object: describe(&object.id),
        annotation,
        value: value.to_owned(),
        expected,
    };
    let events = events
        .iter()
        .map(|e| {
            HookEvent::parse(e).ok_or_else(|| invalid(
                HOOK_ANNOTATION,
                e,
                "pre-install, post-install, pre-upgrade, post-upgrade, pre-delete, post-delete, pre-rollback, post-rollback, test",
            ))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let weight = match annotation(&object, HOOK_WEIGHT_ANNOTATION) {
        None => 0,
        Some(w) => w
            .trim()
            .parse()
            .map_err(|_| invalid(HOOK_WEIGHT_ANNOTATION, w, "an integer"))?,
    };
    let mut delete_policies = Vec::new();
    for policy in annotation(&object, HOOK_DELETE_POLICY_ANNOTATION)
        .map(split_list)
        .into_iter()
        .flatten()
    {
        delete_policies.push(DeletePolicy::parse(&policy).ok_or_else(|| {
            invalid(
                HOOK_DELETE_POLICY_ANNOTATION,
                &policy,
                "before-hook-creation, hook-succeeded, hook-failed",
            )
        })?);
    }
    if delete_policies.is_empty() {
        delete_policies.push(DeletePolicy::BeforeHookCreation);
    }
    let timeout = match annotation(&object, HOOK_TIMEOUT_ANNOTATION) {
        None => None,
        Some(t) => Some(
            crate::api::parse_interval(t.trim())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    invalid(
                        HOOK_TIMEOUT_ANNOTATION,
                        t,
                        "a positive duration such as 90s, 10m or 1h",
                    )
                })?,
        ),
    };
    Ok(Hook {
        object,
        events,
        weight,
        delete_policies,
        timeout,
    })
}

fn split_list(list: &str) -> impl Iterator<Item = String> + '_ {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// Whether the API server serves a kind as namespaced or cluster-scoped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Lives in a namespace.
    Namespaced,
    /// Cluster-wide.
    Cluster,
}

/// Gives namespaced objects without a namespace `default_namespace` (as `helm install -n` does)
/// and removes the namespace from cluster-scoped ones. `scope` answers from discovery.
pub fn assign_namespaces(
    objects: &mut [RenderedObject],
    default_namespace: &str,
    scope: impl Fn(&InventoryEntry) -> Option<Scope>,
) -> Result<(), PlanError> {
    for object in objects {
        let namespace =
            match scope(&object.id).ok_or_else(|| PlanError::UnknownKind(describe(&object.id)))? {
                Scope::Cluster => String::new(),
                Scope::Namespaced if object.id.namespace.is_empty() => default_namespace.to_owned(),
                Scope::Namespaced => object.id.namespace.clone(),
            };
        if let Some(metadata) = object
            .body
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
        {
            if namespace.is_empty() {
                metadata.remove("namespace");
            } else {
                metadata.insert("namespace".into(), Value::String(namespace.clone()));
            }
        }
        object.id.namespace = namespace;
    }
    Ok(())
}

/// What makes an object the same object: group, kind, namespace and name — not the version, so
/// that a chart moving a kind to another served version (`autoscaling/v1` → `v2`) does not
/// prune the object it just applied.
fn identity(id: &InventoryEntry) -> (&str, &str, &str, &str) {
    (&id.group, &id.kind, &id.namespace, &id.name)
}

/// Whether `entries` hold the object `id` names, whatever its version ([`identity`]).
pub fn holds(entries: &[InventoryEntry], id: &InventoryEntry) -> bool {
    entries.iter().any(|entry| identity(entry) == identity(id))
}

/// Objects of the previous inventory that the new one lacks, in deletion (reverse install) order.
pub fn to_prune(previous: &[InventoryEntry], current: &[InventoryEntry]) -> Vec<InventoryEntry> {
    let keep: BTreeSet<_> = current.iter().map(identity).collect();
    let mut gone: Vec<InventoryEntry> = previous
        .iter()
        .filter(|id| !keep.contains(&identity(id)))
        .cloned()
        .collect();
    sort_for_deletion(&mut gone);
    gone
}

/// Orders objects for deletion: the reverse of the install order (workloads before the
/// namespaces, CRDs and RBAC they depend on).
pub fn sort_for_deletion(ids: &mut [InventoryEntry]) {
    ids.sort_by(|a, b| install_key(b).cmp(&install_key(a)));
}

/// Why an object of the inventory is never deleted by module-manager, if it is one of those:
/// CRDs (deleting one deletes every custom resource of its kind in the cluster; Helm never
/// deletes CRDs either), and the namespace that holds the Manifest itself (its deletion would
/// wait for the Manifest's finalizer, which waits for the namespace).
pub fn protected(id: &InventoryEntry, manifest_namespace: &str) -> Option<&'static str> {
    if is_crd(id) {
        Some("CustomResourceDefinitions are never deleted")
    } else if id.kind == "Namespace" && id.group.is_empty() && id.name == manifest_namespace {
        Some("it holds the Manifest itself")
    } else {
        None
    }
}

/// Whether pruning may go ahead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PruneDecision {
    /// Delete these objects (possibly none).
    Prune(Vec<InventoryEntry>),
    /// Delete nothing: the render looks wrong. The reason goes into the status.
    Refuse(String),
}

/// The mass-prune guard. A render that came out empty while objects exist, or objects that
/// vanished although neither the chart nor the values changed, points at a broken render (or a
/// changed cluster capability), not at a user's intent: refuse, and let a person look.
pub fn guard_prune(
    gone: Vec<InventoryEntry>,
    rendered: usize,
    inputs_changed: bool,
) -> PruneDecision {
    if gone.is_empty() {
        PruneDecision::Prune(gone)
    } else if rendered == 0 {
        PruneDecision::Refuse(format!(
            "the render is empty; refusing to delete all {} of the module",
            counted(gone.len(), "object")
        ))
    } else if !inputs_changed {
        PruneDecision::Refuse(format!(
            "{} vanished from the render although the chart and values did not change (first: {}); refusing to prune",
            counted(gone.len(), "object"),
            describe(&gone[0])
        ))
    } else {
        PruneDecision::Prune(gone)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn counts_say_one_object_and_two_objects() {
        assert_eq!(counted(1, "object"), "1 object");
        assert_eq!(counted(2, "object"), "2 objects");
        assert_eq!(counted(0, "hook object"), "0 hook objects");
    }

    /// An inventory entry of `kind` (its group from a few known kinds, else the core group).
    pub(crate) fn id(kind: &str, namespace: &str, name: &str) -> InventoryEntry {
        let (group, version) = match kind {
            "Deployment" | "StatefulSet" => ("apps", "v1"),
            "CustomResourceDefinition" => ("apiextensions.k8s.io", "v1"),
            "ClusterRole" => ("rbac.authorization.k8s.io", "v1"),
            "Widget" => ("example.com", "v1"),
            _ => ("", "v1"),
        };
        InventoryEntry {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    const RENDER: &str = r#"---
# Source: demo/templates/deployment.yaml
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec: {replicas: 1}
---
# Source: demo/templates/widget.yaml
apiVersion: example.com/v1
kind: Widget
metadata: {name: w1}
---
# Source: demo/crds/widgets.yaml
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
---
# Source: demo/templates/empty.yaml
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: other}
---
apiVersion: v1
kind: Namespace
metadata: {name: web}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: migrate
  annotations:
    helm.sh/hook: pre-upgrade,pre-install
    helm.sh/hook-weight: "5"
    helm.sh/hook-delete-policy: before-hook-creation, hook-succeeded
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: seed
  annotations: {"helm.sh/hook": pre-install, "helm.sh/hook-weight": "-3"}
---
apiVersion: v1
kind: Pod
metadata:
  name: smoke
  annotations: {"helm.sh/hook": test}
"#;

    #[test]
    fn parse_and_plan_split_and_order_like_helm() {
        let plan = plan(parse_documents(RENDER).unwrap()).unwrap();
        assert_eq!(
            plan.crds
                .iter()
                .map(|o| o.id.name.as_str())
                .collect::<Vec<_>>(),
            ["widgets.example.com"]
        );
        let kinds: Vec<&str> = plan.objects.iter().map(|o| o.id.kind.as_str()).collect();
        assert_eq!(kinds, ["Namespace", "ConfigMap", "Deployment", "Widget"]);
        let hooks: Vec<(&str, i64)> = plan
            .hooks
            .iter()
            .map(|h| (h.object.id.name.as_str(), h.weight))
            .collect();
        assert_eq!(
            hooks,
            [("seed", -3), ("migrate", 5)],
            "ordered by weight; the test hook is dropped"
        );
        assert_eq!(
            plan.hooks[1].events,
            [HookEvent::PreUpgrade, HookEvent::PreInstall]
        );
        assert_eq!(
            plan.hooks[1].delete_policies,
            [
                DeletePolicy::BeforeHookCreation,
                DeletePolicy::HookSucceeded
            ]
        );
        assert_eq!(
            plan.hooks[0].delete_policies,
            [DeletePolicy::BeforeHookCreation],
            "Helm's default"
        );
        assert_eq!(
            plan.inventory().len(),
            5,
            "the inventory has CRDs and objects, not hooks"
        );
        assert_eq!(plan.objects[1].id, id("ConfigMap", "other", "settings"));
    }

    /// A render at the output cap made of millions of tiny keys is refused before it is
    /// decoded (decoded, it took 32 times its bytes); a real render is far from the cap.
    #[test]
    fn a_render_of_millions_of_tiny_keys_is_refused_before_decoding() {
        let cap = 16 * 1024 * 1024;
        let mut render =
            String::from("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: tiny\ndata:\n");
        let mut i = 0;
        while render.len() < cap - 32 {
            render.push_str(&format!("  k{i:x}: 1\n"));
            i += 1;
        }
        assert!(i > 1_300_000, "{i} keys");
        let error = parse_documents_within(&render, max_nodes(cap)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the rendered output has more than 1048576 YAML nodes (maps, lists and values), the most a render may have: one per 16 bytes of the output cap"
        );
        let objects = parse_documents_within(RENDER, max_nodes(RENDER.len() * 2)).unwrap();
        assert_eq!(objects.len(), parse_documents(RENDER).unwrap().len());
        assert!(parse_documents_within(RENDER, max_nodes(RENDER.len() / 2)).is_err());
    }

    /// Objects are counted over CRDs, objects and hooks; the inventory estimate covers what
    /// the status would list (the previous entries too, the objects' UIDs) and matches its JSON.
    #[test]
    fn renders_over_the_caps_are_refused() {
        let docs = |n: usize| {
            (0..n)
                .map(|i| {
                    format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c{i}}}\n---\n")
                })
                .collect::<String>()
        };
        let hook = "apiVersion: v1\nkind: Pod\nmetadata: {name: h, annotations: {helm.sh/hook: pre-install}}\n";
        let plan = plan(parse_documents(&format!("{}{hook}", docs(3))).unwrap()).unwrap();
        let limits = |max_objects, max_inventory_bytes| PlanLimits {
            max_objects,
            max_inventory_bytes,
        };
        let check = |previous: &[InventoryEntry], limits, stamped| {
            check_limits(&plan, previous, &[], limits, stamped)
        };
        assert_eq!(check(&[], limits(4, 1 << 20), true), Ok(()));
        assert_eq!(
            check(&[], limits(3, 1 << 20), true),
            Err(PlanError::TooManyObjects { count: 4, max: 3 })
        );
        let mut listed: Vec<InventoryEntry> = plan.applied().map(|o| o.id.clone()).collect();
        listed.push(plan.hooks[0].object.id.clone());
        let uids: std::collections::BTreeMap<String, String> = plan
            .applied()
            .map(|o| (ownership::uid_key(&o.id), "u".repeat(36)))
            .collect();
        let stamps: std::collections::BTreeMap<String, String> = plan
            .applied()
            .map(|o| (ownership::uid_key(&o.id), "0".repeat(16)))
            .collect();
        let unstamped = serde_json::to_vec(&listed).unwrap().len()
            + serde_json::to_vec(&uids).unwrap().len()
            - 1;
        let exact = unstamped + serde_json::to_vec(&stamps).unwrap().len() - 1;
        assert_eq!(check(&[], limits(4, exact), true), Ok(()));
        assert_eq!(
            check(&[], limits(4, exact - 1), true),
            Err(PlanError::InventoryTooLarge {
                bytes: exact,
                max: exact - 1
            })
        );
        // No stamps on the local cluster.
        assert_eq!(check(&[], limits(4, unstamped), false), Ok(()));
        assert!(check(&[], limits(4, unstamped - 1), false).is_err());
        // Entries of the previous render stay listed until pruned: they count too.
        let old = id("Secret", "apps", &"s".repeat(200));
        assert!(matches!(
            check(&[old], limits(4, exact + 100), true),
            Err(PlanError::InventoryTooLarge { .. })
        ));
        assert!(
            PlanError::TooManyObjects { count: 4, max: 3 }
                .to_string()
                .contains("--max-objects-per-render")
        );
    }

    /// An anchor in a template (a few bytes that could expand to gigabytes) is refused before
    /// decoding, naming the template.
    #[test]
    fn rendered_aliases_are_refused_naming_the_template() {
        let yaml = "---\n# Source: web/templates/a.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n# Source: web/templates/b.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\ndata: &d {x: y}\nmore: *d\n";
        let error = parse_documents(yaml).unwrap_err();
        assert_eq!(
            error.to_string(),
            "rendered output of web/templates/b.yaml: YAML anchors and aliases are not allowed (line 6, column 10)"
        );
        let bare = parse_documents("a: &x 1\nb: *x\n").unwrap_err().to_string();
        assert!(bare.starts_with("rendered output: "), "{bare}");
        // Nesting deeper than the decoder reads (its time is quadratic in the depth).
        let deep = format!(
            "---\n# Source: web/templates/c.yaml\napiVersion: v1\nkind: ConfigMap\ndata: {}",
            "[".repeat(1 << 20)
        );
        let error = parse_documents(&deep).unwrap_err().to_string();
        assert!(
            error.starts_with(
                "rendered output of web/templates/c.yaml: YAML nested deeper than 128 levels"
            ),
            "{error}"
        );
    }

    #[test]
    fn a_document_that_is_not_an_object_names_its_template() {
        let render = "---\n# Source: demo/templates/a.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n# Source: demo/templates/empty.yaml\n---\n# Source: demo/templates/notes.yaml\njust some text\n";
        let error = parse_documents(render).unwrap_err();
        assert_eq!(
            error,
            PlanError::NotAnObject {
                index: 2,
                template: Some("demo/templates/notes.yaml".into()),
                reason: "not a mapping"
            }
        );
        assert_eq!(
            error.to_string(),
            "rendered document from demo/templates/notes.yaml is not a Kubernetes object: not a mapping"
        );
        let no_kind = "---\n# Source: demo/templates/b.yaml\napiVersion: v1\nmetadata: {name: b}\n";
        assert_eq!(
            parse_documents(no_kind).unwrap_err().to_string(),
            "rendered document from demo/templates/b.yaml is not a Kubernetes object: no kind"
        );
        let list = "---\n# Source: demo/templates/list.yaml\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap}\n";
        assert!(
            parse_documents(list)
                .unwrap_err()
                .to_string()
                .contains("from demo/templates/list.yaml"),
            "an item of a List is named by the List's template"
        );
        let bad_yaml = "---\n# Source: demo/templates/a.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n# Source: demo/templates/bad.yaml\na: [b\n";
        let error = parse_documents(bad_yaml).unwrap_err().to_string();
        assert!(
            error.starts_with("rendered output of demo/templates/bad.yaml is not valid YAML: "),
            "{error}"
        );
        let unnamed = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\nkind: x\n";
        assert_eq!(
            parse_documents(unnamed).unwrap_err().to_string(),
            "rendered document 1 is not a Kubernetes object: no apiVersion"
        );
    }

    #[test]
    fn documents_split_as_helm_splits_them() {
        assert_eq!(split_documents("a: 1\n---\nb: 2\n"), ["a: 1\n", "\nb: 2\n"]);
        assert_eq!(split_documents("--- {a: 1}\n"), ["", " {a: 1}\n"]);
        // Not a marker: indented, or longer.
        assert_eq!(
            split_documents("a: |\n  ---\n----\n"),
            ["a: |\n  ---\n----\n"]
        );
        let objects =
            parse_documents("--- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n...\n")
                .unwrap();
        assert_eq!(objects.len(), 1);
        assert_eq!(
            parse_documents(RENDER).unwrap().len(),
            8,
            "every object of the sample render, the empty documents skipped"
        );
    }

    #[test]
    fn bad_documents_are_named() {
        assert_eq!(
            parse_documents("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n"),
            Err(PlanError::NotAnObject {
                index: 0,
                template: None,
                reason: "no metadata.name"
            })
        );
        assert_eq!(
            parse_documents("---\n- a\n- b\n"),
            Err(PlanError::NotAnObject {
                index: 0,
                template: None,
                reason: "not a mapping"
            })
        );
        assert!(matches!(
            parse_documents("a: [b\n"),
            Err(PlanError::Yaml { template: None, .. })
        ));
        let twice = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\n";
        assert_eq!(
            plan(parse_documents(twice).unwrap()),
            Err(PlanError::Duplicate("Secret/s".into()))
        );
        let hook = |annotations: &str| {
            let doc = format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: s, annotations: {{{annotations}}}}}\n"
            );
            plan(parse_documents(&doc).unwrap())
        };
        for (annotations, named) in [
            (
                "helm.sh/hook: pre-install, helm.sh/hook-weight: high",
                "helm.sh/hook-weight \"high\"",
            ),
            ("helm.sh/hook: pre-instal", "helm.sh/hook \"pre-instal\""),
            (
                "helm.sh/hook: pre-install, helm.sh/hook-delete-policy: hook-suceeded",
                "helm.sh/hook-delete-policy \"hook-suceeded\"",
            ),
            (
                "helm.sh/hook: pre-install, modulemanager.io/hook-timeout: \"5\"",
                "modulemanager.io/hook-timeout \"5\"",
            ),
            (
                "helm.sh/hook: pre-install, modulemanager.io/hook-timeout: 0s",
                "modulemanager.io/hook-timeout \"0s\"",
            ),
        ] {
            match hook(annotations) {
                Err(e @ PlanError::HookAnnotation { .. }) => {
                    let message = e.to_string();
                    assert!(message.starts_with("Secret/s: invalid "), "{message}");
                    assert!(message.contains(named), "{message}");
                }
                other => panic!("{annotations}: {other:?}"),
            }
        }
        let timed = hook("helm.sh/hook: pre-install, modulemanager.io/hook-timeout: 90s").unwrap();
        assert_eq!(
            timed.hooks[0].timeout,
            Some(std::time::Duration::from_secs(90))
        );
    }

    #[test]
    fn hooks_order_by_weight_then_kind_then_name_as_helm_does() {
        let doc = |kind: &str, name: &str, weight: &str| {
            format!(
                "---\napiVersion: v1\nkind: {kind}\nmetadata: {{name: {name}, annotations: {{helm.sh/hook: post-install, helm.sh/hook-weight: \"{weight}\"}}}}\n"
            )
        };
        let render = [
            doc("Pod", "a-pod", "0"),
            doc("ConfigMap", "z-config", "0"),
            doc("ConfigMap", "b-config", "0"),
            doc("Secret", "late", "10"),
            doc("Widget", "w", "0"),
            doc("Gadget", "g", "0"),
            doc("Pod", "early", "-10"),
        ]
        .concat();
        let plan = plan(parse_documents(&render).unwrap()).unwrap();
        let order: Vec<&str> = plan
            .hooks
            .iter()
            .map(|h| h.object.id.name.as_str())
            .collect();
        // weight first; at equal weight Helm's kind order (ConfigMap before Pod), unknown
        // kinds last by kind; at equal kind the name.
        assert_eq!(
            order,
            ["early", "b-config", "z-config", "a-pod", "g", "w", "late"]
        );
    }

    #[test]
    fn legacy_crd_install_hooks_are_plain_objects() {
        let render = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com, annotations: {helm.sh/hook: crd-install}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c, annotations: {helm.sh/hook: "crd-install,pre-install"}}
"#;
        let plan = plan(parse_documents(render).unwrap()).unwrap();
        assert!(plan.hooks.is_empty());
        assert_eq!(plan.crds.len(), 1);
        assert_eq!(plan.objects[0].id.name, "c");
    }

    #[test]
    fn lists_are_expanded() {
        let list = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: a}}\n- {apiVersion: v1, kind: Secret, metadata: {name: b}}\n";
        let names: Vec<String> = parse_documents(list)
            .unwrap()
            .into_iter()
            .map(|o| o.id.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn namespaces_follow_the_kind_scope() {
        let mut objects = parse_documents(RENDER).unwrap();
        objects.retain(|o| o.id.kind != "Pod" && o.id.kind != "Job");
        let scope = |id: &InventoryEntry| match id.kind.as_str() {
            "Namespace" | "CustomResourceDefinition" => Some(Scope::Cluster),
            "Widget" => None,
            _ => Some(Scope::Namespaced),
        };
        assert_eq!(
            assign_namespaces(&mut objects, "apps", scope),
            Err(PlanError::UnknownKind("Widget/w1".into()))
        );
        objects.retain(|o| o.id.kind != "Widget");
        assign_namespaces(&mut objects, "apps", scope).unwrap();
        let by_name = |n: &str| objects.iter().find(|o| o.id.name == n).unwrap();
        assert_eq!(by_name("web").id.namespace, "apps");
        assert_eq!(by_name("web").body["metadata"]["namespace"], "apps");
        assert_eq!(
            by_name("settings").id.namespace,
            "other",
            "an explicit namespace is kept"
        );
        assert_eq!(by_name("widgets.example.com").id.namespace, "");
        assert!(
            by_name("widgets.example.com").body["metadata"]
                .get("namespace")
                .is_none()
        );
    }

    #[test]
    fn prune_is_the_difference_in_reverse_install_order() {
        let previous = vec![
            id("Namespace", "", "web"),
            id("ClusterRole", "", "reader"),
            id("ConfigMap", "web", "settings"),
            id("Deployment", "web", "web"),
            id("Widget", "web", "w1"),
        ];
        let current = vec![id("Namespace", "", "web"), id("Deployment", "web", "web")];
        assert_eq!(
            to_prune(&previous, &current),
            [
                id("Widget", "web", "w1"),
                id("ClusterRole", "", "reader"),
                id("ConfigMap", "web", "settings")
            ]
        );
        assert!(to_prune(&current, &previous).is_empty());
    }

    #[test]
    fn crds_and_the_manifests_namespace_are_protected() {
        assert!(
            protected(
                &id("CustomResourceDefinition", "", "widgets.example.com"),
                "default"
            )
            .is_some()
        );
        assert!(protected(&id("Namespace", "", "default"), "default").is_some());
        assert!(protected(&id("Namespace", "", "web"), "default").is_none());
        assert!(protected(&id("ConfigMap", "default", "default"), "default").is_none());
    }

    #[test]
    fn a_new_api_version_of_the_same_object_is_not_pruned() {
        let v1 = InventoryEntry {
            group: "autoscaling".into(),
            version: "v1".into(),
            kind: "HorizontalPodAutoscaler".into(),
            namespace: "web".into(),
            name: "web".into(),
        };
        let v2 = InventoryEntry {
            version: "v2".into(),
            ..v1.clone()
        };
        assert!(to_prune(std::slice::from_ref(&v1), std::slice::from_ref(&v2)).is_empty());
    }

    #[test]
    fn the_guard_refuses_empty_renders_and_unexplained_vanishing() {
        let gone = vec![id("Deployment", "web", "web")];
        assert_eq!(guard_prune(vec![], 0, false), PruneDecision::Prune(vec![]));
        assert_eq!(
            guard_prune(gone.clone(), 3, true),
            PruneDecision::Prune(gone.clone())
        );
        assert!(
            matches!(guard_prune(gone.clone(), 0, true), PruneDecision::Refuse(m) if m.contains("render is empty"))
        );
        assert!(
            matches!(guard_prune(gone, 3, false), PruneDecision::Refuse(m) if m.contains("Deployment/web/web"))
        );
    }
}
