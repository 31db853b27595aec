//! The request budget of a remote target (`--target-qps`, `--target-burst`): a token bucket per
//! kubeconfig Secret key, shared by every client built from it, each replica taking its share of
//! the fleet-wide rate (the fraction of the shards it owns), so that the Manifests of one
//! cluster cannot flood it together. Kyma's lifecycle-manager gives each remote client 50 QPS,
//! burst 100 (client-go's token bucket); these are the same rules.
//!
//! [`BudgetLayer`] is a tower layer on the target's client, outermost (every request: discovery,
//! lists, applies, deletes): a request waits in `poll_ready` for a token. A replica runs at most
//! `--target-passes` passes per target at once (`work/target_gate.rs`), so a target out of
//! budget holds at most that many workers, never the others'.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tower::{Layer, Service};

/// The fleet-wide budget of one target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BudgetSettings {
    /// Requests per second, on average.
    pub qps: f64,
    /// Requests at once after a quiet spell.
    pub burst: u32,
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self {
            qps: 50.0,
            burst: 100,
        }
    }
}

/// The least rate a replica allows a target, whatever its share (requests per second).
pub const FLOOR_QPS: f64 = 1.0;
/// The least burst a replica allows a target, whatever its share.
pub const FLOOR_BURST: f64 = 5.0;

/// A token bucket (pure: the caller gives the time). Full at the start.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBucket {
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket of `capacity` at `now`.
    pub fn full(capacity: f64, now: Instant) -> Self {
        Self {
            tokens: capacity,
            at: now,
        }
    }

    /// Takes a token at `now` from a bucket of `capacity` refilled at `rate` per second; when
    /// none is left, how long until one is. Rate and capacity may change between calls (the
    /// replica's share does): the tokens are capped at the capacity of the moment.
    pub fn take(&mut self, now: Instant, rate: f64, capacity: f64) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(capacity);
        self.at = now.max(self.at);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
    }
}

/// This replica's share of the fleet (0–1): the fraction of the shards it owns, read at each
/// request; 1 until one is installed (a replica outside any fleet).
#[derive(Clone, Default)]
pub struct Share(Arc<RwLock<Option<Arc<ShareNow>>>>);

type ShareNow = dyn Fn() -> f64 + Send + Sync;

impl std::fmt::Debug for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Share").field(&self.get()).finish()
    }
}

impl Share {
    /// Reads the share from `source` from now on.
    pub fn install(&self, source: impl Fn() -> f64 + Send + Sync + 'static) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(source));
    }

    /// The share now, within 0–1.
    pub fn get(&self) -> f64 {
        let source = self.0.read().unwrap_or_else(|e| e.into_inner()).clone();
        source.map_or(1.0, |share| share().clamp(0.0, 1.0))
    }
}

/// One target's budget on this replica.
#[derive(Debug)]
pub struct TargetBudget {
    settings: BudgetSettings,
    share: Share,
    bucket: Mutex<TokenBucket>,
    /// Requests that waited for a token (`module_manager_target_budget_waits_total`).
    waits: Counter,
}

impl TargetBudget {
    /// A full budget.
    pub fn new(settings: BudgetSettings, share: Share, waits: Counter) -> Self {
        let (_, capacity) = Self::limits(settings, share.get());
        Self {
            settings,
            share,
            bucket: Mutex::new(TokenBucket::full(capacity, Instant::now())),
            waits,
        }
    }

    /// The rate and capacity of a replica holding `share` of the fleet, but at least
    /// [`FLOOR_QPS`] and [`FLOOR_BURST`] (or the fleet's own, if smaller): a replica that holds
    /// few shards (one that just joined) would otherwise take minutes over an install on a
    /// target. So a fleet of N may together exceed the budget by at most N × the floor.
    fn limits(settings: BudgetSettings, share: f64) -> (f64, f64) {
        let burst = f64::from(settings.burst);
        let rate = (settings.qps * share).max(FLOOR_QPS.min(settings.qps));
        let capacity = (burst * share).max(FLOOR_BURST.min(burst));
        (rate, capacity)
    }

