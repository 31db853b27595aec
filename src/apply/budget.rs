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

/// Requests granted and requests that waited for a token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub waits: u64,
}

/// A minute as such.
const MINUTE: Duration = Duration::from_secs(60);

/// A target's use of its budget over the last minute (pure: the caller gives the time): counts
/// per whole minute since `started`, and the last minute estimated as the current minute's
/// counts plus the previous minute's share of the window that still overlaps it.
#[derive(Clone, Debug, PartialEq)]
pub struct UseWindow {
    started: Instant,
    current: Counts,
    previous: Counts,
}

impl UseWindow {
    /// Nothing used yet, the first minute starting at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            started: now,
            current: Counts::default(),
            previous: Counts::default(),
        }
    }

    /// Moves to the minute `now` is in.
    fn roll(&mut self, now: Instant) {
        let minutes = now.saturating_duration_since(self.started).as_secs() / 60;
        if minutes == 0 {
            return;
        }
        self.previous = if minutes == 1 {
            self.current
        } else {
            Counts::default()
        };
        self.current = Counts::default();
        self.started += MINUTE * minutes as u32;
    }

    /// Adds `counts` at `now`.
    pub fn record(&mut self, now: Instant, counts: Counts) {
        self.roll(now);
        self.current.requests += counts.requests;
        self.current.waits += counts.waits;
    }

    /// The requests and waits of the minute before `now` (estimated).
    pub fn last_minute(&self, now: Instant) -> Counts {
        let mut window = self.clone();
        window.roll(now);
        let elapsed = now.saturating_duration_since(window.started).as_secs_f64() / 60.0;
        let earlier = |n: u64| (n as f64 * (1.0 - elapsed).max(0.0)).round() as u64;
        Counts {
            requests: window.current.requests + earlier(window.previous.requests),
            waits: window.current.waits + earlier(window.previous.waits),
        }
    }
}

/// A target's use of its budget on one replica, as the replica publishes it on its membership
/// Lease (for the busiest targets only: `GET /v1/targets` adds them up over the fleet).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TargetUse {
    /// The kubeconfig Secret's namespace.
    #[serde(rename = "ns")]
    pub namespace: String,
    /// The Secret.
    #[serde(rename = "s")]
    pub secret: String,
    /// Its key.
    #[serde(rename = "k")]
    pub key: String,
    /// Requests in the last minute.
    #[serde(rename = "r")]
    pub requests: u64,
    /// Requests that waited for a token in the last minute.
    #[serde(rename = "w")]
    pub waits: u64,
}

/// One target's budget on this replica.
#[derive(Debug)]
pub struct TargetBudget {
    settings: BudgetSettings,
    share: Share,
    bucket: Mutex<TokenBucket>,
    /// Requests that waited for a token (`module_manager_target_budget_waits_total`).
    waits: Counter,
    /// The requests and waits of the last minute or two.
    used: Mutex<UseWindow>,
}

impl TargetBudget {
    /// A full budget.
    pub fn new(settings: BudgetSettings, share: Share, waits: Counter) -> Self {
        let (_, capacity) = Self::limits(settings, share.get());
        let now = Instant::now();
        Self {
            settings,
            share,
            bucket: Mutex::new(TokenBucket::full(capacity, now)),
            waits,
            used: Mutex::new(UseWindow::new(now)),
        }
    }

    /// The requests granted and the requests that waited in the last minute.
    pub fn last_minute(&self, now: Instant) -> Counts {
        self.used_now().last_minute(now)
    }

    fn used_now(&self) -> std::sync::MutexGuard<'_, UseWindow> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a request that waited for its token (once per request).
    fn waited(&self) {
        self.waits.inc();
        let waited = Counts {
            requests: 0,
            waits: 1,
        };
        self.used_now().record(Instant::now(), waited);
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

    /// Takes a token now (and counts the request), or says how long until one is.
    fn take(&self) -> Result<(), Duration> {
        let (rate, capacity) = Self::limits(self.settings, self.share.get());
        let now = Instant::now();
        let taken = {
            let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
            bucket.take(now, rate, capacity)
        };
        if taken.is_ok() {
            let granted = Counts {
                requests: 1,
                waits: 0,
            };
            self.used_now().record(now, granted);
        }
        taken
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
                        self.budget.waited();
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
    fn the_last_minute_counts_this_minute_and_what_overlaps_of_the_previous() {
        let start = Instant::now();
        let mut window = UseWindow::new(start);
        let one = |requests, waits| Counts { requests, waits };
        window.record(start, one(60, 6));
        window.record(start + Duration::from_secs(59), one(40, 4));
        assert_eq!(
            window.last_minute(start + Duration::from_secs(59)),
            one(100, 10)
        );
        // A quarter into the next minute: three quarters of the previous one still count.
        let quarter = start + Duration::from_secs(75);
        window.record(quarter, one(10, 0));
        assert_eq!(window.last_minute(quarter), one(85, 8));
        // Two minutes later: only the previous minute's 10, at the start of this one.
        let later = start + Duration::from_secs(120);
        assert_eq!(window.last_minute(later), one(10, 0));
        // Quiet for longer: nothing.
        assert_eq!(
            window.last_minute(start + Duration::from_secs(300)),
            one(0, 0)
        );
        window.record(start + Duration::from_secs(300), one(1, 1));
        assert_eq!(
            window.last_minute(start + Duration::from_secs(301)),
            one(1, 1)
        );
        // A clock going back counts into the current minute.
        assert_eq!(window.last_minute(start), one(1, 1));
    }

    /// Through the tower service, as kube's client drives it: each request is counted once
    /// when granted, and a request that waited for its token counts one wait however often
    /// it was polled. (A token every 500 ms: the second request waits.)
    #[tokio::test]
    async fn a_budget_counts_each_granted_request_and_each_request_that_waited() {
        use tower::ServiceExt;
        let settings = BudgetSettings { qps: 2.0, burst: 1 };
        let budget = Arc::new(TargetBudget::new(
            settings,
            Share::default(),
            Counter::default(),
        ));
        let inner = tower::service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>(n) });
        let mut service = BudgetLayer(budget.clone()).layer(inner);
        for n in 0..2 {
            let answer = service.ready().await.unwrap().call(n).await.unwrap();
            assert_eq!(answer, n);
        }
        let counts = budget.last_minute(Instant::now());
        assert_eq!((counts.requests, counts.waits), (2, 1));
        assert_eq!(budget.waits.get(), 1);
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
