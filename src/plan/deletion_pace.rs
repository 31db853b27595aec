//! The pace of module deletions on one replica (pure): the fleet-wide cap
//! (`--max-module-deletions-per-minute`) is split between the replicas by their share of the
//! shards, and each replica starts its deletions one at a time, evenly spaced by
//! [`spacing`]. A deletion that must wait reserves the next free start and is told when it is,
//! so waiting Manifests come back one by one at their turn (first come, first served) instead of
//! all at once. Losing this state (a restart, a shard moved) only makes a deletion wait for a
//! new turn: it never lets one start earlier than the pace allows on this replica.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A reservation whose start passed this long ago is dropped: its Manifest was deleted
/// elsewhere, moved to another replica, or switched to `deletionPolicy: Orphan`.
const STALE: Duration = Duration::from_secs(600);

/// What a deletion may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Start now.
    Start,
    /// Wait: its turn comes at this instant (reserved for it).
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

/// The starts of one replica: the next free one and those reserved by waiting Manifests (by UID).
#[derive(Debug, Default)]
pub struct DeletionPace {
    /// The earliest instant a deletion that holds no reservation may start.
    next: Option<Instant>,
    /// Starts promised to waiting deletions, all before `next`.
    reserved: HashMap<String, Instant>,
}

impl DeletionPace {
    /// Admits the deletion of the Manifest `uid` at `now` with starts `spacing` apart: `Start`
    /// if it reserved a start that has come, or if no start is reserved after now; else it
    /// waits for the start it reserved earlier, or reserves the next free one.
    pub fn admit(&mut self, uid: &str, now: Instant, spacing: Duration) -> Admission {
        self.reserved.retain(|_, at| {
            now.checked_duration_since(*at)
                .is_none_or(|late| late < STALE)
        });
        if let Some(&at) = self.reserved.get(uid) {
            if at <= now {
                self.reserved.remove(uid);
                return Admission::Start;
            }
            return Admission::Wait(at);
        }
        match self.next {
            Some(next) if next > now => {
                self.reserved.insert(uid.to_owned(), next);
                self.next = Some(next + spacing);
                Admission::Wait(next)
            }
            _ => {
                self.next = Some(now + spacing);
                Admission::Start
            }
        }
    }

    /// Deletions holding a reserved start (waiting for the pace).
    pub fn waiting(&self) -> usize {
        self.reserved.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

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
    fn starts_are_spaced_and_waiting_deletions_keep_their_turn() {
        let mut pace = DeletionPace::default();
        let t0 = Instant::now();
        assert_eq!(pace.admit("a", t0, SECOND), Admission::Start);
        // Two more at once: each reserves the next free start, in order.
        assert_eq!(pace.admit("b", t0, SECOND), Admission::Wait(t0 + SECOND));
        assert_eq!(
            pace.admit("c", t0, SECOND),
            Admission::Wait(t0 + 2 * SECOND)
        );
        assert_eq!(pace.waiting(), 2);
        // Asked again before its turn, a waiting one keeps its start (no new reservation).
        let early = t0 + SECOND / 2;
        assert_eq!(
            pace.admit("c", early, SECOND),
            Admission::Wait(t0 + 2 * SECOND)
        );
        // A newcomer goes after them.
        assert_eq!(
            pace.admit("d", early, SECOND),
            Admission::Wait(t0 + 3 * SECOND)
        );
        // Each starts at its turn (or later), once.
        assert_eq!(pace.admit("b", t0 + SECOND, SECOND), Admission::Start);
        assert_eq!(pace.admit("c", t0 + 5 * SECOND, SECOND), Admission::Start);
        assert_eq!(pace.admit("d", t0 + 5 * SECOND, SECOND), Admission::Start);
        assert_eq!(pace.waiting(), 0);
        // Past every reserved start, the next one starts at once.
        assert_eq!(pace.admit("e", t0 + 5 * SECOND, SECOND), Admission::Start);
    }

    #[test]
    fn no_window_holds_more_starts_than_the_pace_allows() {
        // 50 deletions arriving together and asking again every 100 ms: the starts are a
        // second apart, so any 10 s window holds at most 11.
        let mut pace = DeletionPace::default();
        let t0 = Instant::now();
        let mut started = Vec::new();
        let mut waiting: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
        let mut now = t0;
        while !waiting.is_empty() {
            waiting.retain(|uid| match pace.admit(uid, now, SECOND) {
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
        for (i, first) in started.iter().enumerate() {
            let within = started[i..]
                .iter()
                .take_while(|t| t.duration_since(*first) < 10 * SECOND)
                .count();
            assert!(within <= 11, "{within} starts within 10 s of start {i}");
        }
    }

    #[test]
    fn a_reservation_left_behind_is_dropped_and_does_not_hold_the_pace() {
        let mut pace = DeletionPace::default();
        let t0 = Instant::now();
        assert_eq!(pace.admit("a", t0, SECOND), Admission::Start);
        assert_eq!(pace.admit("gone", t0, SECOND), Admission::Wait(t0 + SECOND));
        // "gone" never comes back (deleted elsewhere); long after, a new one starts at once
        // and the stale reservation is forgotten.
        let later = t0 + STALE + 2 * SECOND;
        assert_eq!(pace.admit("b", later, SECOND), Admission::Start);
        assert_eq!(pace.waiting(), 0);
    }
}
