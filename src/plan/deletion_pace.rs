//! The pace of module deletions on one replica (pure): the fleet-wide cap
//! (`--max-module-deletions-per-minute`) is split between the replicas by their share of the
//! shards, and each replica starts its deletions one at a time, at least [`spacing`] apart, first
//! come first served. A deletion that must wait joins the queue and is told its turn — its place
//! in the queue times the spacing as it is now — and asks again then; the turn is worked out
//! again at every ask, so a deletion that leaves the queue ([`DeletionPace::forget`], or one that
//! stops asking) and a change of the share move the turns of those behind it.
//!
//! The queue is this replica's memory: a restarted replica, or the new owner of a shard, starts
//! the deletions waiting there in its own pace (each replica still at most its share), in the
//! order they ask.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A queued deletion that has not asked again this long after its turn left: its Manifest was
/// deleted elsewhere, moved to another replica, or released without asking (`Orphan`).
const GRACE: Duration = Duration::from_secs(60);
/// How long a deletion that started may ask again and start at once (its pass failed before
/// its status recorded the start, and is retried).
const ADMITTED_FOR: Duration = Duration::from_secs(600);

/// What a deletion may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Start now.
    Start,
    /// Wait: its turn comes at this instant, as the queue is now; ask again then.
    Wait(Instant),
}

/// The time between two deletion starts on a replica that owns `share` (0–1) of the shards of a
/// fleet allowed `per_minute` starts a minute: all replicas together start at most `per_minute`
/// (plus one each) in any minute. A replica with no share (outside a fleet it has 1) paces as
/// if it were alone.
pub fn spacing(per_minute: u32, share: f64) -> Duration {
    let share = if share > 0.0 { share.min(1.0) } else { 1.0 };
    Duration::from_secs_f64(60.0 / (f64::from(per_minute.max(1)) * share))
}

/// A deletion in the queue.
#[derive(Debug)]
struct Queued {
    uid: String,
    /// The turn it was last told.
    turn: Instant,
}

/// The deletions of one replica: the last start, the queue, and those started lately.
#[derive(Debug, Default)]
pub struct DeletionPace {
    last_start: Option<Instant>,
    queue: Vec<Queued>,
    started: HashMap<String, Instant>,
}

/// What one call of [`DeletionPace::admit`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// Start or wait.
    pub admission: Admission,
    /// Whether the deletion joined the queue with this call.
    pub queued: bool,
}

impl DeletionPace {
    /// Admits the deletion of the Manifest `uid` at `now`, starts at least `spacing` apart: it
    /// starts when it is first in the queue (or the queue is empty) and the last start is
    /// `spacing` ago, or when it started lately (a retried pass); else it waits for its turn.
    pub fn admit(&mut self, uid: &str, now: Instant, spacing: Duration) -> Admitted {
        self.drop_stale(now);
        if self.started.contains_key(uid) {
            return Admitted {
                admission: Admission::Start,
                queued: false,
            };
        }
        let queued = !self.queue.iter().any(|q| q.uid == uid);
        if queued {
            self.queue.push(Queued {
                uid: uid.to_owned(),
                turn: now,
            });
        }
        let free = self
            .last_start
            .map_or(now, |last| (last + spacing).max(now));
        let place = self.queue.iter().position(|q| q.uid == uid).unwrap_or(0);
        if place == 0 && free <= now {
            self.queue.remove(0);
            self.last_start = Some(now);
            self.started.insert(uid.to_owned(), now);
            return Admitted {
                admission: Admission::Start,
                queued,
            };
        }
        let factor = u32::try_from(place).unwrap_or(u32::MAX);
        let turn = free + spacing.saturating_mul(factor);
        self.queue[place].turn = turn;
        Admitted {
            admission: Admission::Wait(turn),
            queued,
        }
    }

    /// Forgets the Manifest `uid`: released, or its deletion no longer waits (`Orphan`).
    pub fn forget(&mut self, uid: &str) {
        self.queue.retain(|q| q.uid != uid);
        self.started.remove(uid);
    }

