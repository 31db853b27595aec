//! The `Manifest` custom resource: one module (a Helm chart plus its configuration) on one cluster.
//!
//! The doc comments on these types become the descriptions in the generated CRD schema
//! (`module-manager crd`, checked in as `crds/manifest.yaml`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// Desired state of a module on a target cluster.
// clippy reads the repeated `type_ = "string"` of the print columns as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "modulemanager.io",
    version = "v1alpha1",
    kind = "Manifest",
    namespaced,
    status = "ManifestStatus",
    shortname = "mfst",
    category = "modulemanager",
    doc = "A module: one Helm chart and its configuration, installed, upgraded, repaired and deleted on a target cluster by module-manager.",
    printcolumn(name = "Module", type_ = "string", json_path = ".spec.module"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.chart.version"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].message"
    ),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        priority = "1"
    ),
    printcolumn(name = "Owner", type_ = "string", json_path = ".status.owner"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.target) == has(oldSelf.target) && (!has(self.target) || self.target == oldSelf.target)")
        .message("spec.target is immutable: the inventory lists objects on the target it was installed to; to move a module to another cluster, delete this Manifest (deletionPolicy Orphan keeps the objects) and create a new one")
)]
pub struct ManifestSpec {
    /// Name of the module. One Manifest per module per target cluster.
    #[schemars(length(min = 1, max = 253))]
    pub module: String,

    /// Where the chart comes from: exactly one of `path`, `repository` (with `name` and
    /// `version`) or `oci`.
    pub chart: ChartSource,

    /// Helm release name (lowercase letters, digits, `-` and `.`, as Helm requires). Defaults
    /// to the Manifest's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 53),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub release_name: Option<String>,

    /// Namespace the chart is installed into, created when missing. Defaults to the Manifest's
    /// namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub target_namespace: Option<String>,

    /// Inline chart values. Merged last, over everything in `valuesFrom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub values: Option<serde_json::Value>,

    /// Values read from ConfigMaps and Secrets in the Manifest's namespace, merged in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub values_from: Vec<ValuesReference>,

    /// The cluster to install onto. Omitted means the cluster module-manager runs in.
    /// Immutable: set it when the Manifest is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,

    /// The ServiceAccount of the Manifest's namespace whose rights the module's objects are
    /// applied, read and deleted with (module-manager impersonates
    /// `system:serviceaccount:<namespace>:<name>`). Omitted means the operator's
    /// `--default-service-account`, or without one the operator's own identity. Not allowed
    /// with `target` (a remote target uses its kubeconfig's identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub service_account_name: Option<String>,

    /// What happens to the module's objects when the Manifest is deleted.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// Take over objects the chart renders that exist already without being this Manifest's:
    /// objects no Manifest labelled (created by hand or by `helm install`), and objects
    /// labelled by a Manifest that no longer exists on this cluster (deleted with
    /// `deletionPolicy: Orphan`). Never an object of a Manifest that exists here; Manifests of
    /// another management cluster are not seen. Never a hook object. Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopt: bool,

    /// Stop reconciling this Manifest: nothing is applied, pruned or repaired while true.
    #[serde(default)]
    pub suspend: bool,

    /// How often the module's objects are re-checked and drift repaired, e.g. `10m`, `1h30m`;
    /// kept between 1s and 24h.
    #[serde(default = "default_interval")]
    #[schemars(length(max = 32), regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub interval: String,
    /// How many releases (installs and upgrades) `status.history` keeps, newest first: 1 to 20,
    /// 5 when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 20))]
    pub max_history: Option<u32>,

    /// How long the applied objects may take to become ready, e.g. `5m`, counted from the
    /// first apply of this generation's render; past it the Manifest is `Stalled` (reason
    /// `ReadinessTimeout`) naming the objects that are not ready. Kept between 1s and 24h.
    #[serde(default = "default_timeout")]
    #[schemars(length(max = 32), regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub timeout: String,

    /// Fields module-manager neither enforces nor owns once an object exists, so that other
    /// controllers or people may set them (Flux's `driftDetection.ignore`): the matching JSON
    /// pointers are left out of every apply after the object's first one, and a field
    /// module-manager owned until then is handed over with its live value (no default applied).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub drift_ignore: Vec<DriftIgnoreRule>,

