//! Tenancy: whose identity a Manifest's objects are written with, and what no module may write.
//!
//! Both are pure decisions: [`identity`] picks the ServiceAccount a pass impersonates from the
//! Manifest and the operator's flags (`--default-service-account`, `--require-service-account`);
//! [`check_protected`] refuses a render that would write into the operator's own namespace or
//! the fleet's Lease namespace, or write a Lease labelled as a fleet member — whatever RBAC
//! would allow, so that no module can run a Pod as the operator or forge a fleet member.

use super::{Plan, RenderedObject, describe};

/// The operator's flags about the identity a module is written with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceAccountPolicy {
    /// `--default-service-account`: used for Manifests that name none.
    pub default: Option<String>,
    /// `--require-service-account`: a Manifest without one (and no default) is refused.
    pub required: bool,
    /// `--adopt-as-operator`: a Manifest written with the operator's own identity may take over
    /// existing objects (`spec.adopt`); off by default ([`check_adoption`]).
    pub adopt_as_operator: bool,
}

/// A ServiceAccount a pass impersonates.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceAccount {
    /// Its namespace (the Manifest's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ServiceAccount {
    /// The user name the API server knows it by (what the `Impersonate-User` header carries).
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

/// Whose rights a pass writes the module's objects with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// The operator's own (no ServiceAccount named, no default, not required).
    Operator,
    /// A ServiceAccount of the Manifest's namespace, impersonated.
    ServiceAccount(ServiceAccount),
    /// A remote target's kubeconfig credentials (`spec.target`).
    Kubeconfig,
}

/// Why a Manifest cannot be reconciled under the operator's ServiceAccount policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// the Manifest names no ServiceAccount while the operator requires one.
    #[error(
        "spec.serviceAccountName is not set and this operator runs with --require-service-account: set it to a ServiceAccount of namespace {namespace}; nothing was applied or deleted"
    )]
    Required {
        /// The Manifest's namespace.
        namespace: String,
    },
    /// the Manifest asks to adopt objects and is written with the operator's own identity.
    #[error(
        "spec.adopt takes over existing objects as the identity the module is written with, and this Manifest's is the operator's own, which may write objects its author cannot: set spec.serviceAccountName to a ServiceAccount of namespace {namespace} (or start the operator with --default-service-account, or with --adopt-as-operator to allow it); nothing was applied or deleted"
    )]
    AdoptAsOperator {
        /// The Manifest's namespace.
        namespace: String,
    },
    /// the Manifest names a ServiceAccount and a remote target.
    #[error(
        "spec.serviceAccountName {name} cannot be used with spec.target: a remote target is written with its kubeconfig's credentials; remove one of them; nothing was applied or deleted"
    )]
    WithTarget {
        /// The ServiceAccount named.
        name: String,
    },
}