    /// Deletions waiting in the queue.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// Drops the queued deletions that did not ask again within [`GRACE`] after their turn,
    /// and forgets starts older than [`ADMITTED_FOR`].
    fn drop_stale(&mut self, now: Instant) {
        let overdue = |turn: Instant| now.checked_duration_since(turn).is_some_and(|d| d > GRACE);
        self.queue.retain(|q| !overdue(q.turn));
        let old = |at: Instant| {
            now.checked_duration_since(at)
                .is_some_and(|d| d > ADMITTED_FOR)
        };
        self.started.retain(|_, at| !old(*at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn admit(pace: &mut DeletionPace, uid: &str, now: Instant, spacing: Duration) -> Admission {
        pace.admit(uid, now, spacing).admission
    }

    #[test]
    fn the_fleet_cap_is_split_by_share() {
        assert_eq!(spacing(60, 1.0), SECOND);
        assert_eq!(spacing(60, 0.5), 2 * SECOND);
        assert_eq!(spacing(30, 0.25), 8 * SECOND);
        // No share (not yet installed, or nothing owned): paced as the only replica.
        assert_eq!(spacing(60, 0.0), SECOND);
        // A cap of 0 never reaches here (the flag is off then); it would mean one a minute.
        assert_eq!(spacing(0, 1.0), 60 * SECOND);
    }

    #[test]
    fn starts_are_spaced_first_come_first_served() {
        let mut pace = DeletionPace::default();
        let t0 = Instant::now();
        assert_eq!(admit(&mut pace, "a", t0, SECOND), Admission::Start);
        // Two more at once: queued in order, each told its turn.
        let b = pace.admit("b", t0, SECOND);
        assert_eq!(
            b,
            Admitted {
                admission: Admission::Wait(t0 + SECOND),
                queued: true
            }
        );
        assert_eq!(
            admit(&mut pace, "c", t0, SECOND),
            Admission::Wait(t0 + 2 * SECOND)
        );
        assert_eq!(pace.waiting(), 2);
        // Asked again before its turn, a waiting one keeps its place (not queued again).
        let early = t0 + SECOND / 2;
        let c = pace.admit("c", early, SECOND);
        assert_eq!(
            c,
            Admitted {
                admission: Admission::Wait(t0 + 2 * SECOND),
                queued: false
            }
        );
        // c cannot pass b, even when b is late.
        assert_eq!(
            admit(&mut pace, "c", t0 + 2 * SECOND, SECOND),
            Admission::Wait(t0 + 3 * SECOND)
        );
        assert_eq!(
            admit(&mut pace, "b", t0 + 2 * SECOND, SECOND),
            Admission::Start
        );
        // The next start is a spacing after b's, whenever c asks.
        assert_eq!(
            admit(&mut pace, "c", t0 + 2 * SECOND, SECOND),
            Admission::Wait(t0 + 3 * SECOND)
        );
        assert_eq!(
            admit(&mut pace, "c", t0 + 3 * SECOND, SECOND),
            Admission::Start
        );
        assert_eq!(pace.waiting(), 0);
        // A pass that started and is retried starts again at once.
        assert_eq!(
            admit(&mut pace, "c", t0 + 3 * SECOND, SECOND),
            Admission::Start
        );
    }

    #[test]
    fn no_window_holds_more_starts_than_the_pace_allows() {
        // 50 deletions arriving together and asking again every 100 ms: the starts are a
        // second apart, so any 10 s window holds at most 10.
        let mut pace = DeletionPace::default();
        let t0 = Instant::now();
        let mut started = Vec::new();
        let mut waiting: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
        let mut now = t0;
        while !waiting.is_empty() {
            waiting.retain(|uid| match admit(&mut pace, uid, now, SECOND) {
                Admission::Start => {
                    started.push(now);
                    false
                }
                Admission::Wait(at) => {
                    assert!(at > now);
                    true
                }
            });
            now += SECOND / 10;
        }
        assert_eq!(started.len(), 50);
        for pair in started.windows(2) {
            assert!(pair[1].duration_since(pair[0]) >= SECOND, "a spacing apart");
        }
    }

    #[test]
    fn a_deletion_that_leaves_the_queue_moves_those_behind_it_forward() {
        let mut pace = DeletionPace::default();
        let t0 = Instant::now();
        assert_eq!(admit(&mut pace, "a", t0, SECOND), Admission::Start);
        for i in 0..100 {
            admit(&mut pace, &format!("orphaned{i}"), t0, SECOND);
        }
        assert_eq!(
            admit(&mut pace, "z", t0, SECOND),
            Admission::Wait(t0 + 101 * SECOND)
        );
        // The 100 are set to Orphan and released: z is next.
        for i in 0..100 {
            pace.forget(&format!("orphaned{i}"));
        }
        assert_eq!(
            admit(&mut pace, "z", t0, SECOND),
            Admission::Wait(t0 + SECOND)
        );
        assert_eq!(admit(&mut pace, "z", t0 + SECOND, SECOND), Admission::Start);
    }

    #[test]
    fn one_that_stops_asking_is_dropped_after_its_turn_and_a_grace() {
        let mut pace = DeletionPace::default();
        let t0 = Instant::now();
        assert_eq!(admit(&mut pace, "a", t0, SECOND), Admission::Start);
        assert_eq!(
            admit(&mut pace, "gone", t0, SECOND),
            Admission::Wait(t0 + SECOND)
        );
        assert_eq!(
            admit(&mut pace, "b", t0, SECOND),
            Admission::Wait(t0 + 2 * SECOND)
        );
        // "gone" moved to another replica and never asks again: b waits behind it only until
        // its turn and the grace have passed.
        let later = t0 + SECOND + GRACE + SECOND;
        assert_eq!(admit(&mut pace, "b", later, SECOND), Admission::Start);
        assert_eq!(pace.waiting(), 0);
    }

    #[test]
    fn turns_follow_the_share_as_it_is_now() {
        let mut pace = DeletionPace::default();
        let t0 = Instant::now();
        let slow = 64 * SECOND;
        assert_eq!(admit(&mut pace, "a", t0, slow), Admission::Start);
        assert_eq!(admit(&mut pace, "b", t0, slow), Admission::Wait(t0 + slow));
        assert_eq!(
            admit(&mut pace, "c", t0, slow),
            Admission::Wait(t0 + 2 * slow)
        );
        // The replica took more shards: the turns are worked out with the new spacing.
        let fast = 2 * SECOND;
        assert_eq!(
            admit(&mut pace, "b", t0 + SECOND, fast),
            Admission::Wait(t0 + fast)
        );
        assert_eq!(
            admit(&mut pace, "c", t0 + SECOND, fast),
            Admission::Wait(t0 + 2 * fast)
        );
    }
}
