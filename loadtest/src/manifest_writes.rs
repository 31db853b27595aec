//! A baseline between the bare client and the fleet: a plain client that sends, per release,
//! the requests the fleet sends per install, in the fleet's order, and nothing else — no
//! render, no queue, no watches, no wait for the rollout, each release's requests back to back.
//! It shows what the Manifest's own writes add to the objects' applies; a fleet that overlaps
//! its passes can be faster than it (docs/benchmarks.md), so it is no lower limit.
//!
//! Per release, as the fleet sends an install whose Deployment has rolled out by the first look
//! at it (docs/reconcile.md, "The rollout wait inside the pass"): the
//! user's create of the Manifest; the claim (one metadata patch: shard label and finalizer);
//! the inventory with its hook run (a status patch); each object server-side applied with
//! the labels the fleet adds; one read of the Deployment (the look); the `Ready` status; one
//! Event. The statuses are built by module-manager's own `plan::status` functions, so they are
//! the size the fleet writes. [`Writes::Minimum`] keeps only the finalizer and the inventory
//! before the applies and a `Ready` status: no read, no Event (the Event is part of today's
//! contract, docs/api.md and docs/reconcile.md).

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context;
use futures::{StreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{EventType, Reporter};
use kube::{Resource, ResourceExt};
use module_manager::api::{HookRun, InventoryEntry, Manifest, ManifestStatus, State};
use module_manager::plan::status::{Facts, Operation, Outcome, Reason, next_status, status_patch};
use module_manager::shard::hash::ShardCount;
use module_manager::telemetry::events::Publisher;
use serde_json::{Value, json};

use crate::baseline::{FIELD_MANAGER, Prepared, Releases, burst, prepare};
use crate::results::Burst;

/// A finalizer of the harness's own: the Manifests are never reconciled, and no controller
/// would remove module-manager's.
const FINALIZER: &str = "loadtest.modulemanager.io/baseline";
/// The `owner` the statuses name.
const OWNER: &str = "loadtest-baseline";

/// What the Manifests of the burst look like (as the fleet's bursts create them).
pub struct Shape<'a> {
    /// `spec.chart`.
    pub chart: &'a Value,
    /// `spec.interval`.
    pub interval: &'a str,
    /// `metadata.labels`.
    pub labels: &'a BTreeMap<String, String>,
    /// More fields of `spec` (a remote target's `target` and `targetNamespace`).
    pub more_spec: Option<&'a Value>,
}

/// For each of `releases` (as many at once as it says), the `writes` of one install ([module
/// docs](self)) against `namespace`; timed from the first request to the last answer.
/// The first error fails the whole, naming the release and the step.
pub async fn bare_with_manifest_writes(
    client: &kube::Client,
    namespace: &str,
    releases: &Releases<'_>,
    shape: &Shape<'_>,
    writes: Writes,
) -> anyhow::Result<Burst> {
    let work = prepare(client, namespace, releases).await?;
    let parallelism = releases.parallelism;
    let local = LocalWrites::new(client, namespace);
    let started = Instant::now();
    let mut installs = stream::iter(work)
        .map(|(release, objects)| {
            let local = &local;
            async move {
                local
                    .install(&release, writes, shape, &objects)
                    .await
                    .with_context(|| format!("release {release}"))
            }
        })
        .buffer_unordered(parallelism.max(1));
    while let Some(done) = installs.next().await {
        done?;
    }
    Ok(burst(parallelism, releases.names.len(), started.elapsed()))
}

/// Where the Manifests of the installs are written, and their Events.
pub struct LocalWrites {
    manifests: Api<Manifest>,
    events: Publisher,
}

impl LocalWrites {
    /// Manifests in `namespace` of `client`'s cluster.
    pub fn new(client: &kube::Client, namespace: &str) -> Self {
        Self {
            manifests: Api::namespaced(client.clone(), namespace),
            events: Publisher::new(
                client.clone(),
                Reporter {
                    controller: OWNER.to_owned(),
                    instance: None,
                },
            ),
        }
    }

    /// One install's `writes` ([module docs](self)): the Manifest `name`, and `objects`
    /// applied wherever they were prepared (a remote target's, for `remote`).
    pub(crate) async fn install(
        &self,
        name: &str,
        writes: Writes,
        shape: &Shape<'_>,
        objects: &[Prepared],
    ) -> anyhow::Result<()> {
        let install = Install {
            manifests: &self.manifests,
            events: &self.events,
            release: name,
            writes,
        };
        install.run(shape, objects).await
    }
}