    /// Takes a token now, or says how long until one is.
    fn take(&self) -> Result<(), Duration> {
        let (rate, capacity) = Self::limits(self.settings, self.share.get());
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        bucket.take(Instant::now(), rate, capacity)
    }
}

/// The tower layer that makes a client's requests wait for its target's budget.
#[derive(Clone, Debug)]
pub struct BudgetLayer(pub Arc<TargetBudget>);

impl<S> Layer<S> for BudgetLayer {
    type Service = Budgeted<S>;

    fn layer(&self, inner: S) -> Budgeted<S> {
        Budgeted {
            inner,
            budget: self.0.clone(),
            sleep: None,
            granted: false,
            waited: false,
        }
    }
}

/// The service of [`BudgetLayer`]: ready once a token is taken (kube's client calls it from one
/// buffer task, so a request waits for its token before the next one is looked at).
pub struct Budgeted<S> {
    inner: S,
    budget: Arc<TargetBudget>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    granted: bool,
    /// Whether the request being made ready has waited (counted once).
    waited: bool,
}

impl<S: Clone> Clone for Budgeted<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            budget: self.budget.clone(),
            sleep: None,
            granted: false,
            waited: false,
        }
    }
}

impl<S, R> Service<R> for Budgeted<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            if self.granted {
                return self.inner.poll_ready(cx);
            }
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.budget.take() {
                Ok(()) => self.granted = true,
                Err(wait) => {
                    if !self.waited {
                        self.waited = true;
                        self.budget.waits.inc();
                    }
                    self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
        }
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.granted = false;
        self.waited = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_a_burst_through_then_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(3.0, start);
        for _ in 0..3 {
            assert_eq!(bucket.take(start, 2.0, 3.0), Ok(()));
        }
        // Empty: the next token comes after 1/rate.
        assert_eq!(
            bucket.take(start, 2.0, 3.0),
            Err(Duration::from_millis(500))
        );
        let later = start + Duration::from_millis(500);
        assert_eq!(bucket.take(later, 2.0, 3.0), Ok(()));
        assert!(bucket.take(later, 2.0, 3.0).is_err());
        // A long quiet spell refills up to the capacity, not beyond.
        let quiet = later + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(bucket.take(quiet, 2.0, 3.0), Ok(()));
        }
        assert!(bucket.take(quiet, 2.0, 3.0).is_err());
    }

    #[test]
    fn a_smaller_share_caps_the_tokens_kept_and_a_clock_going_back_adds_none() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(100.0, start);
        // The share fell to a third: at most a third of the burst is left.
        for _ in 0..33 {
            assert_eq!(bucket.take(start, 50.0 / 3.0, 100.0 / 3.0), Ok(()));
        }
        assert!(bucket.take(start, 50.0 / 3.0, 100.0 / 3.0).is_err());
        let earlier = start.checked_sub(Duration::from_secs(10)).unwrap_or(start);
        assert!(bucket.take(earlier, 50.0 / 3.0, 100.0 / 3.0).is_err());
    }

    #[test]
    fn a_replica_takes_its_share_of_the_fleet_budget() {
        let settings = BudgetSettings::default();
        assert_eq!(TargetBudget::limits(settings, 1.0), (50.0, 100.0));
        let (rate, capacity) = TargetBudget::limits(settings, 0.25);
        assert_eq!((rate, capacity), (12.5, 25.0));
        // One shard of 256 (a replica that just joined), or none: the floor.
        assert_eq!(TargetBudget::limits(settings, 1.0 / 256.0), (1.0, 5.0));
        assert_eq!(TargetBudget::limits(settings, 0.0), (1.0, 5.0));
        // A fleet budget below the floor is kept whole.
        let small = BudgetSettings { qps: 0.5, burst: 2 };
        assert_eq!(TargetBudget::limits(small, 0.1), (0.5, 2.0));
        let share = Share::default();
        assert_eq!(share.get(), 1.0);
        share.install(|| 2.0);
        assert_eq!(share.get(), 1.0);
        share.install(|| 1.0 / 3.0);
        assert!((share.get() - 1.0 / 3.0).abs() < 1e-9);
    }
}
