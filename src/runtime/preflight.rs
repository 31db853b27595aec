//! Preflight: before the operator starts, it asks the API server (`SelfSubjectAccessReview`)
//! whether it holds every permission its own code uses, and refuses to start with one error
//! listing each one that is missing — instead of failing later, one forbidden request at a time,
//! in a watch loop or in the middle of a reconcile.
//!
//! [`PERMISSIONS`] is the one list of what the operator itself needs: the RBAC in `deploy/` and in
//! the Helm chart grants exactly these (`docs/deploy.md` explains each), and `tests/deploy.rs`
//! runs the binary with that RBAC and without it. What the *charts* a Manifest installs need
//! (their objects' kinds) is not here: it depends on the modules, and is granted separately
//! through the aggregated ClusterRole `module-manager-modules`.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

/// How long the whole preflight may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Where a permission is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A cluster-scoped resource.
    Cluster,
    /// A namespaced resource, in every namespace (Manifests, their values sources and Events
    /// live in any namespace).
    AllNamespaces,
    /// A namespaced resource in the fleet's namespace (`--lease-namespace`, the pod's namespace).
    FleetNamespace,
}

/// When a permission is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Always.
    Always,
    /// Only when the fleet follows a StatefulSet (`--statefulset`); checked on that object.
    FollowingStatefulSet,
    /// Only when Manifests run as ServiceAccounts by the operator's flags
    /// (`--default-service-account`, `--require-service-account`).
    Impersonating,
}

/// One permission the operator's code uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    /// The verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`).
    pub verb: &'static str,
    /// The API group (`""`: the core group).
    pub group: &'static str,
    /// The resource (plural).
    pub resource: &'static str,
    /// The subresource (`""`: none).
    pub subresource: &'static str,
    /// Where.
    pub scope: Scope,
    /// When.
    pub when: When,
    /// What the code does with it.
    pub why: &'static str,
}

/// A permission on the fleet's StatefulSet, needed only with `--statefulset`.
const fn statefulset(verb: &'static str) -> Permission {
    Permission {
        when: When::FollowingStatefulSet,
        ..permission(
            verb,
            "apps",
            "statefulsets",
            Scope::FleetNamespace,
            "the desired replicas (--statefulset)",
        )
    }
}

const fn permission(
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    scope: Scope,
    why: &'static str,
) -> Permission {
    Permission {
        verb,
        group,
        resource,
        subresource: "",
        scope,
        when: When::Always,
        why,
    }
}

const MANIFESTS: &str = "modulemanager.io";
const LEASE_WHY: &str = "membership and shard Leases";
const ROLLOUT_WHY: &str = "the rollout objects of rollout groups (modulemanager.io/rollout-group)";