/// Which requests a release sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writes {
    /// The fleet's requests of an install (10, [module docs](self)).
    Fleet,
    /// The finalizer and the inventory before the applies and a `Ready` status (8): the create;
    /// the claim; the inventory; the applies; one status, `Ready`. No read of the Deployment,
    /// no Event (today's contract has one): a design that waited for the rollout inside its
    /// first pass and published nothing would send this.
    Minimum,
}

/// One release's requests.
struct Install<'a> {
    manifests: &'a Api<Manifest>,
    events: &'a Publisher,
    release: &'a str,
    writes: Writes,
}

impl Install<'_> {
    async fn run(&self, shape: &Shape<'_>, objects: &[Prepared]) -> anyhow::Result<()> {
        let created = self
            .manifests
            .create(&PostParams::default(), &manifest(self.release, shape))
            .await
            .context("create the Manifest")?;
        let uid = created.uid().context("the created Manifest has no UID")?;
        let shard = ShardCount::DEFAULT.shard_of(&uid);
        self.claim(&created, shard).await?;
        let inventory: Vec<InventoryEntry> = objects.iter().map(entry).collect();
        let facts = facts(self.release, inventory.clone(), BTreeMap::new());
        let recorded = ManifestStatus {
            inventory: inventory.clone(),
            hook_run: facts
                .hook_run
                .clone()
                .filter(|_| self.writes == Writes::Fleet),
            ..Default::default()
        };
        // As `reconcile::records::record_inventory` writes it (the hook run: the fleet's).
        let record = match self.writes {
            Writes::Fleet => json!({ "inventory": inventory, "hookRun": recorded.hook_run }),
            Writes::Minimum => json!({ "inventory": inventory }),
        };
        self.patch_status(record)
            .await
            .context("record the inventory")?;
        let learned = apply_labelled(objects, &uid, shard).await?;
        if self.writes == Writes::Fleet {
            look(objects).await?;
        }
        // On a remote target the status keeps a stamp per object (`status.appliedStamps`).
        let remote = shape
            .more_spec
            .is_some_and(|spec| spec.get("target").is_some());
        let stamps = learned.keys().filter(|_| remote);
        let ready = Facts {
            applied_stamps: stamps
                .map(|key| (key.clone(), Some("0".repeat(16))))
                .collect(),
            learned_uids: learned,
            readiness_started: Some(None),
            ..facts
        };
        let outcome = ready_outcome(objects.len());
        let done = status(&recorded, &created, &outcome, &ready, shard);
        // The look patches against the status stored (the first one); `Minimum` against the
        // inventory alone.
        self.patch_status(status_patch(Some(&recorded), &done))
            .await
            .context("write the Ready status")?;
        if self.writes == Writes::Fleet {
            let regarding = created.object_ref(&());
            self.events
                .publish(
                    &regarding,
                    EventType::Normal,
                    "Ready",
                    "Reconcile",
                    &outcome.message,
                )
                .await
                .context("publish the Event")?;
        }
        Ok(())
    }

    /// The claim: shard label and finalizer in one metadata patch, guarded by the
    /// resourceVersion read (as `reconcile::finalizer::claim` writes it).
    async fn claim(&self, created: &Manifest, shard: u32) -> anyhow::Result<()> {
        let patch = json!({"metadata": {
            "labels": {module_manager::shard::SHARD_LABEL: shard.to_string()},
            "finalizers": [FINALIZER],
            "resourceVersion": created.resource_version(),
        }});
        self.manifests
            .patch(self.release, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .context("claim the Manifest")?;
        Ok(())
    }

    async fn patch_status(&self, status: Value) -> anyhow::Result<()> {
        self.manifests
            .patch_status(
                self.release,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await?;
        Ok(())
    }
}

/// The look at the rollout: one read of the Deployment.
async fn look(objects: &[Prepared]) -> anyhow::Result<()> {
    if let Some(deployment) = objects.iter().find(|o| o.kind == "Deployment") {
        deployment
            .api
            .get(&deployment.name)
            .await
            .context("read the Deployment")?;
    }
    Ok(())
}

/// The Manifest the fleet's bursts create for `release`.
fn manifest(release: &str, shape: &Shape<'_>) -> Manifest {
    let mut value = json!({
        "apiVersion": "modulemanager.io/v1alpha1",
        "kind": "Manifest",
        "metadata": {"name": release, "labels": shape.labels},
        "spec": {
            "module": release,
            "chart": shape.chart,
            "values": {"revision": 0},
            "interval": shape.interval,
        }
    });
    for (field, more) in shape
        .more_spec
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        value["spec"][field] = more.clone();
    }
    serde_json::from_value(value).expect("a valid Manifest")
}

