//! What the admin API's authentication costs the API server: TokenReview answers kept briefly
//! by a hash of the token (a refused token is not reviewed again for a while), and token
//! buckets, per source address and for the replica, that every review which does not
//! authenticate takes from: a caller whose bucket is empty gets `429` with `Retry-After` and
//! sends no TokenReview. A flood of junk tokens so costs at most
//! [`ReviewLimits::failed_per_second`] TokenReviews a second (after a burst), whatever the number
//! of sources.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::StatusCode;
use k8s_openapi::api::authentication::v1::UserInfo;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// Bounds of the review cache and of the failed-authentication buckets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReviewLimits {
    /// How long an authenticated token's user is reused (the SubjectAccessReview is still asked
    /// on every request: a revoked permission takes effect at once).
    pub authenticated_ttl: Duration,
    /// How long a refused token is answered `401` without a review.
    pub refused_ttl: Duration,
    /// Most tokens remembered (the oldest go first).
    pub max_entries: usize,
    /// Reviews that did not authenticate one source address may cause at once...
    pub source_burst: f64,
    /// ...and a second after that.
    pub source_per_second: f64,
    /// Reviews that did not authenticate all sources together may cause at once...
    pub failed_burst: f64,
    /// ...and a second after that.
    pub failed_per_second: f64,
    /// Most source addresses with a bucket (beyond, a full bucket is dropped, else the oldest).
    pub max_sources: usize,
}

impl Default for ReviewLimits {
    fn default() -> Self {
        Self {
            authenticated_ttl: Duration::from_secs(30),
            refused_ttl: Duration::from_secs(30),
            max_entries: 1024,
            source_burst: 10.0,
            source_per_second: 1.0,
            failed_burst: 50.0,
            failed_per_second: 10.0,
            max_sources: 4096,
        }
    }
}

/// What a TokenReview said of a token.
#[derive(Clone, Debug, PartialEq)]
pub enum Reviewed {
    /// The token names this user (for [`super::TOKEN_AUDIENCE`]).
    Authenticated(UserInfo),
    /// The API server did not authenticate it.
    Refused,
}

/// The key of a token: its sha256 (the token itself is never kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenKey([u8; 32]);

impl TokenKey {
    /// The key of `token`.
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }
}

/// One remembered review.
struct Remembered {
    reviewed: Reviewed,
    stored: Instant,
    expires: Instant,
}

/// A token bucket: `burst` tokens, refilled at `per_second`.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Self {
        Self {
            tokens: burst,
            at: now,
        }
    }

    /// The tokens now (refilled up to `burst`).
    fn refill(&mut self, burst: f64, per_second: f64, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_second).min(burst);
        self.at = now;
    }

    /// How long until one token is there (zero: there is one).
    fn wait(&self, per_second: f64) -> Duration {
        if self.tokens >= 1.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((1.0 - self.tokens) / per_second.max(f64::MIN_POSITIVE))
    }
}

#[derive(Default)]
struct Inner {
    remembered: HashMap<TokenKey, Remembered>,
    sources: HashMap<Option<IpAddr>, Bucket>,
    failed: Option<Bucket>,
}

/// The review cache and the buckets of one admin server.
#[derive(Default)]
pub struct Reviews {
    limits: ReviewLimits,
    inner: Mutex<Inner>,
}

/// A review's place in the buckets, taken before it is sent: returned when the token turns
/// out to authenticate ([`Reviews::remember`]).
#[derive(Debug)]
#[must_use = "remember the review's answer with it"]
pub struct Charge {
    source: Option<IpAddr>,
}

