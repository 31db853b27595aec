//! Ownership on the wire: [`apply_owned`], which writes a module's object only if it is this
//! Manifest's, its precondition carried by the apply (`precondition.rs`) (docs/reconcile.md,
//! "Adoption and ownership").

use kube::ResourceExt;
use kube::api::DynamicObject;

use super::adoption::Owners;
use super::labels::MANIFEST_UID_LABEL;
use super::{ApplyError, Cluster};
use crate::plan::ownership::{self, Adoption, Decision, Guard, Live};
use crate::plan::{RenderedObject, describe};

/// Applies a module's object only if it is this Manifest's (`manifest_uid`): under its
/// recorded UID, or — new to the inventory — only if it does not exist yet. When the API server
/// refuses, one read decides ([`ownership::decide`]): an object that is gone is created again,
/// one labelled as this Manifest's is taken over as read (its UID and resourceVersion in the
/// body), anything else is refused and nothing is written — unless the pass may adopt (`adopt`,
/// `spec.adopt`): then an unlabelled object is taken over as read too, and one labelled as
/// another Manifest's once that Manifest is found gone ([`Owners::gone`]).
pub async fn apply_owned(
    cluster: &Cluster,
    object: &RenderedObject,
    manifest_uid: &str,
    recorded_uid: Option<&str>,
    adopt: Option<&Owners>,
) -> Result<DynamicObject, ApplyError> {
    let guard = ownership::first_guard(recorded_uid);
    match cluster.apply_guarded(object, manifest_uid, &guard).await {
        Err(ApplyError::PreconditionFailed(_)) => {}
        answer => return answer,
    }
    let live = cluster.get(&object.id).await?;
    let seen = live.as_ref().map(|live| Live {
        uid: live.metadata.uid.as_deref().unwrap_or_default(),
        resource_version: live
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default(),
        owner: live.labels().get(MANIFEST_UID_LABEL).map(String::as_str),
    });
    let name = describe(&object.id);
    let adoption = match adopt {
        None => Adoption::Off,
        Some(_) => Adoption::On,
    };
    let mut decision = ownership::decide(recorded_uid, seen, manifest_uid, adoption);
    if let (Some(owners), Decision::NotOwned { owner: Some(owner) }) = (adopt, &decision)
        && owners.gone(owner).await?
    {
        decision = ownership::decide(recorded_uid, seen, manifest_uid, Adoption::OwnerGone);
    }
    let previous_owner = seen.and_then(|live| live.owner);
    match decision {
        Decision::Apply(guard) => {
            let adopting =
                matches!(guard, Guard::Read { .. }) && previous_owner != Some(manifest_uid);
            let answer = match cluster.apply_guarded(object, manifest_uid, &guard).await {
                Err(ApplyError::PreconditionFailed(_)) => Err(ApplyError::Changed(name.clone())),
                answer => answer,
            };
            if adopting && answer.is_ok() {
                let from = previous_owner.map_or_else(
                    || "labelled by no Manifest".to_owned(),
                    |owner| format!("labelled as the Manifest with UID {owner}'s, which is gone"),
                );
                tracing::info!(object = %name, %from, "adopted (spec.adopt)");
            }
            answer
        }
        Decision::NotOwned { owner: None } => Err(ApplyError::NotOwned(name)),
        Decision::NotOwned { owner: Some(owner) } if adopt.is_some() => {
            Err(ApplyError::OwnerExists {
                object: name,
                owner,
            })
        }
        Decision::NotOwned { owner: Some(owner) } => Err(ApplyError::OwnedByAnother {
            object: name,
            owner,
        }),
        Decision::Replaced { owner } => Err(ApplyError::Replaced {
            object: name,
            owner: match owner {
                Some(owner) if owner == manifest_uid => {
                    "labelled as this Manifest's, but not the object it created".into()
                }
                Some(owner) => format!("labelled as the Manifest with UID {owner}'s"),
                None => "unlabelled".into(),
            },
        }),
    }
}
