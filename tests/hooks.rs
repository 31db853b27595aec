//! Helm hooks (migration steps) on a real kube-apiserver (with the garbage-collector and
//! namespace controllers of kube-controller-manager) and the real helm binary.
//!
//! There is no kubelet and no Job controller (`--controllers` leaves `job` out, so nothing fights
//! the status writes below, and no Pod is ever created — each test checks that): where a hook
//! Job finishes, the test writes its status through the status subresource as the Job
//! controller would, with the fields the API server's Job status validation demands.
//!
//! The chart is `tests/fixtures/charts/hooks`: each test says through values which hooks it
//! renders (name, events, kind, weight, delete policy, timeout).
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use common::Harness;
use std::time::{Duration, Instant};

use common::ready_condition;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, VersionMatch};
use module_manager::api::{HookOperation, HookRun, HookRunPhase, Manifest, ReleaseOutcome, State};
use serde_json::{Value, json};
use test_support::objects;

const REPLICA: &str = "test-replica";
const CHART: &str = "tests/fixtures/charts/hooks";

async fn start(prefix: &str) -> Harness {
    // No `job` controller: the tests play it (it would create Pods and rewrite the status).
    let control_plane = common::control_plane_with(Some(common::BASIC_CONTROLLERS)).await;
    Harness(common::operator_on(control_plane, prefix, 2, |context| context.replica(REPLICA)).await)
}

/// A Job's state as the test sees it.
fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

impl Harness {
    /// Creates a Manifest of the hooks fixture chart with these values.
    async fn create(&self, name: &str, values: Value) {
        self.create_from(name, CHART, values).await;
    }

    /// Creates the Manifest `db` of the hooks fixture chart with `hooks` (no other value).
    async fn create_db(&self, hooks: Value) {
        self.create("db", json!({ "hooks": hooks })).await;
    }

    /// Creates the Manifest `db` of the hooks fixture chart with `hooks` (no other value) and
    /// waits until it is Ready.
    async fn install_db(&self, hooks: Value) {
        self.create_db(hooks).await;
        self.wait_state("db", State::Ready, "Ready").await;
    }

    /// Marks the Deployment `db-app` rolled out, plays the one hook Job that then starts (it
    /// must be `post_hook`) and returns the Manifest `db` once Ready.
    async fn post_hook_after_rollout(&self, post_hook: &str) -> Manifest {
        self.deployment_ready("db-app").await;
        let order = self.run_jobs(1, async |_| {}).await;
        assert_eq!(order, [post_hook]);
        self.wait_state("db", State::Ready, "Ready").await
    }

    async fn create_from(&self, name: &str, chart: &str, values: Value) {
        let spec = common::chart_spec(name, chart, values);
        self.0.create(&common::manifest(&self.ns, name, spec)).await;
    }

    /// Waits for the current generation to be reconciled into `state` with `reason`.
    async fn wait_state(&self, name: &str, state: State, reason: &str) -> Manifest {
        self.wait_for(name, &format!("{state:?} ({reason})"), |m| {
            let status = m.status.clone().unwrap_or_default();
            status.state == Some(state)
                && status.observed_generation == m.metadata.generation
                && ready_condition(m).is_some_and(|(r, _)| r == reason)
        })
        .await
    }

    /// Starts deleting the Manifest `name`: its delete hooks and its finalizer run after.
    async fn start_delete(&self, name: &str) {
        objects::delete(&self.manifests, name).await;
    }

    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn job_names(&self) -> Vec<String> {
        let mut names: Vec<String> = objects::list(&self.jobs())
            .await
            .iter()
            .filter(|j| j.metadata.deletion_timestamp.is_none())
            .map(|j| j.name_any())
            .collect();
        names.sort();
        names
    }

    async fn job_uid(&self, name: &str) -> Option<String> {
        self.jobs()
            .get_opt(name)
            .await
            .unwrap()
            .and_then(|j| j.uid())
    }