    /// How drift passes treat drift (Flux's `driftDetection.mode`): repair and report it,
    /// only report it, or no drift pass at all; and which other field managers' changes a drift
    /// pass reverts. docs/api.md § Drift modes and foreign managers.
    #[serde(default, skip_serializing_if = "DriftSpec::is_default")]
    pub drift: DriftSpec,

    /// Manifests that must be Ready (at their current generation) before this one is installed
    /// or upgraded: until then it waits, `Processing` with reason `DependencyNotReady` naming
    /// each that is not and why. A dependency is not deleted while a dependent that installed
    /// something exists. `docs/operations.md` § Dependencies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub depends_on: Vec<DependencyReference>,
}

/// A Manifest another one waits for (`spec.dependsOn`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DependencyReference {
    /// Name of the Manifest.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Namespace of the Manifest; omitted means the dependent's own. Another namespace is
    /// refused when the operator runs with `--cross-namespace-dependencies=false` (the default
    /// in impersonation mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,
}

/// `spec.drift`: the drift mode and the field managers whose changes are reverted.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.overrideManagers) || self.overrideManagers.all(m, m != 'module-manager' && m != 'module-manager-handover')")
        .message("spec.drift.overrideManagers cannot name module-manager's own field managers (module-manager, module-manager-handover)")
)]
pub struct DriftSpec {
    /// `enabled` (the default): drift passes repair drift and report it in the `Drifted`
    /// condition; `warn`: they report it and write nothing to the module's objects;
    /// `disabled`: no drift pass (an unchanged render of a Ready module is not applied again).
    #[serde(default)]
    pub mode: DriftMode,
    /// Field managers (exact names, e.g. `kubectl-client-side-apply`, `kubectl-edit`) whose
    /// changes a drift pass reverts: the fields they changed get the chart's value back, the
    /// fields they added are removed. Added to the operator's `--drift-override-managers`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 128)))]
    pub override_managers: Vec<String>,
}

impl DriftSpec {
    /// Whether nothing is set (left out of the serialized spec).
    pub fn is_default(&self) -> bool {
        self == &Self::default()
    }
}

/// `spec.drift.mode`.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DriftMode {
    /// Repair drift and report it.
    #[default]
    Enabled,
    /// Report drift, repair nothing.
    Warn,
    /// No drift pass.
    Disabled,
}

/// A `spec.driftIgnore` rule: JSON pointers (RFC 6901) left alone on the objects it targets.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftIgnoreRule {
    /// JSON pointers into the object, e.g. `/spec/replicas`, `/data/counter`,
    /// `/metadata/annotations/example.com~1owner` (`~1` is `/`, `~0` is `~`).
    #[schemars(length(min = 1, max = 32), inner(length(min = 1, max = 512)))]
    pub paths: Vec<String>,
    /// The objects the rule applies to; omitted: every object of the module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<DriftIgnoreTarget>,
}

/// Which objects a `spec.driftIgnore` rule applies to: every field that is set must match
/// exactly (omitted fields match anything).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftIgnoreTarget {
    /// API group (`apps`; empty for the core group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub group: Option<String>,
    /// Kind, e.g. `Deployment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub kind: Option<String>,
    /// Object name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,
    /// Object namespace (as applied: the target namespace unless the chart names another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

fn default_interval() -> String {
    "10m".to_owned()
}

fn default_timeout() -> String {
    "5m".to_owned()
}

/// The source of a chart. Exactly one of `path`, `repository` or `oci` is set.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("[has(self.path), has(self.repository), has(self.oci)].filter(x, x).size() == 1")
        .message("exactly one chart source must be set: path, repository (with name and version), or oci"),
    validation = Rule::new("has(self.repository) == has(self.name) && has(self.repository) == has(self.version)")
        .message("name and version are required with repository, and only with repository"),
    validation = Rule::new("!has(self.secretRef) || !has(self.path)")
        .message("secretRef is for repository and oci sources, not for path"),
    validation = Rule::new("!has(self.verify) || (self.verify.provider == 'cosign' ? has(self.oci) : has(self.repository))")
        .message("verify.provider cosign is for oci charts, helm for charts of a Helm repository")
)]
pub struct ChartSource {
    /// A chart directory or `.tgz` archive on module-manager's filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub path: Option<String>,

    /// URL of a Helm HTTP repository (the directory holding `index.yaml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub repository: Option<String>,

    /// Chart name in the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,