/// Every permission the operator's own code uses (exactly the verbs it sends), in the order the
/// report lists them. Keep in step with `deploy/base/rbac/operator.yaml` and the chart's
/// `templates/rbac.yaml`; `tests/deploy.rs` fails when the deployed RBAC lacks one.
pub const PERMISSIONS: &[Permission] = &[
    permission(
        "get",
        MANIFESTS,
        "manifests",
        Scope::AllNamespaces,
        "the admin API's Manifest lookups, a pass's reads of its dependencies (spec.dependsOn)",
    ),
    permission(
        "list",
        MANIFESTS,
        "manifests",
        Scope::AllNamespaces,
        "the Manifest watches (also of depended-on Manifests), a deletion's list of its dependents",
    ),
    permission(
        "watch",
        MANIFESTS,
        "manifests",
        Scope::AllNamespaces,
        "the Manifest watches",
    ),
    permission(
        "patch",
        MANIFESTS,
        "manifests",
        Scope::AllNamespaces,
        "the finalizer, the shard label, the dependency labels",
    ),
    Permission {
        subresource: "status",
        ..permission(
            "patch",
            MANIFESTS,
            "manifests",
            Scope::AllNamespaces,
            "the status",
        )
    },
    permission(
        "create",
        "events.k8s.io",
        "events",
        Scope::AllNamespaces,
        "Events about Manifests",
    ),
    permission(
        "get",
        "",
        "configmaps",
        Scope::AllNamespaces,
        "values from ConfigMaps (valuesFrom)",
    ),
    permission(
        "get",
        "",
        "secrets",
        Scope::AllNamespaces,
        "values from Secrets (valuesFrom) and target kubeconfigs (spec.target)",
    ),
    permission(
        "list",
        "",
        "configmaps",
        Scope::AllNamespaces,
        "the watch of labelled values sources (metadata only)",
    ),
    permission(
        "watch",
        "",
        "configmaps",
        Scope::AllNamespaces,
        "the watch of labelled values sources (metadata only)",
    ),
    permission(
        "list",
        "",
        "secrets",
        Scope::AllNamespaces,
        "the watch of labelled values sources and kubeconfigs (metadata only)",
    ),
    permission(
        "watch",
        "",
        "secrets",
        Scope::AllNamespaces,
        "the watch of labelled values sources and kubeconfigs (metadata only)",
    ),
    permission(
        "get",
        "",
        "namespaces",
        Scope::Cluster,
        "whether a target namespace exists, and the local cluster's identity (kube-system's UID)",
    ),
    permission(
        "create",
        "",
        "namespaces",
        Scope::Cluster,
        "a missing target namespace",
    ),
    permission(
        "list",
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        Scope::Cluster,
        "waiting until a module's CRDs are Established, and following CRDs for renders' API versions",
    ),
    permission(
        "watch",
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        Scope::Cluster,
        "waiting until a module's CRDs are Established, and following CRDs for renders' API versions",
    ),
    permission(
        "create",
        "authentication.k8s.io",
        "tokenreviews",
        Scope::Cluster,
        "authenticating admin API drain callers",
    ),
    permission(
        "create",
        "authorization.k8s.io",
        "subjectaccessreviews",
        Scope::Cluster,
        "authorizing admin API drain callers",
    ),
    permission(
        "get",
        "coordination.k8s.io",
        "leases",
        Scope::FleetNamespace,
        LEASE_WHY,
    ),
    permission(
        "list",
        "coordination.k8s.io",
        "leases",
        Scope::FleetNamespace,
        LEASE_WHY,
    ),
    permission(
        "watch",
        "coordination.k8s.io",
        "leases",
        Scope::FleetNamespace,
        LEASE_WHY,
    ),
    permission(
        "create",
        "coordination.k8s.io",
        "leases",
        Scope::FleetNamespace,
        LEASE_WHY,
    ),
    permission(
        "update",
        "coordination.k8s.io",
        "leases",
        Scope::FleetNamespace,
        LEASE_WHY,
    ),
    permission(
        "patch",
        "coordination.k8s.io",
        "leases",
        Scope::FleetNamespace,
        LEASE_WHY,
    ),
    permission(
        "delete",
        "coordination.k8s.io",
        "leases",
        Scope::FleetNamespace,
        LEASE_WHY,
    ),
    permission(
        "create",
        "",
        "configmaps",
        Scope::FleetNamespace,
        ROLLOUT_WHY,
    ),
    permission(
        "update",
        "",
        "configmaps",
        Scope::FleetNamespace,
        ROLLOUT_WHY,
    ),
    permission(
        "delete",
        "",
        "configmaps",
        Scope::FleetNamespace,
        ROLLOUT_WHY,
    ),
    statefulset("get"),
    statefulset("list"),
    statefulset("watch"),
    Permission {
        when: When::Impersonating,
        ..permission(
            "impersonate",
            "",
            "serviceaccounts",
            Scope::AllNamespaces,
            "writing each Manifest's objects as its ServiceAccount (spec.serviceAccountName, --default-service-account)",
        )
    },
];

/// What the operator runs with.
#[derive(Clone, Copy, Debug)]
pub struct Config<'a> {
    /// The fleet's namespace (`--lease-namespace`).
    pub fleet_namespace: &'a str,
    /// The StatefulSet the fleet follows (`--statefulset`), if any.
    pub statefulset: Option<&'a str>,
    /// Whether the flags make Manifests run as ServiceAccounts (impersonated).
    pub impersonating: bool,
}

/// One permission to ask about, with its namespace and object name resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// The permission.
    pub permission: Permission,
    /// The namespace (`None`: cluster-scoped, or all namespaces).
    pub namespace: Option<String>,
    /// The object's name, when the code only touches one.
    pub name: Option<String>,
}

impl Check {
    /// `verb group/resource[/subresource] [name] (where)`, e.g.
    /// `patch modulemanager.io/manifests/status (all namespaces)`; the core group is left out
    /// (`get secrets (all namespaces)`), as `kubectl auth can-i` writes it.
    pub fn describe(&self) -> String {
        let p = &self.permission;
        let mut text = format!("{} ", p.verb);
        if !p.group.is_empty() {
            text.push_str(p.group);
            text.push('/');
        }
        text.push_str(p.resource);
        if !p.subresource.is_empty() {
            text.push('/');
            text.push_str(p.subresource);
        }
        if let Some(name) = &self.name {
            text.push(' ');
            text.push_str(name);
        }
        match (&self.namespace, p.scope) {
            (Some(namespace), _) => text.push_str(&format!(" (namespace {namespace})")),
            (None, Scope::Cluster) => text.push_str(" (cluster)"),
            (None, _) => text.push_str(" (all namespaces)"),
        }
        text
    }