    async fn config_map_version(&self, name: &str) -> Option<String> {
        self.config_maps()
            .get_opt(name)
            .await
            .unwrap()
            .and_then(|cm| cm.data?.get("version").cloned())
    }

    /// Waits until some Job has not finished, and returns the names of all such Jobs.
    async fn unfinished_jobs(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let jobs = objects::list(&self.jobs()).await;
            let running: Vec<String> = jobs
                .iter()
                .filter(|j| !finished(j) && j.metadata.deletion_timestamp.is_none())
                .map(|j| j.name_any())
                .collect();
            if !running.is_empty() {
                return running;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for a hook Job to run; Jobs: {:?}",
                jobs.iter().map(|j| j.name_any()).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Plays the Job controller for `count` hook Jobs: each time exactly one Job may be
    /// unfinished; `check` looks at the cluster while it runs; then it is completed. Returns the
    /// Jobs in the order they ran.
    async fn run_jobs(&self, count: usize, mut check: impl AsyncFnMut(&str)) -> Vec<String> {
        let mut order = Vec::new();
        for _ in 0..count {
            let running = self.unfinished_jobs().await;
            assert_eq!(
                running.len(),
                1,
                "one hook at a time; ran so far: {order:?}"
            );
            let name = running.into_iter().next().unwrap();
            check(&name).await;
            self.finish_job(&name, true).await;
            order.push(name);
        }
        order
    }

    /// Writes the status the Job controller writes when a Job's only Pod succeeded (`Complete`)
    /// or the Job ran out of retries (`Failed`). The API server's Job status validation (1.36,
    /// found by trying) demands `startTime` once a Job has finished; for `Complete=True` a
    /// `SuccessCriteriaMet=True` condition and `completionTime`; for `Failed=True` a
    /// `FailureTarget=True` condition and no `completionTime`. The counters (`succeeded`,
    /// `failed`, …) are not demanded; they are written as the controller would.
    async fn finish_job(&self, name: &str, succeeded: bool) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let condition = |kind: &str, reason: &str, message: &str| {
            json!({"type": kind, "status": "True", "reason": reason, "message": message,
                "lastProbeTime": now, "lastTransitionTime": now})
        };
        let (kind, target, reason, message) = if succeeded {
            let reached = "Reached expected number of succeeded pods";
            (
                "Complete",
                "SuccessCriteriaMet",
                "CompletionsReached",
                reached,
            )
        } else {
            let limit = "Job has reached the specified backoff limit";
            ("Failed", "FailureTarget", "BackoffLimitExceeded", limit)
        };
        let mut status = json!({
            "startTime": now,
            "active": 0,
            "ready": 0,
            "terminating": 0,
            "conditions": [condition(target, reason, message), condition(kind, reason, message)],
        });
        if succeeded {
            status["completionTime"] = json!(now);
            status["succeeded"] = json!(1);
        } else {
            status["failed"] = json!(1);
        }
        self.jobs()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .unwrap_or_else(|e| panic!("mark Job {name} finished: {e}"));
    }

    /// Plays the Deployment controller: the Deployment has rolled out.
    async fn deployment_ready(&self, name: &str) {
        common::deployment_rolled_out(&self.client, &self.ns, name, 1).await;
    }

    /// No Pod was ever created: no Job controller ran to fight the test's status writes.
    async fn assert_no_pods(&self) {
        let pods = objects::list(&Api::<Pod>::namespaced(self.client.clone(), &self.ns)).await;
        assert!(pods.is_empty(), "a Job controller is running");
    }
}

/// The Ready condition's (reason, message).
fn hook_run(manifest: &Manifest) -> HookRun {
    manifest
        .status
        .as_ref()
        .and_then(|s| s.hook_run.clone())
        .expect("status.hookRun")
}

/// Asserts that the hook run of `manifest` is `operation`'s and done, and that its last operation
/// is `last`.
fn assert_run_done(manifest: &Manifest, operation: HookOperation, last: &str) {
    let run = hook_run(manifest);
    assert_eq!((run.operation, run.phase), (operation, HookRunPhase::Done));
    let status = manifest.status.as_ref().unwrap();
    assert_eq!(status.last_operation.as_ref().unwrap().operation, last);
}

fn hook_objects(manifest: &Manifest) -> Vec<String> {
    let mut names: Vec<String> = manifest
        .status
        .as_ref()
        .map(|s| {
            s.hook_objects
                .iter()
                .map(|o| format!("{}/{}", o.kind, o.name))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn install_and_upgrade_run_their_hooks_in_order_around_the_objects() {
    let h = start("hook-order").await;
    // Weight first (zz-first), then Helm's kind order at equal weight (the ConfigMap before
    // the Job, although "aa" < "mm"), then the name.
    let hooks = json!([
        {"name": "aa-second", "events": "pre-install,pre-upgrade"},
        {"name": "mm-marker", "kind": "ConfigMap", "events": "pre-install,pre-upgrade"},
        {"name": "zz-first", "events": "pre-install,pre-upgrade", "weight": -5,
         "policy": "before-hook-creation,hook-succeeded"},
        {"name": "post-install", "events": "post-install"},
        {"name": "post-upgrade", "events": "post-upgrade"},
    ]);
    h.create(
        "db",
        json!({"hooks": hooks, "version": "1", "deployment": true}),
    )
    .await;

    // Pre-install: one hook at a time; nothing of the chart is applied meanwhile.
    let order = h
        .run_jobs(2, async |job| {
            assert_eq!(
                h.config_map_version("db-app").await,
                None,
                "{job}: no object before the pre-install hooks are done"
            );
            let marker = h.config_map_version("db-mm-marker").await;
            match job {
                "db-zz-first" => assert_eq!(
                    marker, None,
                    "the ConfigMap hook (weight 0) runs after zz-first (weight -5)"
                ),
                "db-aa-second" => {
                    assert_eq!(
                        marker.as_deref(),
                        Some("1"),
                        "the ConfigMap hook runs before the Job of equal weight (kind order)"
                    );
                    assert!(
                        h.job_uid("db-zz-first").await.is_some(),
                        "zz-first (weight -5) ran before aa-second, and hook-succeeded deletes it only once the whole phase succeeded"
                    );
                }
                other => panic!("unexpected hook Job {other}"),
            }
        })
        .await;
    assert_eq!(order, ["db-zz-first", "db-aa-second"]);

    // The objects, then the post-install hook once they are ready.
    let progressing = h.wait_state("db", State::Processing, "Progressing").await;
    assert_eq!(hook_run(&progressing).phase, HookRunPhase::Objects);
    assert_eq!(h.config_map_version("db-app").await.as_deref(), Some("1"));
    assert!(
        h.job_uid("db-post-install").await.is_none(),
        "post-install waits for the Deployment"
    );
    let installed = h.post_hook_after_rollout("db-post-install").await;
    assert_run_done(&installed, HookOperation::Install, "Install");
    assert_eq!(
        h.job_names().await,
        ["db-aa-second", "db-post-install"],
        "zz-first (hook-succeeded) is deleted; post-upgrade did not run"
    );
    assert_eq!(
        hook_objects(&installed),
        [
            "ConfigMap/db-mm-marker",
            "Job/db-aa-second",
            "Job/db-post-install"
        ],
        "what the policies left is recorded"
    );
    let first_second = h.job_uid("db-aa-second").await.unwrap();
    let post_install = h.job_uid("db-post-install").await.unwrap();

    // Upgrade: the pre-upgrade hooks run again while the old objects stay untouched.
    h.patch_spec(
        "db",
        json!({"values": {"hooks": hooks, "version": "2", "deployment": true}}),
    )
    .await;
    let order = h
        .run_jobs(2, async |job| {
            assert_eq!(
                h.config_map_version("db-app").await.as_deref(),
                Some("1"),
                "{job}: the old objects stay until the pre-upgrade hooks are done"
            );
            let marker = h.config_map_version("db-mm-marker").await;
            let expected = if job == "db-zz-first" { "1" } else { "2" };
            assert_eq!(marker.as_deref(), Some(expected), "{job}");
        })
        .await;
    assert_eq!(order, ["db-zz-first", "db-aa-second"]);
    h.wait_state("db", State::Processing, "Progressing").await;
    assert_eq!(h.config_map_version("db-app").await.as_deref(), Some("2"));
    let upgraded = h.post_hook_after_rollout("db-post-upgrade").await;
    assert_run_done(&upgraded, HookOperation::Upgrade, "Upgrade");
    assert_ne!(
        h.job_uid("db-aa-second").await.unwrap(),
        first_second,
        "before-hook-creation: a new Job"
    );
    assert_eq!(
        h.job_uid("db-post-install").await.unwrap(),
        post_install,
        "post-install does not run on an upgrade"
    );
    h.assert_no_pods().await;
}

/// The releases of `status.history`, newest first: revision and outcome.
fn releases(manifest: &Manifest) -> Vec<(u32, ReleaseOutcome)> {
    let status = manifest.status.clone().unwrap_or_default();
    status
        .history
        .iter()
        .map(|r| (r.revision, r.outcome))
        .collect()
}

#[tokio::test]
async fn a_failed_or_timed_out_pre_upgrade_hook_stops_the_upgrade() {
    let h = start("hook-failure").await;
    let migrate = json!([{"name": "migrate", "events": "pre-upgrade", "policy": "hook-failed"}]);
    h.create("db", json!({"hooks": migrate, "version": "1"}))
        .await;
    // An install runs no pre-upgrade hook.
    let installed = h.wait_state("db", State::Ready, "Ready").await;
    assert_eq!(hook_run(&installed).operation, HookOperation::Install);
    assert!(h.job_names().await.is_empty());
    let inventory = installed.status.clone().unwrap().inventory;
    // The release history: each run of new inputs is a release, and how it ended.
    let first = &installed.status.clone().unwrap().history[0];
    assert_eq!(first.operation, HookOperation::Install);
    assert_eq!(
        first.chart_digest,
        installed.status.clone().unwrap().chart_digest
    );
    assert_eq!(releases(&installed), [(1, ReleaseOutcome::Succeeded)]);

    // The migration fails: nothing of version 2 is applied, the Job is deleted (hook-failed).
    h.patch_spec("db", json!({"values": {"hooks": migrate, "version": "2"}}))
        .await;
    let running = h.unfinished_jobs().await;
    assert_eq!(running, ["db-migrate"]);
    h.finish_job("db-migrate", false).await;
    let failed = h.wait_state("db", State::Error, "HookFailed").await;
    let (_, message) = ready_condition(&failed).unwrap();
    assert!(
        message.contains("pre-upgrade hook Job db-migrate failed: BackoffLimitExceeded"),
        "{message}"
    );
    let status = failed.status.clone().unwrap();
    assert_eq!(status.inventory, inventory, "the inventory is kept");
    assert_eq!(
        hook_run(&failed).phase,
        HookRunPhase::Failed,
        "recorded: the next pass does not run it again"
    );
    assert_eq!(h.config_map_version("db-app").await.as_deref(), Some("1"));
    assert_eq!(
        releases(&failed),
        [(2, ReleaseOutcome::Failed), (1, ReleaseOutcome::Succeeded)]
    );
    let failure = status.history[0].message.clone().unwrap_or_default();
    assert!(failure.contains("db-migrate"), "{failure}");
    assert_ne!(
        status.history[0].values_digest, status.history[1].values_digest,
        "a release never shows another's values"
    );
    h.wait_until("the failed Job is deleted", async || {
        h.job_names().await.is_empty()
    })
    .await;
    assert!(hook_objects(&h.manifests.get("db").await.unwrap()).is_empty());
    common::expect_event(&h.client, &h.ns, "db", |kind, reason, note| {
        kind == "Warning" && reason == "HookFailed" && note.contains("db-migrate")
    })
    .await;

    // A spec change retries the run (here one that leaves the inputs alone).
    h.patch_spec("db", json!({"interval": "3s"})).await;
    assert_eq!(h.unfinished_jobs().await, ["db-migrate"]);
    h.finish_job("db-migrate", true).await;
    let retried = h.wait_state("db", State::Ready, "Ready").await;
    assert_eq!(h.config_map_version("db-app").await.as_deref(), Some("2"));
    let three = [
        (3, ReleaseOutcome::Succeeded),
        (2, ReleaseOutcome::Failed),
        (1, ReleaseOutcome::Succeeded),
    ];
    assert_eq!(
        releases(&retried),
        three,
        "the retry is a release of its own"
    );
    assert_eq!(
        h.job_names().await,
        ["db-migrate"],
        "hook-failed only: kept after success"
    );

    // Bad input loses nothing: a render error leaves the finished run as it was, and going back
    // to the same inputs runs no hook again (a new run would refuse the kept Job: it lacks
    // before-hook-creation).
    let done = hook_run(&h.manifests.get("db").await.unwrap());
    let migrated = h.job_uid("db-migrate").await;
    h.patch_spec(
        "db",
        json!({"chart": {"path": "tests/fixtures/charts/template-error"}}),
    )
    .await;
    let broken = h.wait_state("db", State::Error, "RenderError").await;
    assert_eq!(hook_run(&broken), done);
    assert_eq!(
        releases(&broken),
        three,
        "a render error fails no release: the succeeded one stays"
    );
    h.patch_spec("db", json!({"chart": {"path": CHART}})).await;
    let back = h.wait_state("db", State::Ready, "Ready").await;
    assert_eq!(h.job_uid("db-migrate").await, migrated, "not run again");
    assert_eq!(
        releases(&back),
        three,
        "a failed render and the same inputs again: no release"
    );

    // A hook that does not finish within its timeout fails the same way.
    let slow = json!([{"name": "slow", "events": "pre-upgrade", "timeout": "2s"}]);
    h.patch_spec("db", json!({"values": {"hooks": slow, "version": "3"}}))
        .await;
    let timed_out = h.wait_state("db", State::Error, "HookFailed").await;
    assert_eq!(
        releases(&timed_out)[..2],
        [(4, ReleaseOutcome::Failed), three[0]]
    );
    let (_, message) = ready_condition(&timed_out).unwrap();
    assert!(
        message.contains("pre-upgrade hook Job/") && message.contains("did not finish within 2s"),
        "{message}"
    );
    assert_eq!(h.config_map_version("db-app").await.as_deref(), Some("2"));
    assert!(
        h.job_uid("db-slow").await.is_some(),
        "no hook-failed policy: the Job stays for a person to look at"
    );
    h.assert_no_pods().await;
}

#[tokio::test]
async fn delete_hooks_run_around_the_deletion_and_no_hook_object_is_left() {
    let h = start("hook-delete").await;
    let hooks = json!([
        {"name": "setup", "events": "pre-install"},
        {"name": "drain", "events": "pre-delete"},
        {"name": "goodbye", "events": "post-delete", "policy": "hook-succeeded"},
    ]);
    h.create_db(hooks).await;
    assert_eq!(h.run_jobs(1, async |_| {}).await, ["db-setup"]);
    let installed = h.wait_state("db", State::Ready, "Ready").await;
    assert_eq!(hook_objects(&installed), ["Job/db-setup"]);

    h.start_delete("db").await;
    let order = h
        .run_jobs(2, async |job| {
            let app = h.config_map_version("db-app").await;
            if job == "db-drain" {
                assert!(app.is_some(), "pre-delete runs before the objects go");
                let deleting = h
                    .wait_for("db", "Deleting (HookRunning)", |m| {
                        ready_condition(m).is_some_and(|(reason, _)| reason == "HookRunning")
                    })
                    .await;
                assert_eq!(deleting.status.unwrap().state, Some(State::Deleting));
            } else {
                assert!(app.is_none(), "post-delete runs once the objects are gone");
            }
        })
        .await;
    assert_eq!(order, ["db-drain", "db-goodbye"]);
    common::wait_for_gone(&h.manifests, "db").await;
    assert!(
        h.job_names().await.is_empty(),
        "every hook Job is deleted with the Manifest"
    );
    assert_eq!(h.config_map_version("db-app").await, None);
    h.assert_no_pods().await;
}

#[tokio::test]
async fn the_ledger_example_migrates_its_data_before_the_upgrade() {
    let h = start("hook-ledger").await;
    h.create_from("ledger", "examples/charts/ledger-v1", json!({}))
        .await;
    h.wait_for("ledger", "rolling out", common::rolling_out)
        .await;
    h.deployment_ready("ledger").await;
    h.wait_state("ledger", State::Ready, "Ready").await;
    let schema = async || {
        h.config_maps()
            .get("ledger")
            .await
            .unwrap()
            .data
            .unwrap()
            .get("schemaVersion")
            .cloned()
    };
    assert_eq!(schema().await.as_deref(), Some("1"));
    assert!(
        h.job_names().await.is_empty(),
        "an install runs no migration"
    );

    h.patch_spec(
        "ledger",
        json!({"chart": {"path": "examples/charts/ledger-v2"}}),
    )
    .await;
    let order = h
        .run_jobs(1, async |_| {
            assert_eq!(
                schema().await.as_deref(),
                Some("1"),
                "version 1 until migrated"
            );
            assert!(
                objects::exists(&h.config_maps(), "ledger-migration").await,
                "the script (weight -5) comes before the Job"
            );
        })
        .await;
    assert_eq!(order, ["ledger-migrate"]);
    h.wait_state("ledger", State::Processing, "Progressing")
        .await;
    assert_eq!(schema().await.as_deref(), Some("2"));
    h.deployment_ready("ledger").await;
    let upgraded = h.wait_state("ledger", State::Ready, "Ready").await;
    assert!(hook_objects(&upgraded).is_empty(), "hook-succeeded");
    assert!(h.job_names().await.is_empty());
    assert!(!objects::exists(&h.config_maps(), "ledger-migration").await);
    h.assert_no_pods().await;
}

#[tokio::test]
async fn a_manifest_whose_chart_is_gone_is_deleted_without_its_delete_hooks() {
    let h = start("hook-skip").await;
    h.install_db(json!([{"name": "drain", "events": "pre-delete"}]))
        .await;
    h.patch_spec(
        "db",
        json!({"chart": {"path": "tests/fixtures/charts/nope"}}),
    )
    .await;
    h.wait_state("db", State::Error, "ChartError").await;

    h.start_delete("db").await;
    common::wait_for_gone(&h.manifests, "db").await;
    assert_eq!(
        h.config_map_version("db-app").await,
        None,
        "objects deleted"
    );
    assert!(h.job_names().await.is_empty(), "no delete hook ran");
    for event in ["pre-delete", "post-delete"] {
        common::expect_event(&h.client, &h.ns, "db", |kind, reason, note| {
            kind == "Warning"
                && reason == "HookSkipped"
                && note.starts_with(&format!("{event} hooks not run: "))
                && note.contains("does not exist")
        })
        .await;
    }
}

#[tokio::test]
async fn a_hook_started_by_a_pass_that_did_not_record_it_is_adopted_not_run_again() {
    let h = start("hook-adopt").await;
    h.create_db(json!([{"name": "migrate", "events": "pre-install"}]))
        .await;
    assert_eq!(h.unfinished_jobs().await, ["db-migrate"]);
    let running = |m: &Manifest| {
        m.status
            .as_ref()
            .and_then(|s| s.hook_run.as_ref())
            .and_then(|r| r.running.clone())
    };
    let started = h
        .wait_for("db", "the hook recorded as running", |m| {
            running(m).is_some()
        })
        .await;
    let uid = h.job_uid("db-migrate").await.unwrap();
    assert_eq!(running(&started).unwrap().uid, uid);
    let stamp = h
        .jobs()
        .get("db-migrate")
        .await
        .unwrap()
        .annotations()
        .get("modulemanager.io/hook-run")
        .cloned();
    assert_eq!(
        stamp,
        Some(format!("pre-install/{}", hook_run(&started).id)),
        "stamped with its run"
    );

    // The status write that recorded the start is lost (a crash, a lost shard): the status says
    // no run started. The next pass finds the Job stamped for the run it computes again.
    objects::merge_status(&h.manifests, "db", json!({"status": {"hookRun": null}})).await;
    let adopted = h
        .wait_for("db", "the hook recorded again", |m| running(m).is_some())
        .await;
    assert_eq!(
        running(&adopted).unwrap().uid,
        uid,
        "the running Job is adopted, not deleted and started again"
    );
    let job = h.jobs().get("db-migrate").await.unwrap();
    assert_eq!(job.uid().as_deref(), Some(uid.as_str()));
    assert!(job.metadata.deletion_timestamp.is_none());
    assert_eq!(
        running(&adopted).unwrap().started,
        job.metadata.creation_timestamp.unwrap(),
        "its timeout counts from its creation"
    );

    h.finish_job("db-migrate", true).await;
    h.wait_state("db", State::Ready, "Ready").await;
    assert_eq!(
        h.job_uid("db-migrate").await,
        Some(uid),
        "ran once: never deleted nor re-created"
    );
    h.assert_no_pods().await;
}

#[tokio::test]
async fn the_next_phase_is_saved_before_hook_succeeded_objects_are_deleted() {
    let h = start("hook-save").await;
    h.create_db(json!([{"name": "migrate", "events": "pre-install", "policy": "hook-succeeded"}]))
        .await;
    assert_eq!(h.unfinished_jobs().await, ["db-migrate"]);
    // Held once deleted, so that the test can read when it was deleted.
    let hold = "test.modulemanager.io/hold";
    objects::merge(
        &h.jobs(),
        "db-migrate",
        json!({"metadata": {"finalizers": [hold]}}),
    )
    .await;
    h.finish_job("db-migrate", true).await;
    let mut deleted = None;
    h.wait_until("the succeeded hook Job is deleted", async || {
        let job = h.jobs().get("db-migrate").await.unwrap();
        let gone = job.metadata.deletion_timestamp.is_some();
        deleted = Some(job);
        gone
    })
    .await;
    // Nothing writes the held Job after its delete: its resourceVersion is the delete's. The
    // Manifest as stored at that very revision must already have left the phase: a pass that
    // ends after the delete without writing its status must not look for the Job again.
    let revision = deleted.unwrap().resource_version().unwrap();
    let at_delete = h
        .manifests
        .list(
            &ListParams::default()
                .at(&revision)
                .matching(VersionMatch::Exact),
        )
        .await
        .unwrap();
    let manifest = at_delete
        .items
        .iter()
        .find(|m| m.name_any() == "db")
        .unwrap();
    let run = hook_run(manifest);
    assert_eq!(
        (run.operation, run.phase),
        (HookOperation::Install, HookRunPhase::Objects),
        "saved before the delete"
    );
    objects::merge(
        &h.jobs(),
        "db-migrate",
        json!({"metadata": {"finalizers": null}}),
    )
    .await;
    h.wait_state("db", State::Ready, "Ready").await;
    h.assert_no_pods().await;
}

#[tokio::test]
async fn deleting_the_namespace_of_a_manifest_with_delete_hooks_does_not_hang() {
    let h = start("hook-ns").await;
    let hooks = json!([
        {"name": "drain", "events": "pre-delete"},
        {"name": "goodbye", "events": "post-delete"},
    ]);
    h.install_db(hooks).await;
    assert!(h.job_names().await.is_empty());

    // The namespace holds the Manifest and is its target namespace: its delete hooks cannot be
    // created there any more (403), and the namespace waits for the Manifest's finalizer.
    let namespaces = Api::<Namespace>::all(h.client.clone());
    objects::delete(&namespaces, &h.ns).await;
    common::wait_for_gone(&h.manifests, "db").await;
    assert!(
        h.job_names().await.is_empty(),
        "no delete hook was created in the terminating namespace"
    );
    h.wait_until("the namespace is gone", async || {
        namespaces.get_opt(&h.ns).await.unwrap().is_none()
    })
    .await;
}

#[tokio::test]
async fn a_reset_runs_a_failed_hook_again_without_a_spec_change() {
    use module_manager::api::RESET_REQUESTED_AT;
    let h = start("hook-reset").await;
    // The migration needs a ConfigMap `db-schema`: the test, playing the Job controller, fails
    // the Job while it does not exist.
    let migrate =
        json!([{"name": "migrate", "events": "pre-install", "policy": "before-hook-creation"}]);
    h.create("db", json!({"hooks": migrate, "version": "1"}))
        .await;
    let schema_exists = async || {
        h.config_maps()
            .get_opt("db-schema")
            .await
            .unwrap()
            .is_some()
    };
    assert_eq!(h.unfinished_jobs().await, ["db-migrate"]);
    let first = h.job_uid("db-migrate").await;
    h.finish_job("db-migrate", schema_exists().await).await;
    let failed = h.wait_state("db", State::Error, "HookFailed").await;
    assert_eq!(hook_run(&failed).phase, HookRunPhase::Failed);
    assert_eq!(
        h.config_map_version("db-app").await,
        None,
        "nothing installed"
    );

    // The cause is fixed outside the Manifest; passes (every 2 s) keep the run failed.
    objects::create_json(&h.config_maps(), json!({"metadata": {"name": "db-schema"}})).await;
    common::annotate(&h.manifests, "db", RESET_REQUESTED_AT, "r1").await;
    // The reset: the hook runs again (a new Job in place of the failed one), then the install.
    h.wait_until("the hook Job is started again", async || {
        let uid = h.job_uid("db-migrate").await;
        uid.is_some() && uid != first
    })
    .await;
    assert_eq!(h.unfinished_jobs().await, ["db-migrate"]);
    h.finish_job("db-migrate", schema_exists().await).await;
    let ready = h.wait_state("db", State::Ready, "Ready").await;
    let status = ready.status.clone().unwrap();
    assert_eq!(status.last_handled_reset_at.as_deref(), Some("r1"));
    assert_eq!(hook_run(&ready).operation, HookOperation::Install);
    assert_eq!(h.config_map_version("db-app").await.as_deref(), Some("1"));
    assert_eq!(
        ready.metadata.generation, failed.metadata.generation,
        "no spec change"
    );
    h.assert_no_pods().await;
}

#[tokio::test]
async fn a_reset_runs_a_failed_delete_hook_again_and_the_deletion_completes() {
    use module_manager::api::RESET_REQUESTED_AT;
    let h = start("hook-delete-reset").await;
    h.install_db(json!([{"name": "drain", "events": "pre-delete"}]))
        .await;
    h.start_delete("db").await;
    assert_eq!(h.unfinished_jobs().await, ["db-drain"]);
    let first = h.job_uid("db-drain").await;
    h.finish_job("db-drain", false).await;
    let failed = h
        .wait_for("db", "the delete hook failed", |m| {
            m.status
                .as_ref()
                .and_then(|s| s.hook_run.as_ref())
                .is_some_and(|r| {
                    r.operation == HookOperation::Delete && r.phase == HookRunPhase::Failed
                })
        })
        .await;
    assert_eq!(failed.status.unwrap().state, Some(State::Error));
    assert_eq!(
        h.config_map_version("db-app").await.as_deref(),
        Some("1"),
        "the deletion stopped before the objects"
    );

    common::annotate(&h.manifests, "db", RESET_REQUESTED_AT, "r1").await;
    h.wait_until("the delete hook Job is started again", async || {
        let uid = h.job_uid("db-drain").await;
        uid.is_some() && uid != first
    })
    .await;
    h.finish_job("db-drain", true).await;
    common::wait_for_gone(&h.manifests, "db").await;
    assert_eq!(h.config_map_version("db-app").await, None);
    h.assert_no_pods().await;
}