    /// Chart version in the repository: an exact version or a semver range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub version: Option<String>,

    /// OCI reference, `oci://host/repository/chart:tag` or `oci://host/repository/chart@sha256:…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^oci://"))]
    pub oci: Option<String>,

    /// A Secret in the Manifest's namespace holding the credentials of the repository or
    /// registry: `username` and `password` (HTTP basic) or `bearerToken` for a repository;
    /// a `kubernetes.io/dockerconfigjson` Secret (or `username` and `password`) for a
    /// registry. Sent only to the repository's or registry's own host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<ChartSecretRef>,

    /// Verify the chart's signature before it is rendered: a chart that is unsigned, or not
    /// signed by one of the given keys, is refused and nothing of it is applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<ChartVerification>,
}

/// The Secret holding a chart source's credentials, in the Manifest's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChartSecretRef {
    /// Name of the Secret.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
}

/// How a chart's signature is verified (Flux's `HelmChart.spec.verify`): with which provider,
/// against public keys held in a Secret or ConfigMap of the Manifest's namespace.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.secretRef) != has(self.configMapRef)")
        .message("exactly one of secretRef and configMapRef must be set")
)]
pub struct ChartVerification {
    /// `cosign` (an `oci` chart signed with `cosign sign --key`) or `helm` (a Helm
    /// repository's chart with a `.prov` provenance file, `helm package --sign`).
    pub provider: VerificationProvider,
    /// A Secret holding the public keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectReference>,
    /// A ConfigMap holding the public keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<LocalObjectReference>,
    /// The key of the Secret or ConfigMap that holds the public key (`cosign`: PEM) or keyring
    /// (`helm`: OpenPGP public keys, binary or ASCII-armored). Omitted: every key of the
    /// object whose name ends in `.pub` (`cosign`) or `.gpg` or `.asc` (`helm`) is one, and a
    /// signature by any of them is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

/// Who signed a chart, and how.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VerificationProvider {
    /// A cosign signature of the chart's OCI manifest (the `sha256-<digest>.sig` tag).
    Cosign,
    /// A Helm provenance file (`<chart>.tgz.prov`) signed with OpenPGP.
    Helm,
}

/// An object of the Manifest's namespace, by name.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct LocalObjectReference {
    /// Its name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A key of a ConfigMap or Secret whose content is a YAML map of chart values.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValuesReference {
    /// Kind of the object holding the values.
    pub kind: ValuesSourceKind,
    /// Name of the ConfigMap or Secret, in the Manifest's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key holding the values.
    #[serde(default = "default_values_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
    /// When true, a missing object or key is skipped instead of being an error.
    #[serde(default)]
    pub optional: bool,
}

fn default_values_key() -> String {
    "values.yaml".to_owned()
}

/// Kind of object a values reference points to.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ValuesSourceKind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
}

/// The cluster a module is installed onto.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// A Secret in the Manifest's namespace holding a kubeconfig for the target cluster (its
    /// current context is used). Only inline credentials are accepted: `token`,
    /// `client-certificate-data`/`client-key-data`, `certificate-authority-data`; kubeconfigs
    /// that use `exec`, `auth-provider`, file paths, `username`/`password`,
    /// `insecure-skip-tls-verify` or `proxy-url`, or an `http://` server, are refused.
    pub kubeconfig_secret_ref: SecretKeyRef,
}

/// A key of a Secret in the Manifest's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret.
    #[serde(default = "default_kubeconfig_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_kubeconfig_key() -> String {
    "kubeconfig".to_owned()
}

/// What happens to a module's objects when its Manifest is deleted.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DeletionPolicy {
    /// Delete every object of the module (in reverse install order) before the Manifest goes.
    #[default]
    Delete,
    /// Leave the module's objects on the cluster.
    Orphan,
}

