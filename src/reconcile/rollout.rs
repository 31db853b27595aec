//! Rollouts in batches, the I/O ([`plan::rollout`] decides): a Manifest of a rollout group that
//! would move its module to a new chart first asks the rollout object — one ConfigMap per
//! (namespace, group, chart) in the fleet's own namespace, written by whichever replica's pass
//! gets there first, every write conditional on the resourceVersion read — whether it may.
//! Admitted, it upgrades; else it waits (`Processing`, reason `RolloutWaiting` or
//! `RolloutPaused`) and looks again every `--rollout-check-seconds`. At most one look a check
//! period lists the group's Manifests to judge the newest batch.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{Timestamp, Unit};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};

use super::context::Context;
use super::error::ReconcileError;
use super::pass::Pass;
use crate::api::{Manifest, State};
use crate::plan::history::chart_reference;
use crate::plan::rollout::{
    self, Asking, BatchCheck, Checked, Decision, GROUP_LABEL, PAUSED_ANNOTATION, RolloutState,
};
use crate::plan::status::{Outcome, Reason};

/// The rollout object's labels: the Manifests' namespace and group.
const NAMESPACE_LABEL: &str = "modulemanager.io/rollout-namespace";
/// The rollout object's label naming its fleet.
const FLEET_LABEL: &str = "modulemanager.io/rollout-fleet";
/// Tries of one pass against concurrent writers of the rollout object.
const ATTEMPTS: usize = 3;

/// `Some(pass)` while the Manifest waits for its rollout group's turn; `None` when it may
/// install or upgrade (no group, no move to a new chart, or admitted).
pub(super) async fn wait(
    manifest: &Manifest,
    ctx: &Context,
) -> Result<Option<Pass>, ReconcileError> {
    let to = chart_reference(&manifest.spec.chart);
    let history = manifest.status.as_ref().map(|s| &s.history[..]);
    if !rollout::chart_move(&to, history.unwrap_or_default()) {
        return Ok(None);
    }
    let Some(group) = manifest.labels().get(GROUP_LABEL) else {
        return Ok(spread(manifest, ctx, &to));
    };
    let object = RolloutObject::new(ctx, manifest, group, &to);
    let name = manifest.name_any();
    let asking = Asking {
        name: &name,
        running: rollout::running_revision(history.unwrap_or_default()),
    };
    for _ in 0..ATTEMPTS {
        if let Some(done) = object.step(asking).await? {
            return Ok(done.map(|(reason, message)| waiting(ctx, reason, message)));
        }
    }
    let busy = "the rollout object changed under this pass three times; looking again".to_owned();
    Ok(Some(waiting(ctx, Reason::RolloutWaiting, busy)))
}

/// `Some(pass)` while an upgrade to the chart `to` waits for its start within
/// `--upgrade-spread-seconds` ([`rollout::spread_start`]); the first such pass schedules it in
/// the status.
fn spread(manifest: &Manifest, ctx: &Context, to: &str) -> Option<Pass> {
    let window = ctx.rollouts.spread;
    if window.is_zero() {
        return None;
    }
    let now = Timestamp::now();
    let scheduled = manifest
        .status
        .as_ref()
        .and_then(|s| s.upgrade_after.as_ref());
    let uid = manifest.uid().unwrap_or_default();
    let start = rollout::spread_start(&uid, to, window, scheduled, now);
    let wait = Duration::try_from(now.duration_until(start.at.0)).ok()?;
    if wait.is_zero() {
        return None;
    }
    let message = format!(
        "the upgrade to {to} starts at about {} (upgrades to a new chart are spread over {} s, --upgrade-spread-seconds)",
        start.at.0.round(Unit::Second).unwrap_or(start.at.0),
        window.as_secs()
    );
    let mut pass = waiting(ctx, Reason::RolloutWaiting, message);
    pass.facts.upgrade_after = Some(start);
    // A little after the start, so that the pass finds it come.
    pass.requeue = wait + Duration::from_millis(10);
    Some(pass)
}

/// A pass that waits for the rollout.
fn waiting(ctx: &Context, reason: Reason, message: String) -> Pass {
    Pass {
        outcome: Outcome::waiting(State::Processing, reason, message),
        facts: Default::default(),
        requeue: ctx.rollouts.check_every,
    }
}

/// What a step ended with: `None` when the object changed under it (try again); `Some(None)`
/// to upgrade; `Some(Some(..))` to wait with this reason and message.
type Step = Option<Option<(Reason, String)>>;

/// One rollout object and what a pass needs to work with it.
struct RolloutObject<'a> {
    ctx: &'a Context,
    api: Api<ConfigMap>,
    name: String,
    /// The Manifests' namespace.
    namespace: String,
    group: &'a str,
    to: &'a str,
}