impl Reviews {
    /// A cache and buckets within `limits`.
    pub fn new(limits: ReviewLimits) -> Self {
        Self {
            limits,
            inner: Mutex::default(),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The remembered review of `key`, unless it expired.
    pub fn cached(&self, key: &TokenKey) -> Option<Reviewed> {
        let mut inner = self.inner();
        let found = inner.remembered.get(key)?;
        if found.expires <= Instant::now() {
            inner.remembered.remove(key);
            return None;
        }
        Some(found.reviewed.clone())
    }

    /// Takes a token from `source`'s bucket and from the replica's for a review about to be
    /// sent; `429` with the seconds to wait when either is empty (nothing is taken then).
    pub fn charge(&self, source: Option<IpAddr>) -> Result<Charge, (StatusCode, String, u64)> {
        let limits = self.limits;
        let now = Instant::now();
        let mut inner = self.inner();
        let mut failed = inner
            .failed
            .unwrap_or_else(|| Bucket::full(limits.failed_burst, now));
        failed.refill(limits.failed_burst, limits.failed_per_second, now);
        let mut own = inner
            .sources
            .get(&source)
            .copied()
            .unwrap_or_else(|| Bucket::full(limits.source_burst, now));
        own.refill(limits.source_burst, limits.source_per_second, now);
        let wait = own
            .wait(limits.source_per_second)
            .max(failed.wait(limits.failed_per_second));
        if !wait.is_zero() {
            let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
            return Err((
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "too many requests failed authentication; retry in {seconds} s with a \
                     token for the audience module-manager"
                ),
                seconds,
            ));
        }
        own.tokens -= 1.0;
        failed.tokens -= 1.0;
        inner.failed = Some(failed);
        make_room(&mut inner.sources, &limits, now, source);
        inner.sources.insert(source, own);
        Ok(Charge { source })
    }

    /// Remembers what the review of `key` said; an authenticated token gives its `charge` back
    /// (only reviews that do not authenticate are limited).
    pub fn remember(&self, key: TokenKey, charge: Charge, reviewed: Reviewed) {
        let limits = self.limits;
        let now = Instant::now();
        let mut inner = self.inner();
        let ttl = match reviewed {
            Reviewed::Authenticated(_) => {
                let burst = (limits.source_burst, limits.failed_burst);
                if let Some(own) = inner.sources.get_mut(&charge.source) {
                    own.tokens = (own.tokens + 1.0).min(burst.0);
                }
                if let Some(failed) = inner.failed.as_mut() {
                    failed.tokens = (failed.tokens + 1.0).min(burst.1);
                }
                limits.authenticated_ttl
            }
            Reviewed::Refused => limits.refused_ttl,
        };
        let remembered = &mut inner.remembered;
        remembered.retain(|_, r| r.expires > now);
        while remembered.len() >= limits.max_entries.max(1) {
            let oldest = remembered
                .iter()
                .min_by_key(|(_, r)| r.stored)
                .map(|(k, _)| *k);
            let Some(oldest) = oldest else { break };
            remembered.remove(&oldest);
        }
        let expires = now + ttl;
        remembered.insert(
            key,
            Remembered {
                reviewed,
                stored: now,
                expires,
            },
        );
    }

    /// Tokens remembered now (expired ones not yet dropped included): for tests.
    pub fn remembered(&self) -> usize {
        self.inner().remembered.len()
    }
}

/// Keeps the buckets at most `max_sources` (`keep`'s aside): full ones go first (they hold no
/// state), else the one least recently charged.
fn make_room(
    sources: &mut HashMap<Option<IpAddr>, Bucket>,
    limits: &ReviewLimits,
    now: Instant,
    keep: Option<IpAddr>,
) {
    if sources.len() < limits.max_sources.max(1) || sources.contains_key(&keep) {
        return;
    }
    sources.retain(|_, bucket| {
        let mut refilled = *bucket;
        refilled.refill(limits.source_burst, limits.source_per_second, now);
        refilled.tokens < limits.source_burst
    });
    while sources.len() >= limits.max_sources.max(1) {
        let oldest = sources.iter().min_by_key(|(_, b)| b.at).map(|(k, _)| *k);
        let Some(oldest) = oldest else { break };
        sources.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> Reviewed {
        Reviewed::Authenticated(UserInfo {
            username: Some(name.into()),
            ..Default::default()
        })
    }

    fn address(n: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, n]))
    }

    /// A refused token is answered from memory until its time to live passes, an authenticated
    /// one likewise; entries are bounded (the oldest go) and keyed by the token's hash.
    #[tokio::test(start_paused = true)]
    async fn reviews_are_remembered_for_their_time_to_live_and_bounded() {
        let reviews = Reviews::new(ReviewLimits {
            max_entries: 3,
            ..ReviewLimits::default()
        });
        let junk = TokenKey::of("junk");
        assert_eq!(reviews.cached(&junk), None);
        let charge = reviews.charge(address(1)).unwrap();
        reviews.remember(junk, charge, Reviewed::Refused);
        let charge = reviews.charge(address(1)).unwrap();
        reviews.remember(TokenKey::of("good"), charge, user("alice"));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(reviews.cached(&junk), Some(Reviewed::Refused));
        assert_eq!(reviews.cached(&TokenKey::of("good")), Some(user("alice")));
        assert_eq!(reviews.cached(&TokenKey::of("junk ")), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(reviews.cached(&junk), None, "expired");
        assert_eq!(reviews.cached(&TokenKey::of("good")), None, "expired");
        for n in 0..5 {
            let charge = reviews.charge(address(2)).unwrap();
            reviews.remember(TokenKey::of(&format!("t{n}")), charge, Reviewed::Refused);
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        assert_eq!(reviews.remembered(), 3, "bounded");
        assert_eq!(reviews.cached(&TokenKey::of("t0")), None, "the oldest went");
        assert_eq!(reviews.cached(&TokenKey::of("t4")), Some(Reviewed::Refused));
    }

    /// A source's failed reviews are limited to its burst, then one a second, with the wait
    /// announced; other sources are not limited by it; authenticated reviews give their charge
    /// back.
    #[tokio::test(start_paused = true)]
    async fn each_source_has_a_bucket_of_failed_reviews() {
        let reviews = Reviews::new(ReviewLimits::default());
        let refuse = |n: u8, token: &str| {
            let charge = reviews.charge(address(n))?;
            reviews.remember(TokenKey::of(token), charge, Reviewed::Refused);
            Ok::<_, (StatusCode, String, u64)>(())
        };
        for n in 0..10 {
            refuse(1, &format!("junk{n}")).unwrap();
        }
        let (status, message, retry) = refuse(1, "junk10").unwrap_err();
        assert_eq!((status, retry), (StatusCode::TOO_MANY_REQUESTS, 1));
        assert!(message.contains("retry in 1 s"), "{message}");
        refuse(2, "other").unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        refuse(1, "junk11").unwrap();
        assert!(refuse(1, "junk12").is_err());
        // Authenticated reviews cost nothing.
        tokio::time::advance(Duration::from_secs(10)).await;
        for n in 0..20 {
            let charge = reviews.charge(address(3)).unwrap();
            reviews.remember(TokenKey::of(&format!("good{n}")), charge, user("alice"));
        }
    }

    /// Many sources together are limited by the replica's bucket: a flood from more addresses
    /// than the burst still gets `429` once it is empty, and a source's state is bounded.
    #[tokio::test(start_paused = true)]
    async fn all_sources_together_are_limited() {
        let reviews = Reviews::new(ReviewLimits {
            max_sources: 8,
            ..ReviewLimits::default()
        });
        let mut refused = 0;
        for n in 0..100u8 {
            match reviews.charge(address(n)) {
                Ok(charge) => {
                    reviews.remember(TokenKey::of(&n.to_string()), charge, Reviewed::Refused)
                }
                Err((status, _, retry)) => {
                    assert_eq!((status, retry), (StatusCode::TOO_MANY_REQUESTS, 1));
                    refused += 1;
                }
            }
        }
        assert_eq!(refused, 50, "the burst of 50 passed, the rest waits");
        assert!(reviews.inner().sources.len() <= 8, "bounded");
        // A tenth of a second later, one more (ten a second).
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(reviews.charge(address(200)).is_ok());
        assert!(reviews.charge(address(201)).is_err());
    }
}