/// Observed state of a module, written by the replica that owns the Manifest's shard.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManifestStatus {
    /// Summary state of the module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,

    /// The `metadata.generation` this status describes; -1 until the first pass writes a status
    /// (the CRD's default, so that kstatus reads a new Manifest as in progress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Conditions in the Kubernetes convention: `Ready`, `Rendered`, `Applied`, `Reconciling`,
    /// `Stalled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// `sha256:` digest of the chart archive that was rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_digest: Option<String>,

    /// `sha256:` digest of the rendered objects that were applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendered_digest: Option<String>,

    /// `sha256:` digest of the merged values that were rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values_digest: Option<String>,

    /// The `metadata.generation` whose render was last applied successfully (unlike
    /// `observedGeneration`, a failed pass does not move it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_generation: Option<i64>,

    /// Every object applied for this module, in install order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inventory: Vec<InventoryEntry>,

    /// The UID of each inventory object as module-manager created or took it over, by
    /// `Kind.group/namespace/name` (`Kind/namespace/name` in the core group, no namespace for
    /// cluster-scoped objects). Every apply is conditional on it, and so is every delete: an
    /// object deleted and created again by someone else is neither written nor deleted. An
    /// inventory object without one (recorded before its first apply answered, or by an older
    /// version) is written only if it does not exist or is labelled as this Manifest's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inventory_uids: BTreeMap<String, String>,

    /// On a remote target: for each inventory object (keyed as `inventoryUids`), 16 hex digits
    /// of a digest of what module-manager's last apply of it answered (its UID, and its
    /// resourceVersion, or for workloads its generation and the fields module-manager owns)
    /// and of the body sent. A replica that starts, or takes the Manifest over, compares it with
    /// one listing of the target and skips the apply of each object found as that apply left
    /// it, instead of applying everything again. Only compared, never trusted alone: a stamp
    /// that does not match means an apply, as without it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub applied_stamps: BTreeMap<String, String>,

    /// The identity of the cluster the module was first applied to: the UID of its
    /// `kube-system` Namespace. A pass on a cluster with another identity (a kubeconfig Secret
    /// edited to name another cluster) is refused before anything is written there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_identity: Option<String>,

    /// The virtual shard this Manifest belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,

    /// The replica that owns the Manifest's shard and wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,

    /// The last operation module-manager performed on the module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,

    /// The last releases — installs and upgrades, each one run of new inputs (chart, values,
    /// release name, target namespace) — newest first, at most `spec.maxHistory` (5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Release>,

    /// With `--upgrade-spread-seconds`, the last upgrade to a new chart that was spread: the
    /// chart it moves to and the time it may start (written by the first pass that saw the
    /// move; a pass before it waits, `Processing`, reason `RolloutWaiting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_after: Option<ScheduledUpgrade>,

    /// Progress of the current (or last) install, upgrade or deletion through its Helm hooks:
    /// which inputs it belongs to, which phase it is in, which hooks of that phase completed
    /// and which one is running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_run: Option<HookRun>,

    /// Hook objects module-manager applied that may still exist (hooks are not part of the
    /// inventory and are not pruned; these are deleted with the Manifest). Recorded before a
    /// hook is applied.
    #[serde(default)]
    pub hook_objects: Vec<InventoryEntry>,
    /// Since when the applied objects of this generation and render have been waited for to
    /// become ready (absent once they are): `spec.timeout` counts from here, whichever replica
    /// owns the Manifest.
    #[serde(default)]
    pub readiness_started: Option<Time>,

    /// The value of the `reconcile.modulemanager.io/requestedAt` annotation the last pass
    /// handled (a pass asked for on demand; Flux's `lastHandledReconcileAt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_reconcile_at: Option<String>,

    /// The value of the `reconcile.modulemanager.io/resetAt` annotation the last pass handled
    /// (a failed hook run or a permanent error tried again without a spec change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_reset_at: Option<String>,
}

impl ManifestStatus {
    /// Whether no pass has written anything into it: absent, or the CRD's default
    /// (`observedGeneration: -1`, [`super::NOT_OBSERVED`]) as the API server serves a new
    /// Manifest.
    pub fn is_unwritten(status: Option<&Self>) -> bool {
        status.is_none_or(|status| {
            *status
                == Self {
                    observed_generation: Some(super::NOT_OBSERVED),
                    ..Self::default()
                }
        })
    }
}