impl<'a> RolloutObject<'a> {
    fn new(ctx: &'a Context, manifest: &Manifest, group: &'a str, to: &'a str) -> Self {
        let namespace = manifest.namespace().unwrap_or_default();
        Self {
            api: Api::namespaced(ctx.client.clone(), &ctx.rollouts.namespace),
            name: rollout::object_name(&ctx.rollouts.fleet, &namespace, group, to),
            ctx,
            namespace,
            group,
            to,
        }
    }

    /// Reads the object (creating it with `asking` admitted if there is none) and acts on the
    /// decision.
    async fn step(&self, asking: Asking<'_>) -> Result<Step, ReconcileError> {
        let Some(object) = self.read().await? else {
            let first = rollout::admitted(RolloutState::default(), asking, 0);
            return Ok(self.create(&first).await?.then_some(None));
        };
        let paused = object.annotations().get(PAUSED_ANNOTATION).cloned();
        let state = rollout::current(state_of(&object), paused.is_some(), now(), self.idle());
        let settings = self.ctx.rollouts.settings;
        let fresh = state.checked.as_ref().is_some_and(|c| self.recent(c.at));
        let decision = rollout::decide(&state, paused.as_deref(), asking, settings, (None, fresh));
        if decision != Decision::Check {
            if paused.is_some() && now().saturating_sub(state.updated) > self.idle() / 2 {
                // A paused rollout that Manifests wait for is not over: written now and then.
                self.replace(object.clone(), &state, None).await?;
            }
            let reason = if paused.is_some() {
                Reason::RolloutPaused
            } else {
                Reason::RolloutWaiting
            };
            return self.act(object, state, asking, decision, reason).await;
        }
        // One look a check period: this pass claims it (the object's resourceVersion moves, so
        // a pass that read it before writes nothing and reads again), then lists the group.
        let claim = RolloutState {
            checked: Some(Checked {
                at: now(),
                message: "the newest batch is being looked at".into(),
            }),
            ..state.clone()
        };
        let Some(claimed) = self.replace(object, &claim, None).await? else {
            return Ok(None);
        };
        let check = self.check(&state).await?;
        self.after_look(claimed, state, asking, &check).await
    }

    /// Acts on a look at the newest batch of `state` (as read before `object`, the claim): if
    /// the object changed meanwhile (another pass admitted one more), decides again with the
    /// same look while the same batch is the newest — a halt is not lost to an admission.
    async fn after_look(
        &self,
        mut object: ConfigMap,
        mut state: RolloutState,
        asking: Asking<'_>,
        check: &BatchCheck,
    ) -> Result<Step, ReconcileError> {
        let settings = self.ctx.rollouts.settings;
        let batches = state.batches.len();
        for _ in 0..ATTEMPTS {
            let decision = rollout::decide(&state, None, asking, settings, (Some(check), false));
            // What the look found stands for the check period, whatever this pass does next.
            let next = rollout::looked(state, check, now());
            let done = match decision {
                Decision::Wait(message) => self
                    .replace(object, &next, None)
                    .await?
                    .map(|_| Some((Reason::RolloutWaiting, message))),
                decision => {
                    self.act(object, next, asking, decision, Reason::RolloutWaiting)
                        .await?
                }
            };
            if done.is_some() {
                return Ok(done);
            }
            let Some(again) = self.read().await? else {
                return Ok(None);
            };
            state = state_of(&again);
            let paused = again.annotations().contains_key(PAUSED_ANNOTATION);
            if paused || state.batches.len() != batches {
                return Ok(None);
            }
            object = again;
        }
        Ok(None)
    }

    /// Acts on a decision taken on `object` as read (`reason`: that of a wait).
    async fn act(
        &self,
        object: ConfigMap,
        state: RolloutState,
        asking: Asking<'_>,
        decision: Decision,
        reason: Reason,
    ) -> Result<Step, ReconcileError> {
        match decision {
            Decision::Proceed => Ok(Some(None)),
            Decision::Admit(index) => {
                let next = rollout::admitted(state, asking, index);
                Ok(self.replace(object, &next, None).await?.map(|_| None))
            }
            Decision::Wait(message) => Ok(Some(Some((reason, message)))),
            Decision::Halt(why) => {
                let halted = self
                    .replace(object, &rollout::halted(state), Some(&why))
                    .await?;
                let message = format!("the rollout is paused: {why}");
                Ok(halted.map(|_| Some((Reason::RolloutPaused, message))))
            }
            // A look is taken by `step` before it acts.
            Decision::Check => Ok(None),
        }
    }

    /// How long the rollout may go unwritten before it is over.
    fn idle(&self) -> i64 {
        rollout::idle_after(self.ctx.rollouts.check_every.as_secs())
    }

    /// The error of `verb` on the rollout object.
    fn failed(&self, verb: &str, source: kube::Error) -> ReconcileError {
        let (namespace, name) = (&self.ctx.rollouts.namespace, &self.name);
        let what = format!("{verb} ConfigMap {namespace}/{name}");
        ReconcileError::Rollout { what, source }
    }

