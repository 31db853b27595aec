//! The admin API's typed JSON answers, and how they are built from the fleet's views (pure).

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::api::{Manifest, State as ManifestState};
use crate::shard::ShardCount;
use crate::shard::fleet::{FleetView, ShardView};
use crate::shard::membership::{MemberState, Members};
use crate::work::queue::QueueSnapshot;

/// Every error answer: `{"error": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorAnswer {
    /// What went wrong.
    pub error: String,
}

/// `GET /v1/shards`: the fleet-wide view from the replica answering.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardsAnswer {
    /// Fleet name.
    pub fleet: String,
    /// The replica answering.
    pub replica: String,
    /// Number of virtual shards (0 before the replica's first shard round).
    pub shard_count: u32,
    /// The StatefulSet's desired replicas, when the fleet follows one.
    pub desired_replicas: Option<u32>,
    /// Whether the replica answering has stopped acting (its renew deadline passed).
    pub self_fenced: bool,
    /// The members the shards are assigned to.
    pub assigned: Vec<String>,
    /// Every shard (empty until the first round).
    pub shards: Vec<ShardView>,
    /// Per member (and per shard holder without a membership Lease).
    pub members: Vec<MemberSummary>,
}

/// One member in `GET /v1/shards`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberSummary {
    /// The replica.
    pub name: String,
    /// Whether its membership Lease changed within the lease duration.
    pub live: bool,
    /// What it announces; `None`: it holds shards but has no membership Lease.
    pub state: Option<MemberState>,
    /// Shards whose Lease it holds.
    pub shards: u32,
    /// Shards the assignment gives it.
    pub desired_shards: u32,
    /// Manifests due and waiting for a worker, as it last published.
    pub queued: Option<u64>,
    /// Manifests queued for a later time (re-checks, retries), as it last published.
    #[serde(default)]
    pub scheduled: Option<u64>,
    /// When its next scheduled Manifest is due (its clock), as it last published.
    #[serde(default)]
    pub next_due: Option<Timestamp>,
    /// Reconcile passes running, as it last published.
    pub in_flight: Option<u64>,
    /// Manifests in its cache, as it last published.
    pub manifests: Option<u64>,
}

/// `GET /v1/queue`: the answering replica's queue and every member's published load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueAnswer {
    /// The replica answering (empty before its first shard round).
    pub replica: String,
    /// Its queue now.
    pub queue: QueueSnapshot,
    /// Every member's load as it last published on its membership Lease.
    pub members: Vec<MemberQueue>,
}

/// One member's published load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberQueue {
    /// The replica.
    pub name: String,
    /// Whether its membership Lease changed within the lease duration.
    pub live: bool,
    /// What it announces.
    pub state: MemberState,
    /// Manifests due and waiting for a worker (`None`: nothing published).
    pub queued: Option<u64>,
    /// Manifests queued for a later time (re-checks, retries).
    #[serde(default)]
    pub scheduled: Option<u64>,
    /// When its next scheduled Manifest is due (its clock).
    #[serde(default)]
    pub next_due: Option<Timestamp>,
    /// Reconcile passes running.
    pub in_flight: Option<u64>,
    /// Manifests in its cache.
    pub manifests: Option<u64>,
}

/// Where `GET /v1/manifests/{namespace}/{name}` found the Manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ManifestSource {
    /// The answering replica's watch cache (it owns the shard, or the Manifest is new).
    Cache,
    /// The API server (another replica owns the shard).
    Api,
}

/// `GET /v1/manifests/{namespace}/{name}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestAnswer {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// Its shard, from the UID (`None` before the answering replica's first shard round).
    pub shard: Option<u32>,
    /// The holder of the shard's Lease in the fleet view.
    pub owner: Option<String>,
    /// `status.state`.
    pub state: Option<ManifestState>,
    /// The `Ready` condition's reason.
    pub reason: Option<String>,
    /// The `Ready` condition's message.
    pub message: Option<String>,
    /// Where it was found.
    pub source: ManifestSource,
}

/// `POST`/`DELETE /v1/drain`: the drain switch after the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainAnswer {
    /// Whether the replica hands every shard over and takes none.
    pub draining: bool,
}

/// The `GET /v1/shards` answer from a fleet view.
pub fn shards_answer(view: &FleetView) -> ShardsAnswer {
    ShardsAnswer {
        fleet: view.fleet.clone(),
        replica: view.replica.clone(),
        shard_count: view.shard_count,
        desired_replicas: view.desired_replicas,
        self_fenced: view.self_fenced,
        assigned: view.assigned.clone(),
        shards: view.shards.clone(),
        members: member_summary(view),
    }
}

/// Per member: shards held and desired, and the published load; shard holders without a
/// membership Lease are listed too (not live, no state), by name.
pub fn member_summary(view: &FleetView) -> Vec<MemberSummary> {
    let mut by_name: BTreeMap<&str, MemberSummary> = view
        .members
        .iter()
        .map(|m| {
            let load = m.load.as_ref();
            (
                m.name.as_str(),
                MemberSummary {
                    name: m.name.clone(),
                    live: m.live,
                    state: Some(m.state),
                    shards: 0,
                    desired_shards: 0,
                    queued: load.map(|l| l.queued),
                    scheduled: load.map(|l| l.scheduled),
                    next_due: load.and_then(|l| l.next_due),
                    in_flight: load.map(|l| l.in_flight),
                    manifests: load.map(|l| l.manifests),
                },
            )
        })
        .collect();
    let unknown = |name: &str| MemberSummary {
        name: name.to_owned(),
        live: false,
        state: None,
        shards: 0,
        desired_shards: 0,
        queued: None,
        scheduled: None,
        next_due: None,
        in_flight: None,
        manifests: None,
    };
    for shard in &view.shards {
        if let Some(owner) = shard.owner.as_deref() {
            by_name
                .entry(owner)
                .or_insert_with(|| unknown(owner))
                .shards += 1;
        }
        if let Some(desired) = shard.desired_owner.as_deref() {
            by_name
                .entry(desired)
                .or_insert_with(|| unknown(desired))
                .desired_shards += 1;
        }
    }
    by_name.into_values().collect()
}