/// The identity of a pass over a Manifest of `namespace` naming `service_account` (or none),
/// with or without a remote target. A remote target keeps its kubeconfig's identity (the
/// default ServiceAccount does not apply to it, and naming one is refused: it would name an
/// account of this cluster for requests to another); a local Manifest impersonates its own
/// ServiceAccount, else the default, else — unless one is required — runs as the operator.
pub fn identity(
    service_account: Option<&str>,
    remote: bool,
    namespace: &str,
    policy: &ServiceAccountPolicy,
) -> Result<Identity, IdentityError> {
    let account = |name: &str| {
        Identity::ServiceAccount(ServiceAccount {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    };
    match (service_account, remote) {
        (Some(name), true) => Err(IdentityError::WithTarget {
            name: name.to_owned(),
        }),
        (None, true) => Ok(Identity::Kubeconfig),
        (Some(name), false) => Ok(account(name)),
        (None, false) => match (&policy.default, policy.required) {
            (Some(name), _) => Ok(account(name)),
            (None, true) => Err(IdentityError::Required {
                namespace: namespace.to_owned(),
            }),
            (None, false) => Ok(Identity::Operator),
        },
    }
}

/// Whether a pass written as `identity` may take over existing objects (`spec.adopt`). As a
/// ServiceAccount, or a remote target's kubeconfig user, the API server's authorization keeps
/// what it can take to what the Manifest's author reaches themselves; as the operator, whose
/// rights are wider than any tenant's, only when the operator was started with
/// `--adopt-as-operator`.
pub fn check_adoption(
    identity: &Identity,
    namespace: &str,
    policy: &ServiceAccountPolicy,
) -> Result<(), IdentityError> {
    match identity {
        Identity::Operator if !policy.adopt_as_operator => Err(IdentityError::AdoptAsOperator {
            namespace: namespace.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// What no module may write, whatever its RBAC.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Protected {
    /// The operator's namespace and the fleet's Lease namespace: no object in them, and no
    /// Namespace object of that name.
    pub namespaces: Vec<String>,
    /// Label keys that mark a fleet's Leases: no Lease carrying one, in any namespace.
    pub lease_labels: Vec<String>,
}

/// Why a render was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{object} is refused: {why}; nothing of this render was applied")]
pub struct ProtectedError {
    /// The object, as `Kind/namespace/name`.
    pub object: String,
    /// What makes it protected.
    pub why: String,
}

impl Protected {
    /// Why writing `object` is refused, if it is (by its own namespace: one without a namespace
    /// lands in the target namespace, checked by [`check_protected`] first).
    fn refusal(&self, object: &RenderedObject) -> Option<String> {
        let id = &object.id;
        let named = |ns: &str| self.namespaces.iter().any(|p| p == ns);
        if id.group.is_empty() && id.kind == "Namespace" && named(&id.name) {
            return Some(format!(
                "namespace {} is the operator's own and no module may write it",
                id.name
            ));
        }
        if id.group == "coordination.k8s.io" && id.kind == "Lease" {
            let labels = object.body.pointer("/metadata/labels");
            if let Some(key) = self
                .lease_labels
                .iter()
                .find(|key| labels.and_then(|l| l.get(key.as_str())).is_some())
            {
                return Some(format!(
                    "a Lease labelled {key} belongs to a module-manager fleet"
                ));
            }
        }
        named(&id.namespace).then(|| {
            format!(
                "namespace {} is the operator's own and no module may write in it",
                id.namespace
            )
        })
    }
}

/// Refuses a render of a Manifest in `manifest_namespace` with any object (CRDs, objects, hooks)
/// the module may not write, naming the first; a target namespace that is protected is refused
/// too (everything namespaced without its own namespace would land in it). A Manifest that
/// lives in a protected namespace itself may write there (whoever may create Manifests in the
/// operator's namespace is its administrator, and a single-namespace setup keeps its Manifests
/// beside its Leases) — but never a fleet's Lease.
pub fn check_protected(
    plan: &Plan,
    target_namespace: &str,
    manifest_namespace: &str,
    protected_all: &Protected,
) -> Result<(), ProtectedError> {
    let protected = Protected {
        namespaces: (protected_all.namespaces.iter())
            .filter(|ns| *ns != manifest_namespace)
            .cloned()
            .collect(),
        lease_labels: protected_all.lease_labels.clone(),
    };
    if protected.namespaces.iter().any(|p| p == target_namespace) {
        return Err(ProtectedError {
            object: format!("target namespace {target_namespace}"),
            why: "it is the operator's own namespace and no module may write in it".to_owned(),
        });
    }
    let all_protected = &protected_all.namespaces;
    let hooks = plan.hooks.iter().map(|h| &h.object);
    for object in plan.crds.iter().chain(&plan.objects).chain(hooks) {
        let id = &object.id;
        let namespace = if id.namespace.is_empty() {
            target_namespace
        } else {
            &id.namespace
        };
        // Not even a Manifest living there may write a Lease there: an unlabelled Lease named
        // like a member's or a shard's would be taken over by the forced apply.
        if id.group == "coordination.k8s.io"
            && id.kind == "Lease"
            && all_protected.iter().any(|p| p == namespace)
        {
            return Err(ProtectedError {
                object: format!("Lease/{namespace}/{}", id.name),
                why: format!(
                    "namespace {namespace} holds the fleet's Leases and no module may write a Lease in it"
                ),
            });
        }
        if let Some(why) = protected.refusal(object) {
            return Err(ProtectedError {
                object: describe(&object.id),
                why,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{parse_documents, plan};

    fn policy(default: Option<&str>, required: bool) -> ServiceAccountPolicy {
        ServiceAccountPolicy {
            default: default.map(str::to_owned),
            required,
            adopt_as_operator: false,
        }
    }

    #[test]
    fn adoption_as_the_operator_needs_the_flag_as_anyone_else_it_is_bounded_by_rbac() {
        let closed = policy(None, false);
        let refused = check_adoption(&Identity::Operator, "team-a", &closed).unwrap_err();
        let message = refused.to_string();
        assert!(
            message.contains("--adopt-as-operator") && message.contains("team-a"),
            "{message}"
        );
        let open = ServiceAccountPolicy {
            adopt_as_operator: true,
            ..closed.clone()
        };
        assert_eq!(check_adoption(&Identity::Operator, "team-a", &open), Ok(()));
        for identity in [account("deployer"), Identity::Kubeconfig] {
            assert_eq!(check_adoption(&identity, "team-a", &closed), Ok(()));
        }
    }

    fn account(name: &str) -> Identity {
        Identity::ServiceAccount(ServiceAccount {
            namespace: "team-a".into(),
            name: name.into(),
        })
    }

    #[test]
    fn the_identity_is_the_manifests_account_then_the_default_then_the_operator() {
        let open = policy(None, false);
        assert_eq!(
            identity(Some("deployer"), false, "team-a", &open),
            Ok(account("deployer"))
        );
        assert_eq!(
            identity(None, false, "team-a", &open),
            Ok(Identity::Operator)
        );
        let defaulted = policy(Some("modules"), false);
        assert_eq!(
            identity(None, false, "team-a", &defaulted),
            Ok(account("modules"))
        );
        assert_eq!(
            identity(Some("deployer"), false, "team-a", &defaulted),
            Ok(account("deployer"))
        );
        let locked = policy(None, true);
        let refused = identity(None, false, "team-a", &locked).unwrap_err();
        assert!(
            refused.to_string().contains("--require-service-account")
                && refused.to_string().contains("team-a"),
            "{refused}"
        );
        // A default satisfies the requirement.
        assert_eq!(
            identity(None, false, "team-a", &policy(Some("modules"), true)),
            Ok(account("modules"))
        );
        if let Identity::ServiceAccount(sa) = account("deployer") {
            assert_eq!(sa.username(), "system:serviceaccount:team-a:deployer");
        }
    }

    #[test]
    fn a_remote_target_keeps_its_kubeconfig_identity() {
        for policy in [policy(None, false), policy(Some("modules"), true)] {
            assert_eq!(
                identity(None, true, "team-a", &policy),
                Ok(Identity::Kubeconfig)
            );
            assert!(matches!(
                identity(Some("deployer"), true, "team-a", &policy),
                Err(IdentityError::WithTarget { .. })
            ));
        }
    }

    fn protected() -> Protected {
        Protected {
            namespaces: vec!["module-manager".into()],
            lease_labels: vec!["modulemanager.io/fleet".into()],
        }
    }

    fn check(yaml: &str, target: &str) -> Result<(), ProtectedError> {
        let plan = plan(parse_documents(yaml).unwrap()).unwrap();
        check_protected(&plan, target, "team-a", &protected())
    }

    #[test]
    fn objects_in_the_operators_namespace_are_refused_by_name() {
        let cm =
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: module-manager\n";
        let refused = check(cm, "team-a").unwrap_err();
        assert_eq!(refused.object, "ConfigMap/module-manager/c");
        assert!(
            refused.to_string().contains("nothing of this render"),
            "{refused}"
        );
        // The same object in the tenant's namespace is fine.
        check(&cm.replace("module-manager", "team-a"), "team-a").unwrap();
        // Without a namespace it lands in the target namespace: a protected one is refused.
        let bare = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n";
        check(bare, "team-a").unwrap();
        let target = check(bare, "module-manager").unwrap_err();
        assert!(target.object.contains("target namespace module-manager"));
        // A hook Job there is refused as well.
        let hook = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\n  namespace: module-manager\n  annotations:\n    helm.sh/hook: pre-install\n";
        assert_eq!(
            check(hook, "team-a").unwrap_err().object,
            "Job/module-manager/j"
        );
    }

    #[test]
    fn the_namespace_itself_and_fleet_leases_anywhere_are_refused() {
        let ns = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: module-manager\n";
        let refused = check(ns, "team-a").unwrap_err();
        assert_eq!(refused.object, "Namespace/module-manager");
        check(&ns.replace("module-manager", "team-b"), "team-a").unwrap();
        let lease = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: fleet-member-x\n  namespace: team-a\n  labels:\n    modulemanager.io/fleet: module-manager\n";
        let refused = check(lease, "team-a").unwrap_err();
        assert!(refused.why.contains("modulemanager.io/fleet"), "{refused}");
        // A Lease of the tenant's own, unlabelled, is fine.
        check(&lease.replace("modulemanager.io/fleet", "app"), "team-a").unwrap();
        // Nothing protected: nothing refused.
        let plan = plan(parse_documents(ns).unwrap()).unwrap();
        check_protected(&plan, "module-manager", "team-a", &Protected::default()).unwrap();
    }

    #[test]
    fn a_manifest_in_the_operators_namespace_may_write_there_but_no_fleet_lease() {
        let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n";
        let own = plan(parse_documents(yaml).unwrap()).unwrap();
        check_protected(&own, "module-manager", "module-manager", &protected()).unwrap();
        // From another namespace, the same target is refused.
        check_protected(&own, "module-manager", "team-a", &protected()).unwrap_err();
        let lease = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: m\n  labels:\n    modulemanager.io/fleet: f\n";
        let leases = plan(parse_documents(lease).unwrap()).unwrap();
        let refused =
            check_protected(&leases, "module-manager", "module-manager", &protected()).unwrap_err();
        assert!(refused.why.contains("fleet"), "{refused}");
        // Nor an unlabelled Lease there, named like a shard's: the forced apply would take it.
        let named =
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: fleet-shard-3\n";
        let named = plan(parse_documents(named).unwrap()).unwrap();
        let refused =
            check_protected(&named, "module-manager", "module-manager", &protected()).unwrap_err();
        assert_eq!(refused.object, "Lease/module-manager/fleet-shard-3");
        // In the tenant's own namespace an unlabelled Lease stays the tenant's business.
        check_protected(&named, "team-a", "team-a", &protected()).unwrap();
    }
}