    /// Whether a look at `at` (seconds since the epoch) is within the check period.
    fn recent(&self, at: i64) -> bool {
        let age = now().saturating_sub(at);
        u64::try_from(age).is_ok_and(|age| age < self.ctx.rollouts.check_every.as_secs())
    }

    async fn read(&self) -> Result<Option<ConfigMap>, ReconcileError> {
        self.api
            .get_opt(&self.name)
            .await
            .map_err(|source| self.failed("read", source))
    }

    /// Looks at the newest batch: lists the group's Manifests.
    async fn check(&self, state: &RolloutState) -> Result<BatchCheck, ReconcileError> {
        let selector = format!("{GROUP_LABEL}={}", self.group);
        let listed = Api::<Manifest>::namespaced(self.ctx.client.clone(), &self.namespace)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| ReconcileError::Rollout {
                what: format!("list the Manifests of rollout group {}", self.group),
                source,
            })?;
        let by_name: HashMap<String, &Manifest> =
            listed.items.iter().map(|m| (m.name_any(), m)).collect();
        Ok(rollout::check_batch(state, self.group, self.to, |name| {
            by_name.get(name).copied()
        }))
    }

    /// Creates the object holding `state`; `false` if another pass created it first.
    async fn create(&self, state: &RolloutState) -> Result<bool, ReconcileError> {
        let mut object = ConfigMap::default();
        object.metadata.name = Some(self.name.clone());
        object.metadata.labels = Some(self.labels());
        let state = RolloutState {
            updated: now(),
            ..state.clone()
        };
        object.data = Some(data(&self.namespace, self.group, self.to, &state));
        match self.api.create(&PostParams::default(), &object).await {
            Ok(_) => {
                self.forget_old().await;
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(source) => Err(self.failed("create", source)),
        }
    }

    /// Writes `state` (and the paused annotation, if `pause`) over `object` as read: the object
    /// written, or `None` if it changed since.
    async fn replace(
        &self,
        mut object: ConfigMap,
        state: &RolloutState,
        pause: Option<&str>,
    ) -> Result<Option<ConfigMap>, ReconcileError> {
        let state = RolloutState {
            updated: now(),
            ..state.clone()
        };
        object.data = Some(data(&self.namespace, self.group, self.to, &state));
        if let Some(why) = pause {
            object
                .annotations_mut()
                .insert(PAUSED_ANNOTATION.to_owned(), why.to_owned());
        }
        match self
            .api
            .replace(&self.name, &PostParams::default(), &object)
            .await
        {
            Ok(written) => Ok(Some(written)),
            // Changed, or deleted (by a person, or as over), since it was read: read again.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(None),
            Err(source) => Err(self.failed("write", source)),
        }
    }

    /// The rollout object's labels: the fleet, the Manifests' namespace and group.
    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (FLEET_LABEL.to_owned(), self.ctx.rollouts.fleet.clone()),
            (GROUP_LABEL.to_owned(), self.group.to_owned()),
            (NAMESPACE_LABEL.to_owned(), self.namespace.clone()),
        ])
    }

    /// Deletes the group's other rollout objects that are over (not written for
    /// [`IDLE_SECONDS`](rollout::IDLE_SECONDS), not paused), best effort: a failure is logged,
    /// the next new rollout of the group tries again. A paused one stays until resumed.
    async fn forget_old(&self) {
        let selector = self
            .labels()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let listed = match self
            .api
            .list(&ListParams::default().labels(&selector))
            .await
        {
            Ok(listed) => listed.items,
            Err(e) => {
                tracing::warn!("list the rollout objects of group {}: {e}", self.group);
                return;
            }
        };
        for old in &listed {
            let paused = old.annotations().contains_key(PAUSED_ANNOTATION);
            let over = rollout::current(state_of(old), paused, now(), self.idle())
                == RolloutState::default();
            if old.name_any() == self.name || !over {
                continue;
            }
            let name = old.name_any();
            // Only as listed: one written since (a pass that found it over and started anew)
            // stays.
            let unchanged = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: old.resource_version(),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            if let Err(e) = self.api.delete(&name, &unchanged).await {
                tracing::warn!("delete the rollout object {name}, which is over: {e}");
            }
        }
    }
}

/// Now, in seconds since the Unix epoch.
fn now() -> i64 {
    Timestamp::now().as_second()
}

/// The rollout state an object holds (an unreadable one counts as empty: the rollout starts
/// over with a first batch, never skips one).
fn state_of(object: &ConfigMap) -> RolloutState {
    let text = object.data.as_ref().and_then(|d| d.get("state"));
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// The object's data: what it is about, and the state.
fn data(namespace: &str, group: &str, to: &str, state: &RolloutState) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("namespace".to_owned(), namespace.to_owned()),
        ("group".to_owned(), group.to_owned()),
        ("chart".to_owned(), to.to_owned()),
        (
            "state".to_owned(),
            serde_json::to_string(state).unwrap_or_default(),
        ),
    ])
}