    fn review(&self) -> SelfSubjectAccessReview {
        let p = &self.permission;
        SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(p.verb.to_owned()),
                    group: Some(p.group.to_owned()),
                    resource: Some(p.resource.to_owned()),
                    subresource: (!p.subresource.is_empty()).then(|| p.subresource.to_owned()),
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            },
            ..Default::default()
        }
    }
}

/// The permissions to check for `config`, in [`PERMISSIONS`] order.
pub fn checks(config: Config<'_>) -> Vec<Check> {
    PERMISSIONS
        .iter()
        .filter_map(|p| {
            let name = match p.when {
                When::Always => None,
                When::FollowingStatefulSet => Some(config.statefulset?.to_owned()),
                When::Impersonating if !config.impersonating => return None,
                When::Impersonating => None,
            };
            let namespace = match p.scope {
                Scope::Cluster | Scope::AllNamespaces => None,
                Scope::FleetNamespace => Some(config.fleet_namespace.to_owned()),
            };
            Some(Check {
                permission: *p,
                namespace,
                name,
            })
        })
        .collect()
}

/// The error text for `missing` out of `total` checks; `identity` is who asked (the user name
/// the API server authenticated), when known.
pub fn report(identity: Option<&str>, missing: &[Check], total: usize) -> String {
    let who = identity.map_or_else(
        || "this operator's identity".to_owned(),
        |user| format!("{user:?}"),
    );
    let mut text = format!(
        "preflight: {who} lacks {} of the {total} permissions module-manager needs:\n",
        missing.len()
    );
    for check in missing {
        text.push_str(&format!(
            "  - {} ({})\n",
            check.describe(),
            check.permission.why
        ));
    }
    text.push_str(
        "Grant them with the operator's RBAC: deploy/base/rbac/operator.yaml (kustomize) or the \
         chart helm/module-manager (rbac.create=true); docs/deploy.md explains each permission.",
    );
    text
}

/// Asks the API server about each check; answers the ones not allowed.
pub async fn missing(client: &kube::Client, checks: &[Check]) -> Result<Vec<Check>, kube::Error> {
    let reviews = Api::<SelfSubjectAccessReview>::all(client.clone());
    let answers = futures::future::join_all(checks.iter().map(|check| {
        let reviews = reviews.clone();
        async move {
            let answer = reviews
                .create(&PostParams::default(), &check.review())
                .await?;
            Ok::<_, kube::Error>(answer.status.is_some_and(|s| s.allowed))
        }
    }))
    .await;
    let mut missing = Vec::new();
    for (check, allowed) in checks.iter().zip(answers) {
        if !allowed? {
            missing.push(check.clone());
        }
    }
    Ok(missing)
}

/// Who the API server says this client is (`SelfSubjectReview`); `None` when it does not say.
async fn identity(client: &kube::Client) -> Option<String> {
    Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()?
        .status?
        .user_info?
        .username
}