/// The `GET /v1/queue` answer.
pub fn queue_answer(replica: String, queue: QueueSnapshot, members: &Members) -> QueueAnswer {
    QueueAnswer {
        replica,
        queue,
        members: members
            .members
            .iter()
            .map(|m| {
                let load = m.load.as_ref();
                MemberQueue {
                    name: m.name.clone(),
                    live: m.live,
                    state: m.state,
                    queued: load.map(|l| l.queued),
                    scheduled: load.map(|l| l.scheduled),
                    next_due: load.and_then(|l| l.next_due),
                    in_flight: load.map(|l| l.in_flight),
                    manifests: load.map(|l| l.manifests),
                }
            })
            .collect(),
    }
}

/// The `GET /v1/manifests/{namespace}/{name}` answer: the shard from the UID, its owner from the
/// fleet view, state and the `Ready` condition from the status.
pub fn manifest_answer(
    manifest: &Manifest,
    source: ManifestSource,
    view: &FleetView,
) -> ManifestAnswer {
    let uid = manifest.uid();
    let shard = ShardCount::new(view.shard_count)
        .zip(uid.as_deref())
        .map(|(count, uid)| count.shard_of(uid));
    let owner = shard.and_then(|k| {
        view.shards
            .iter()
            .find(|s| s.shard == k)
            .and_then(|s| s.owner.clone())
    });
    let status = manifest.status.as_ref();
    let ready = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    ManifestAnswer {
        namespace: manifest.namespace().unwrap_or_default(),
        name: manifest.name_any(),
        uid,
        shard,
        owner,
        state: status.and_then(|s| s.state),
        reason: ready.map(|c| c.reason.clone()).filter(|r| !r.is_empty()),
        message: ready.map(|c| c.message.clone()).filter(|m| !m.is_empty()),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::testing::fleet;
    use crate::work::queue::WorkQueue;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn the_queue_answer_has_the_snapshot_and_every_members_load() {
        let queue: WorkQueue<&str> = WorkQueue::default();
        queue.add("a", Duration::ZERO);
        queue.add("b", Duration::from_secs(60));
        let members = Members {
            members: fleet().members,
            self_renewed: true,
            renewed_at: None,
        };
        let answer = queue_answer("mm-0".into(), queue.snapshot(), &members);
        let json = serde_json::to_value(&answer).unwrap();
        assert_eq!(json["replica"], "mm-0");
        assert_eq!(
            (
                &json["queue"]["depth"],
                &json["queue"]["in_flight"],
                &json["queue"]["scheduled"]
            ),
            (&json!(1), &json!(0), &json!(1))
        );
        assert!(json["queue"]["next_due_in_seconds"].as_f64().unwrap() > 59.0);
        assert_eq!(json["queue"]["shards"]["0"]["depth"], 1);
        assert_eq!(json["queue"]["shards"]["0"]["scheduled"], 1);
        assert_eq!(
            json["members"],
            json!([
                {"name": "mm-0", "live": true, "state": "active", "queued": 2, "scheduled": 7, "next_due": "2026-12-01T12:00:00Z", "in_flight": 1, "manifests": 10},
                {"name": "mm-1", "live": true, "state": "draining", "queued": null, "scheduled": null, "next_due": null, "in_flight": null, "manifests": null},
            ])
        );
        // The command line reads back what the server writes.
        assert_eq!(serde_json::from_value::<QueueAnswer>(json).unwrap(), answer);
    }

    fn a_manifest(status: serde_json::Value) -> Manifest {
        serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": "web", "namespace": "default", "uid": "a"},
            "spec": {"module": "web", "chart": {"path": "web"}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_manifest_answer_has_the_shard_from_the_uid_and_its_owner() {
        let manifest = a_manifest(json!({
            "state": "Error",
            "conditions": [
                {"type": "Rendered", "status": "False", "reason": "RenderError", "message": "boom", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Ready", "status": "False", "reason": "RenderError", "message": "template: boom", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
        }));
        // fnv1a64("a") = 0xaf63…: shard 2 of 4 (top two bits 10).
        let answer = manifest_answer(&manifest, ManifestSource::Api, &fleet());
        assert_eq!(
            serde_json::to_value(&answer).unwrap(),
            json!({"namespace": "default", "name": "web", "uid": "a", "shard": 2, "owner": null,
                   "state": "Error", "reason": "RenderError", "message": "template: boom", "source": "api"})
        );
        let view = FleetView {
            shard_count: 2,
            ..fleet()
        };
        let answer = manifest_answer(&a_manifest(json!({})), ManifestSource::Cache, &view);
        assert_eq!(
            (answer.shard, answer.owner.as_deref()),
            (Some(1), Some("mm-1"))
        );
        assert_eq!((answer.state, answer.reason), (None, None));
        // Before the first round the shard count is unknown.
        let answer = manifest_answer(&manifest, ManifestSource::Cache, &FleetView::default());
        assert_eq!((answer.shard, answer.owner), (None, None));
    }
}