/// One release of the module: an install or upgrade run of one set of inputs, and how it
/// ended.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Release {
    /// Counts the Manifest's releases from 1.
    pub revision: u32,
    /// `Install` or `Upgrade`.
    pub operation: HookOperation,
    /// The chart as the spec named it then (`oci://…:tag`, `name version` of a repository,
    /// `path`).
    pub chart: String,
    /// The chart archive's digest; absent until a pass rendered these inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_digest: Option<String>,
    /// The merged values' digest; absent until a pass rendered these inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values_digest: Option<String>,
    /// The `metadata.generation` the release started at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The hook run that is this release (`status.hookRun.id`).
    pub run_id: String,
    /// When the first pass of these inputs started it.
    pub started: Time,
    /// When it ended: Ready, failed, or replaced by a newer release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Time>,
    /// How it ended, so far.
    pub outcome: ReleaseOutcome,
    /// Why it failed (shortened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How a release ended.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ReleaseOutcome {
    /// Not ended yet: hooks or objects in progress.
    Pending,
    /// The module was Ready on it.
    Succeeded,
    /// A hook failed, or the pass stalled (a permanent error, the readiness timeout); a later
    /// Ready on the same release makes it `Succeeded`.
    Failed,
    /// A newer release started before it ended.
    Superseded,
}

/// What a hook run does.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum HookOperation {
    /// Nothing was applied yet: `pre-install` and `post-install` hooks.
    Install,
    /// Objects were applied before: `pre-upgrade` and `post-upgrade` hooks.
    Upgrade,
    /// The Manifest is being deleted: `pre-delete` and `post-delete` hooks.
    Delete,
}

/// Where a hook run is.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum HookRunPhase {
    /// Running the `pre-*` hooks; nothing of the new render is applied yet.
    PreHooks,
    /// Applying the objects and waiting for them to be ready (deletion: deleting them).
    Objects,
    /// Running the `post-*` hooks.
    PostHooks,
    /// Every step is done (deletion: the hook objects are being cleaned up).
    Done,
    /// A hook failed or timed out; retried when the inputs or the generation change, or on a
    /// reset (annotation `reconcile.modulemanager.io/resetAt`).
    Failed,
}

/// The progress of one install, upgrade or deletion through its hooks.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookRun {
    /// `Install`, `Upgrade` or `Delete`.
    pub operation: HookOperation,
    /// `sha256:` over the chart digest, the values digest, the release name and the target
    /// namespace: a run belongs to these inputs, and a change of them starts a new run (empty
    /// for `Delete`).
    #[serde(default)]
    pub inputs_digest: String,
    /// The `metadata.generation` the run started at; once `Failed`, the generation it failed
    /// at (a failed run is retried once the generation differs from it, or on a reset).
    #[serde(default)]
    pub generation: Option<i64>,
    /// Identifies the run: a hash of its operation, inputs digest, starting generation and the
    /// previous run's id. Every hook object the run applies is stamped with it (annotation
    /// `modulemanager.io/hook-run: <event>/<id>`), so a pass that finds its own hook object
    /// from a start it failed to record adopts it instead of starting the hook again.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// Where the run is.
    pub phase: HookRunPhase,
    /// Hooks of the current phase that completed, in order.
    #[serde(default)]
    pub completed: Vec<InventoryEntry>,
    /// The hook of the current phase that is running.
    #[serde(default)]
    pub running: Option<RunningHook>,
    /// Why the run failed.
    #[serde(default)]
    pub message: Option<String>,
}

/// A hook that was applied and has not finished yet.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunningHook {
    /// The hook object.
    pub object: InventoryEntry,
    /// Its UID: a hook object replaced or deleted by someone else does not count as this run.
    pub uid: String,
    /// When module-manager applied it (its timeout counts from here).
    pub started: Time,
}

/// Summary state of a module.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum State {
    /// Being installed or upgraded, or waiting for its workloads to become ready.
    Processing,
    /// Installed, and every object is ready.
    Ready,
    /// Installed, but something needs attention (for example a refused prune).
    Warning,
    /// The last reconcile failed; the message says why.
    Error,
    /// The Manifest is being deleted and its objects removed.
    Deleting,
}

/// One object applied for a module.
#[derive(
    Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct InventoryEntry {
    /// API group, empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Namespace, empty for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// An upgrade to a new chart spread over `--upgrade-spread-seconds`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledUpgrade {
    /// The chart it moves to, as `status.history` names charts.
    pub chart: String,
    /// When it may start.
    pub at: Time,
}

/// The last operation performed on a module.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastOperation {
    /// What was done, e.g. `Install`, `Upgrade`, `Repair`, `Delete`.
    pub operation: String,
    /// When it finished.
    pub time: Time,
    /// A human-readable outcome.
    pub message: String,
}

/// Schema of a free-form object (chart values): any keys, kept as given.
fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