/// Checks every permission the operator needs; one error listing each missing permission.
pub async fn check(client: &kube::Client, config: Config<'_>) -> anyhow::Result<()> {
    let checks = checks(config);
    let missing = tokio::time::timeout(TIMEOUT, missing(client, &checks))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "preflight: the API server did not answer the permission checks within {} s",
                TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| anyhow::anyhow!("preflight: ask the API server for permissions: {e}"))?;
    if missing.is_empty() {
        tracing::info!(
            permissions = checks.len(),
            "preflight: every permission granted"
        );
        return Ok(());
    }
    // Only for the message: bounded, so a hanging API server cannot keep the process from
    // exiting with the list.
    let identity = tokio::time::timeout(TIMEOUT, identity(client))
        .await
        .ok()
        .flatten();
    anyhow::bail!(report(identity.as_deref(), &missing, checks.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: Config<'static> = Config {
        fleet_namespace: "ops",
        statefulset: Some("mm"),
        impersonating: true,
    };

    #[test]
    fn checks_resolve_namespaces_and_the_statefulset() {
        let all = checks(CONFIG);
        assert_eq!(all.len(), PERMISSIONS.len());
        let leases: Vec<&Check> = all
            .iter()
            .filter(|c| c.permission.resource == "leases")
            .collect();
        assert_eq!(leases.len(), 7);
        assert!(
            leases
                .iter()
                .all(|c| c.namespace.as_deref() == Some("ops") && c.name.is_none())
        );
        let statefulsets: Vec<&Check> = all
            .iter()
            .filter(|c| c.permission.resource == "statefulsets")
            .collect();
        assert_eq!(statefulsets.len(), 3);
        assert!(statefulsets.iter().all(|c| c.name.as_deref() == Some("mm")));
        let manifests = all
            .iter()
            .find(|c| c.permission.resource == "manifests")
            .unwrap();
        assert_eq!(manifests.namespace, None);
        let impersonate = all.iter().find(|c| c.permission.verb == "impersonate");
        assert_eq!(
            impersonate.map(|c| (c.permission.resource, c.namespace.clone())),
            Some(("serviceaccounts", None))
        );
        let plain = checks(Config {
            impersonating: false,
            ..CONFIG
        });
        assert_eq!(plain.len(), PERMISSIONS.len() - 1);
        assert!(plain.iter().all(|c| c.permission.verb != "impersonate"));
    }

    #[test]
    fn without_a_statefulset_its_permissions_are_not_asked() {
        let without = checks(Config {
            statefulset: None,
            ..CONFIG
        });
        assert_eq!(without.len(), PERMISSIONS.len() - 3);
        assert!(
            without
                .iter()
                .all(|c| c.permission.resource != "statefulsets")
        );
    }

    #[test]
    fn every_permission_is_listed_once() {
        for (i, a) in PERMISSIONS.iter().enumerate() {
            for b in &PERMISSIONS[i + 1..] {
                assert!(
                    (a.verb, a.group, a.resource, a.subresource)
                        != (b.verb, b.group, b.resource, b.subresource),
                    "{a:?} is listed twice"
                );
            }
        }
    }

    #[test]
    fn descriptions_name_verb_group_resource_and_where() {
        let all = checks(CONFIG);
        let described: Vec<String> = all.iter().map(Check::describe).collect();
        for expected in [
            "patch modulemanager.io/manifests/status (all namespaces)",
            "get secrets (all namespaces)",
            "create namespaces (cluster)",
            "create authorization.k8s.io/subjectaccessreviews (cluster)",
            "update coordination.k8s.io/leases (namespace ops)",
            "watch apps/statefulsets mm (namespace ops)",
        ] {
            assert!(
                described.iter().any(|d| d == expected),
                "{expected:?} not in {described:#?}"
            );
        }
    }

    #[test]
    fn the_report_lists_each_missing_permission_and_where_to_fix_it() {
        let all = checks(CONFIG);
        let missing: Vec<Check> = all
            .iter()
            .filter(|c| c.permission.verb == "delete" || c.permission.subresource == "status")
            .cloned()
            .collect();
        let text = report(Some("system:serviceaccount:ops:mm"), &missing, all.len());
        let expected = format!(
            "preflight: \"system:serviceaccount:ops:mm\" lacks 3 of the {} permissions module-manager needs:\n\
             \x20 - patch modulemanager.io/manifests/status (all namespaces) (the status)\n\
             \x20 - delete coordination.k8s.io/leases (namespace ops) (membership and shard Leases)\n\
             \x20 - delete configmaps (namespace ops) (the rollout objects of rollout groups (modulemanager.io/rollout-group))\n\
             Grant them with the operator's RBAC: deploy/base/rbac/operator.yaml (kustomize) or the \
             chart helm/module-manager (rbac.create=true); docs/deploy.md explains each permission.",
            all.len()
        );
        assert_eq!(text, expected);
        assert!(
            report(None, &missing, all.len())
                .starts_with("preflight: this operator's identity lacks 3 of")
        );
    }

    #[test]
    fn reviews_carry_the_resolved_attributes() {
        let all = checks(CONFIG);
        let status = all
            .iter()
            .find(|c| c.permission.subresource == "status")
            .unwrap()
            .review();
        let attributes = status.spec.resource_attributes.unwrap();
        assert_eq!(attributes.verb.as_deref(), Some("patch"));
        assert_eq!(attributes.group.as_deref(), Some("modulemanager.io"));
        assert_eq!(attributes.subresource.as_deref(), Some("status"));
        assert_eq!(attributes.namespace, None);
        let secrets = all
            .iter()
            .find(|c| c.permission.resource == "secrets")
            .unwrap()
            .review();
        let attributes = secrets.spec.resource_attributes.unwrap();
        assert_eq!(attributes.group.as_deref(), Some(""));
        assert_eq!(attributes.subresource, None);
    }
}