/// The inventory entry of a prepared object.
fn entry(object: &Prepared) -> InventoryEntry {
    let body = &object.body;
    let api_version = body["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    InventoryEntry {
        group: group.to_owned(),
        version: version.to_owned(),
        kind: object.kind.clone(),
        namespace: body["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        name: object.name.clone(),
    }
}

/// Applies each object as the fleet's first apply does — with the labels it adds (its
/// Manifest's UID and shard), not forced, only if the object does not exist yet (the
/// resourceVersion of `Guard::Absent`) — in order; the UIDs learned, keyed as
/// `status.inventoryUids` keys them.
async fn apply_labelled(
    objects: &[Prepared],
    uid: &str,
    shard: u32,
) -> anyhow::Result<BTreeMap<String, String>> {
    let params = PatchParams::apply(FIELD_MANAGER);
    let mut learned = BTreeMap::new();
    for object in objects {
        let mut body = object.body.clone();
        let labels = &mut body["metadata"]["labels"];
        labels[module_manager::apply::MANIFEST_UID_LABEL] = json!(uid);
        labels[module_manager::apply::MANIFEST_SHARD_LABEL] = json!(shard.to_string());
        body["metadata"]["resourceVersion"] =
            json!(module_manager::plan::ownership::ABSENT_RESOURCE_VERSION);
        let labelled = Prepared {
            api: object.api.clone(),
            kind: object.kind.clone(),
            name: object.name.clone(),
            body,
        };
        let answer = labelled.apply(&params).await?;
        if let Some(object_uid) = answer.uid() {
            let key = module_manager::plan::ownership::uid_key(&entry(object));
            learned.insert(key, object_uid);
        }
    }
    Ok(learned)
}

/// What an install pass records besides its outcome, of the fleet's sizes: digests, the hook
/// run (done: the chart has no hooks), the target's identity.
fn facts(
    release: &str,
    inventory: Vec<InventoryEntry>,
    learned_uids: BTreeMap<String, String>,
) -> Facts {
    let digest = |what: &str| {
        let hash = module_manager::shard::hash::fnv1a64(format!("{what}/{release}").as_bytes());
        format!("sha256:{}", format!("{hash:016x}").repeat(4))
    };
    let hook_run: HookRun = serde_json::from_value(json!({
        "operation": "Install",
        "inputsDigest": digest("inputs"),
        "generation": 1,
        "id": &digest("id")[7..23],
        "phase": "Done",
        "completed": [],
    }))
    .expect("a valid hook run");
    Facts {
        chart_digest: Some(digest("chart")),
        rendered_digest: Some(digest("rendered")),
        values_digest: Some(digest("values")),
        applied_generation: Some(1),
        inventory: Some(inventory),
        learned_uids,
        applied_stamps: BTreeMap::new(),
        target_identity: Some("00000000-0000-0000-0000-000000000000".to_owned()),
        hook_run: Some(hook_run),
        hook_objects: Some(Vec::new()),
        readiness_started: Some(Some(Time(Timestamp::now()))),
        drift: None,
        upgrade_after: None,
    }
}

/// The look's outcome: everything ready.
fn ready_outcome(objects: usize) -> Outcome {
    Outcome {
        rendered: Some(true),
        applied: Some(true),
        operation: Some(Operation::Install),
        ..Outcome::waiting(
            State::Ready,
            Reason::Ready,
            format!("{objects} objects applied and ready"),
        )
    }
}

fn status(
    previous: &ManifestStatus,
    manifest: &Manifest,
    outcome: &Outcome,
    facts: &Facts,
    shard: u32,
) -> ManifestStatus {
    next_status(
        Some(previous),
        manifest.meta().generation,
        outcome,
        facts.clone(),
        Some(shard),
        OWNER,
        &Time(Timestamp::now()),
    )
}
