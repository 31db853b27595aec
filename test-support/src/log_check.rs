//! Checks the replicas' JSON logs for reconcile passes of one Manifest that overlapped in time.
//!
//! Every replica writes one JSON object per line (see `module_manager::telemetry`). A reconcile pass logs
//! `reconcile start` and `reconcile end` (with an optional `result`) inside the span named
//! `reconcile`, whose fields carry the Manifest's `uid`, the `replica` name and the per-process
//! `reconcile_id`. This module is pure: it takes log contents and returns a [`Report`]:
//!
//! - [`parse_passes`] turns one log into [`Pass`]es,
//! - [`check`] looks across all logs for passes of the same Manifest that overlap, and for expected
//!   Manifests that were never reconciled to the end.
//!
//! Lines that are not JSON, or carry other messages, are ignored.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

use k8s_openapi::jiff::Timestamp;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

/// How many overlaps and unreconciled uids [`Report`]'s `Display` lists before eliding the rest.
const DISPLAY_LIMIT: usize = 20;

/// One reconcile pass, as seen in one replica's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pass {
    /// The Manifest's uid.
    pub uid: String,
    /// The replica that ran the pass.
    pub replica: String,
    /// The pass number within the replica's process (restarts at 1 when the process restarts).
    pub reconcile_id: u64,
    /// When `reconcile start` was logged.
    pub start: Timestamp,
    /// When `reconcile end` was logged; `None` if it never was (the process died or is paused).
    pub end: Option<Timestamp>,
    /// The `result` field of the end line, if any.
    pub result: Option<String>,
    /// The shard the pass ran for (the span's `shard`).
    pub shard: Option<u64>,
    /// When the pass logged that its fence check failed (`stopping the pass: …` or `not writing
    /// the error status: …`): it wrote nothing after that check.
    pub fenced: Option<Timestamp>,
}

/// Two passes of the same Manifest whose time intervals intersect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// The Manifest's uid.
    pub uid: String,
    /// `(replica, reconcile_id)` of the pass that started first.
    pub first: (String, u64),
    /// `(replica, reconcile_id)` of the pass that started second (or at the same time).
    pub second: (String, u64),
}

/// The outcome of [`check`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Number of passes found in all logs, open ones included.
    pub passes: usize,
    /// Pairs of passes of the same Manifest that ran at the same time, by uid, then start.
    pub overlaps: Vec<Overlap>,
    /// Expected uids without any completed pass (one with an end line), sorted.
    pub unreconciled: Vec<String>,
    /// Number of passes without an end line (their process was killed or is paused).
    pub open: usize,
}

impl Report {
    /// No overlapping passes, and every expected Manifest was reconciled to the end at least once.
    ///
    /// Open passes alone do not make a report unclean: a killed replica leaves them behind.
    pub fn is_clean(&self) -> bool {
        self.overlaps.is_empty() && self.unreconciled.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} reconcile passes ({} open), {} overlaps, {} unreconciled",
            self.passes,
            self.open,
            self.overlaps.len(),
            self.unreconciled.len()
        )?;
        for o in self.overlaps.iter().take(DISPLAY_LIMIT) {
            writeln!(
                f,
                "  overlap on {}: {} #{} and {} #{}",
                o.uid, o.first.0, o.first.1, o.second.0, o.second.1
            )?;
        }
        if self.overlaps.len() > DISPLAY_LIMIT {
            writeln!(
                f,
                "  ... and {} more overlaps",
                self.overlaps.len() - DISPLAY_LIMIT
            )?;
        }
        for uid in self.unreconciled.iter().take(DISPLAY_LIMIT) {
            writeln!(f, "  never reconciled: {uid}")?;
        }
        if self.unreconciled.len() > DISPLAY_LIMIT {
            writeln!(
                f,
                "  ... and {} more unreconciled",
                self.unreconciled.len() - DISPLAY_LIMIT
            )?;
        }
        Ok(())
    }
}

/// Parses one replica's log into its reconcile passes, in the order of their start lines.
///
/// A `reconcile end` line closes the most recent unclosed start with the same
/// `(replica, reconcile_id)`; a second start for that key before any end means the earlier pass
/// never ended (its process restarted under the same name, with ids from 1 again). Passes
/// without an end line have `end: None`; end lines without a start are ignored.
pub fn parse_passes(replica_log: &str) -> Vec<Pass> {
    parse_log(replica_log).passes
}

/// Checks the logs of all replicas, given as `(log name, content)`.
///
/// An open pass (no end line: its process was killed with SIGKILL, or is paused) is treated as
/// lasting until the last timestamp seen in its own log, where its process stopped writing. So
/// give each process its own log: if one log holds a restarted process too, an open pass of the
/// earlier process is extended over the later one's lines (which errs towards reporting overlaps).
///
/// Two passes of the same uid overlap when their intervals `[start, end]` intersect; intervals
/// that merely touch (one ends when the other starts) do not.
pub fn check(logs: &[(String, String)], expected_uids: &BTreeSet<String>) -> Report {
    check_with_pauses(
        logs,
        expected_uids,
        &BTreeMap::new(),
        std::time::Duration::MAX,
    )
}

/// [`check`], knowing when replicas were paused: `pauses` maps a replica name to the windows
/// `(stopped, resumed)` during which its process was stopped (SIGSTOP), as whoever stopped it
/// recorded them. A stopped process executes nothing, so a pass does not count as running
/// during its replica's pauses; before and after them it does (a pass resumed after its shard
/// was taken over overlaps the new owner's passes only if it still runs when they do).
///
/// One exception, for a pass frozen while its shard moved: a pause at least `renew_deadline`
/// long lapses the replica's fence (its deadline is on the monotonic clock, which runs on while
/// the process is stopped). When another replica's log shows it acquiring the pass's shard
/// after that pause began, and the pass then logged its fence stop, the pass could pass no
/// fence check after the pause (the shard's epoch moved on), so it started no write after it:
/// its pieces from that pause on are not compared. What it cannot rule out is a write that had
/// passed its fence check when the pause hit and is sent after it (docs/sharding.md's window of
/// a late write), which a log cannot show. A pass that resumed and went on without a fence stop,
/// or whose shard no one else acquired, is compared as before.
pub fn check_with_pauses(
    logs: &[(String, String)],
    expected_uids: &BTreeSet<String>,
    pauses: &BTreeMap<String, Vec<(Timestamp, Timestamp)>>,
    renew_deadline: std::time::Duration,
) -> Report {
    check_with_outages(
        logs,
        expected_uids,
        pauses,
        &BTreeMap::new(),
        renew_deadline,
    )
}

/// [`check_with_pauses`], knowing also when replicas were partitioned from the API server:
/// `partitions` maps a replica name to the windows `(cut, healed)` during which nothing it
/// sent reached the API server while its process ran on, and at whose end every connection it
/// had was reset (the harness's proxy: nothing sent during the cut arrives later). No pass of
/// that replica counts as running from the cut to the heal, whenever it started: it cannot act
/// on the cluster then — not one hung in a request, not one started before its renew deadline
/// told it that its shards were gone (it cannot know before). What it does after the heal
/// counts as any other pass: a replica that ignores its fence shows there.
pub fn check_with_outages(
    logs: &[(String, String)],
    expected_uids: &BTreeSet<String>,
    pauses: &BTreeMap<String, Vec<(Timestamp, Timestamp)>>,
    partitions: &BTreeMap<String, Vec<(Timestamp, Timestamp)>>,
    renew_deadline: std::time::Duration,
) -> Report {
    let mut intervals: BTreeMap<&str, Vec<Interval<'_>>> = BTreeMap::new();
    let mut parsed = Vec::with_capacity(logs.len());
    for (_name, content) in logs {
        parsed.push(parse_log(content));
    }
    let mut report = Report::default();
    let mut completed = BTreeSet::new();
    for (index, log) in parsed.iter().enumerate() {
        // Shards acquired by the other logs' replicas, and when.
        let others = || {
            parsed
                .iter()
                .enumerate()
                .filter(move |(i, _)| *i != index)
                .flat_map(|(_, other)| other.acquired.iter())
        };
        for pass in &log.passes {
            report.passes += 1;
            let end = match pass.end {
                Some(end) => {
                    completed.insert(pass.uid.as_str());
                    end
                }
                None => {
                    report.open += 1;
                    log.last.map_or(pass.start, |last| last.max(pass.start))
                }
            };
            let windows = pauses.get(&pass.replica).map_or(&[][..], Vec::as_slice);
            let cut_off = cut_off(pass, end, partitions);
            let mut pieces: Vec<(Timestamp, Timestamp)> = running(pass.start, end, windows)
                .into_iter()
                .flat_map(|(a, b)| running(a, b, &cut_off))
                .collect();
            if let Some(stopped) = frozen_while_moved(pass, end, windows, renew_deadline, others())
            {
                pieces.retain(|(_, piece_end)| *piece_end <= stopped);
            }
            for (start, end) in pieces {
                intervals
                    .entry(pass.uid.as_str())
                    .or_default()
                    .push(Interval { pass, start, end });
            }
        }
    }
    for (uid, mut list) in intervals {
        list.sort_by(|a, b| {
            (a.start, a.end, &a.pass.replica, a.pass.reconcile_id).cmp(&(
                b.start,
                b.end,
                &b.pass.replica,
                b.pass.reconcile_id,
            ))
        });
        // Sweep by start: `active` holds the passes still running when the current one starts.
        let mut active: Vec<&Interval<'_>> = Vec::new();
        let mut found: BTreeSet<(PassKey<'_>, PassKey<'_>)> = BTreeSet::new();
        for current in &list {
            active.retain(|a| a.end > current.start);
            for earlier in &active {
                let pair = (
                    (earlier.pass.replica.as_str(), earlier.pass.reconcile_id),
                    (current.pass.replica.as_str(), current.pass.reconcile_id),
                );
                // Pieces of one pass (split by a pause) never overlap each other; two pieces
                // of the same pair are one finding.
                if current.end > earlier.start && pair.0 != pair.1 && found.insert(pair) {
                    report.overlaps.push(Overlap {
                        uid: uid.to_owned(),
                        first: (earlier.pass.replica.clone(), earlier.pass.reconcile_id),
                        second: (current.pass.replica.clone(), current.pass.reconcile_id),
                    });
                }
            }
            active.push(current);
        }
    }
    report.unreconciled = expected_uids
        .iter()
        .filter(|uid| !completed.contains(uid.as_str()))
        .cloned()
        .collect();
    report
}

/// A pass by (replica, reconcile id).
type PassKey<'a> = (&'a str, u64);

/// A piece of a pass during which it ran: from its start (or the end of a pause) to its end
/// line, the end of its log for an open pass, or the start of a pause.
struct Interval<'a> {
    pass: &'a Pass,
    start: Timestamp,
    end: Timestamp,
}

/// How long after a heal a pass that was cut off may take to see its connection reset and end
/// ([`cut_off`]). Measured: 30 ms (a CI run of 2026-12-07, 19:05: the pass's request failed
/// with `SendRequest` 30 ms after the heal, its fence refused the error status, it ended).
const RESET_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The windows of `pass`'s replica's partitions (ending at `end`), cut to heal: its pass does
/// not count as running then ([`check_with_outages`]). A pass that ends within [`RESET_GRACE`]
/// of a heal is left out until its end: it was ended by the heal's reset of its connections (a
/// request in flight fails; the fence, lost during the cut, lets it write nothing). One that
/// runs on longer counts from the heal, so a replica that ignores its fence still shows.
fn cut_off(
    pass: &Pass,
    end: Timestamp,
    partitions: &BTreeMap<String, Vec<(Timestamp, Timestamp)>>,
) -> Vec<(Timestamp, Timestamp)> {
    let windows = partitions.get(&pass.replica).map_or(&[][..], Vec::as_slice);
    windows
        .iter()
        .map(|&(cut, healed)| {
            let reset = healed.checked_add(RESET_GRACE).unwrap_or(healed);
            match end > healed && end <= reset {
                true => (cut, end),
                false => (cut, healed),
            }
        })
        .collect()
}

/// `[start, end]` without the `paused` windows: the pieces during which a pass could run.
fn running(
    start: Timestamp,
    end: Timestamp,
    paused: &[(Timestamp, Timestamp)],
) -> Vec<(Timestamp, Timestamp)> {
    let mut pieces = vec![(start, end)];
    for (stopped, resumed) in paused {
        pieces = pieces
            .into_iter()
            .flat_map(|(a, b)| {
                if *resumed <= a || *stopped >= b {
                    return vec![(a, b)];
                }
                let mut left = Vec::new();
                if a < *stopped {
                    left.push((a, *stopped));
                }
                if *resumed < b {
                    left.push((*resumed, b));
                }
                left
            })
            .collect();
    }
    pieces
}

/// When the pause began that froze `pass` while its shard moved (see [`check_with_pauses`]):
/// the first pause within the pass at least `renew_deadline` long after whose start another
/// replica acquired the pass's shard, before the pass logged its fence stop.
fn frozen_while_moved<'a>(
    pass: &Pass,
    end: Timestamp,
    paused: &[(Timestamp, Timestamp)],
    renew_deadline: std::time::Duration,
    mut others: impl Iterator<Item = &'a (u64, Timestamp)>,
) -> Option<Timestamp> {
    let (fenced, shard) = (pass.fenced?, pass.shard?);
    let (stopped, _) = paused.iter().find(|(stopped, resumed)| {
        let long = resumed
            .duration_since(*stopped)
            .try_into()
            .is_ok_and(|length: std::time::Duration| length >= renew_deadline);
        long && *stopped >= pass.start && *resumed <= end && *resumed <= fenced
    })?;
    others
        .any(|(acquired, at)| *acquired == shard && at >= stopped && *at <= fenced)
        .then_some(*stopped)
}

/// One log, parsed.
struct ParsedLog {
    passes: Vec<Pass>,
    /// Shards this log's replica acquired (`shard acquired`, a takeover or not), and when.
    acquired: Vec<(u64, Timestamp)>,
    /// The last timestamp of any JSON line of the log.
    last: Option<Timestamp>,
}

fn parse_log(log: &str) -> ParsedLog {
    let mut passes: Vec<Pass> = Vec::new();
    let mut acquired = Vec::new();
    let mut last: Option<Timestamp> = None;
    // (replica, reconcile_id) -> index in `passes` of the unclosed start.
    let mut unclosed: HashMap<(String, u64), usize> = HashMap::new();
    for line in log.lines() {
        let line = line.trim();
        if !line.starts_with('{') {
            continue;
        }
        let Ok(parsed) = serde_json::from_str::<Line>(line) else {
            continue;
        };
        let Some(timestamp) = parsed
            .timestamp
            .as_deref()
            .and_then(|t| Timestamp::from_str(t).ok())
        else {
            continue;
        };
        last = Some(last.map_or(timestamp, |l| l.max(timestamp)));
        let kind = match parsed.message.as_deref() {
            Some("reconcile start") => Kind::Start,
            Some("reconcile end") => Kind::End,
            Some(m) if FENCE_STOPS.iter().any(|stop| m.starts_with(stop)) => Kind::FenceStop,
            Some(m) if m.starts_with(SHARD_ACQUIRED) => {
                acquired.extend(parsed.shard.map(|shard| (shard, timestamp)));
                continue;
            }
            _ => continue,
        };
        let Some(span) = reconcile_span(parsed.spans) else {
            continue;
        };
        let (Some(uid), Some(replica), Some(reconcile_id)) =
            (span.uid, span.replica, span.reconcile_id)
        else {
            continue;
        };
        let key = (replica, reconcile_id);
        if kind == Kind::FenceStop {
            if let Some(index) = unclosed.get(&key) {
                passes[*index].fenced.get_or_insert(timestamp);
            }
        } else if kind == Kind::Start {
            // An earlier unclosed start for this key stays open: its process restarted.
            unclosed.insert(key.clone(), passes.len());
            passes.push(Pass {
                uid,
                replica: key.0,
                reconcile_id,
                start: timestamp,
                end: None,
                result: None,
                shard: span.shard,
                fenced: None,
            });
        } else if let Some(index) = unclosed.remove(&key) {
            passes[index].end = Some(timestamp);
            passes[index].result = parsed.result;
        }
    }
    ParsedLog {
        passes,
        acquired,
        last,
    }
}

/// The messages a pass logs when its fence check fails (`reconcile::fenced`, and
/// `reconcile::failed` before an error status).
const FENCE_STOPS: [&str; 2] = ["stopping the pass: ", "not writing the error status: "];

/// The message of a shard round that acquired a shard (`shard::leases`; the field `shard`).
const SHARD_ACQUIRED: &str = "shard acquired";

/// The lines of a pass this module reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Start,
    End,
    FenceStop,
}

/// The `reconcile` span of a line (innermost first), or else any span with the pass's fields.
fn reconcile_span(spans: Vec<SpanFields>) -> Option<SpanFields> {
    let complete =
        |s: &SpanFields| s.uid.is_some() && s.replica.is_some() && s.reconcile_id.is_some();
    let named = spans
        .iter()
        .rposition(|s| complete(s) && s.names.iter().any(|n| n == "reconcile"));
    let index = named.or_else(|| spans.iter().rposition(complete))?;
    spans.into_iter().nth(index)
}

/// The fields of a log line this module reads. Duplicate keys are allowed: the last one wins.
#[derive(Default)]
struct Line {
    timestamp: Option<String>,
    message: Option<String>,
    result: Option<String>,
    /// An event's `shard` field (a shard round's lines).
    shard: Option<u64>,
    spans: Vec<SpanFields>,
}

/// The fields of one entry of a line's `spans`.
///
/// tracing-subscriber writes a span's name and its fields into one object, so a span field called
/// `name` (the Manifest's name) sits next to the span name under the same key: every `name` is
/// kept in `names`, and the Manifest name is not relied upon.
#[derive(Default)]
struct SpanFields {
    names: Vec<String>,
    uid: Option<String>,
    replica: Option<String>,
    reconcile_id: Option<u64>,
    shard: Option<u64>,
}

/// A number field, or a string holding one.
fn number(value: Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A string field; other scalars are taken in their JSON form, `null` as absent.
fn string(value: Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

impl<'de> Deserialize<'de> for Line {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LineVisitor;
        impl<'de> Visitor<'de> for LineVisitor {
            type Value = Line;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON log line")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Line, A::Error> {
                let mut line = Line::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "timestamp" => line.timestamp = string(map.next_value()?),
                        "message" => line.message = string(map.next_value()?),
                        "result" => line.result = string(map.next_value()?),
                        "shard" => line.shard = number(map.next_value()?),
                        "spans" => line.spans = map.next_value()?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(line)
            }
        }
        deserializer.deserialize_map(LineVisitor)
    }
}

impl<'de> Deserialize<'de> for SpanFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SpanVisitor;
        impl<'de> Visitor<'de> for SpanVisitor {
            type Value = SpanFields;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a span object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SpanFields, A::Error> {
                let mut span = SpanFields::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "name" => span.names.extend(string(map.next_value()?)),
                        "uid" => span.uid = string(map.next_value()?),
                        "replica" => span.replica = string(map.next_value()?),
                        "reconcile_id" => span.reconcile_id = number(map.next_value()?),
                        "shard" => span.shard = number(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(span)
            }
        }
        deserializer.deserialize_map(SpanVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `2026-11-30T13:01:<second>.000000Z`.
    fn ts(second: u32) -> String {
        format!("2026-11-30T13:01:{second:02}.000000Z")
    }

    fn at(second: u32) -> Timestamp {
        ts(second).parse().unwrap()
    }

    /// A log line in the replicas' exact shape (span name first, then the span's fields).
    fn line(second: u32, message: &str, uid: &str, replica: &str, id: u64) -> String {
        let result = if message == "reconcile end" {
            r#""result":"ready","#
        } else {
            ""
        };
        format!(
            r#"{{"timestamp":"{}","level":"INFO","message":"{message}",{result}"target":"module_manager::work::controller","spans":[{{"name":"reconcile","namespace":"ns","name":"m1","uid":"{uid}","module":"web","shard":17,"replica":"{replica}","reconcile_id":{id}}}]}}"#,
            ts(second)
        )
    }

    fn start(second: u32, uid: &str, replica: &str, id: u64) -> String {
        line(second, "reconcile start", uid, replica, id)
    }

    fn end(second: u32, uid: &str, replica: &str, id: u64) -> String {
        line(second, "reconcile end", uid, replica, id)
    }

    /// An unrelated line of `replica`, to mark when its process last wrote.
    fn other(second: u32) -> String {
        format!(
            r#"{{"timestamp":"{}","level":"INFO","message":"lease renewed","target":"module_manager::shard"}}"#,
            ts(second)
        )
    }

    fn log(name: &str, lines: &[String]) -> (String, String) {
        (name.to_owned(), lines.join("\n") + "\n")
    }

    #[test]
    fn a_paused_pass_does_not_run_while_its_replica_is_stopped() {
        // r1's pass runs 0..30 but r1 was stopped 2..28; r2's pass runs 10..20.
        let logs = vec![
            log("r1", &[start(0, "u", "r1", 1), end(30, "u", "r1", 1)]),
            log("r2", &[start(10, "u", "r2", 1), end(20, "u", "r2", 1)]),
        ];
        let uids = BTreeSet::from(["u".to_owned()]);
        assert_eq!(
            check(&logs, &uids).overlaps.len(),
            1,
            "without the pause: overlap"
        );
        let paused = BTreeMap::from([("r1".to_owned(), vec![(at(2), at(28))])]);
        let report = check_with_pauses(&logs, &uids, &paused, LAPSE);
        assert!(report.is_clean(), "{report}");
        // Resumed while r2's pass still runs: an overlap again, reported once.
        let paused = BTreeMap::from([("r1".to_owned(), vec![(at(2), at(15))])]);
        let report = check_with_pauses(&logs, &uids, &paused, LAPSE);
        assert_eq!(report.overlaps.len(), 1, "{report}");
        // Another replica's pause changes nothing for r1.
        let paused = BTreeMap::from([("r3".to_owned(), vec![(at(2), at(28))])]);
        assert_eq!(
            check_with_pauses(&logs, &uids, &paused, LAPSE)
                .overlaps
                .len(),
            1
        );
        assert_eq!(
            running(at(0), at(30), &[(at(2), at(28)), (at(29), at(40))]).len(),
            2
        );
    }

    #[test]
    fn a_partition_excuses_the_cut_off_replicas_passes_until_the_heal() {
        // r1 partitioned 2..8 (its connections reset at 8); r2 takes its shards over.
        let partitioned = BTreeMap::from([("r1".to_owned(), vec![(at(2), at(8))])]);
        let uids = BTreeSet::from(["u".to_owned()]);
        let outages = |logs: &[(String, String)]| {
            check_with_outages(logs, &uids, &BTreeMap::new(), &partitioned, LAPSE)
        };
        let r2 = log("r2", &[start(5, "u", "r2", 3), end(6, "u", "r2", 3)]);
        // A pass running when the cut came, hung until the heal's reset ended it at 8: nothing
        // of it arrived, so r2's pass 5..6 does not overlap it (without the partition it does).
        let hung = log("r1", &[start(0, "u", "r1", 1), end(8, "u", "r1", 1)]);
        let report = outages(&[hung.clone(), r2.clone()]);
        assert!(report.is_clean(), "{report}");
        assert_eq!(check(&[hung, r2.clone()], &uids).overlaps.len(), 1);
        // A pass r1 started just after the cut, before its renew deadline could tell it that
        // its shards were gone (a CI run of 2026-12-07 had two at about the cut): excused too.
        let started = log("r1", &[start(2, "u", "r1", 2), end(8, "u", "r1", 2)]);
        let report = outages(&[started, r2.clone()]);
        assert!(report.is_clean(), "{report}");
        // A pass hung in a request at the heal ends when the reset reaches it, a moment after
        // the heal (30 ms in a CI run of 2026-12-07): excused until then; without the grace
        // its end overlaps r2's pass that starts at the heal.
        let at_heal = log("r2", &[start(8, "u", "r2", 6), end(10, "u", "r2", 6)]);
        let reset = log("r1", &[start(1, "u", "r1", 7), end(9, "u", "r1", 7)]);
        let report = outages(&[reset, at_heal.clone()]);
        assert!(report.is_clean(), "{report}");
        // A pass that goes on after the heal counts from then: r1 ignoring its fence and
        // running 3..12 overlaps r2's pass that starts at the heal, and one 9..10 after it.
        let unfenced = log("r1", &[start(3, "u", "r1", 5), end(12, "u", "r1", 5)]);
        assert_eq!(outages(&[unfenced, at_heal]).overlaps.len(), 1);
        let r2_after = log("r2", &[start(9, "u", "r2", 4), end(10, "u", "r2", 4)]);
        let unfenced = log("r1", &[start(3, "u", "r1", 5), end(12, "u", "r1", 5)]);
        assert_eq!(outages(&[unfenced, r2_after]).overlaps.len(), 1);
    }

    /// The renew deadline the pause tests assume.
    const LAPSE: std::time::Duration = std::time::Duration::from_secs(3);

    /// r2 acquiring shard 17 at `second` (a shard round's line, no reconcile span).
    fn acquired(second: u32) -> String {
        format!(
            r#"{{"timestamp":"{}","level":"INFO","message":"shard acquired (takeover)","shard":17,"epoch":4,"from":"r1","target":"module_manager::shard::leases"}}"#,
            ts(second)
        )
    }

    #[test]
    fn a_pass_frozen_while_its_shard_moved_and_then_fenced_ran_only_before_the_pause() {
        // r1's pass (shard 17) starts at 0; r1 is stopped 2..15; r2 takes shard 17 over at 12
        // and runs a pass 13..20; r1 resumes and logs its fence stop at 17.
        let fence_stop = line(
            17,
            "stopping the pass: shard 17 is no longer owned",
            "u",
            "r1",
            1,
        );
        let r1 = |lines: &[String]| log("r1", lines);
        let fenced = r1(&[
            start(0, "u", "r1", 1),
            fence_stop.clone(),
            end(18, "u", "r1", 1),
        ]);
        let r2 = log(
            "r2",
            &[acquired(12), start(13, "u", "r2", 1), end(20, "u", "r2", 1)],
        );
        let passes = parse_passes(&fenced.1);
        assert_eq!(
            (passes[0].fenced, passes[0].shard),
            (Some(at(17)), Some(17))
        );
        let uids = BTreeSet::from(["u".to_owned()]);
        let paused = BTreeMap::from([("r1".to_owned(), vec![(at(2), at(15))])]);
        let logs = vec![fenced.clone(), r2.clone()];
        let report = check_with_pauses(&logs, &uids, &paused, LAPSE);
        assert!(report.is_clean(), "{report}");
        // Without its fence stop the pass went on after the pause: an overlap.
        let unfenced = r1(&[start(0, "u", "r1", 1), end(18, "u", "r1", 1)]);
        let report = check_with_pauses(&[unfenced, r2.clone()], &uids, &paused, LAPSE);
        assert_eq!(report.overlaps.len(), 1, "{report}");
        // No one else acquired the shard (r1 may have held it again after renewing): compared.
        let r2_without_takeover = log("r2", &[start(13, "u", "r2", 1), end(20, "u", "r2", 1)]);
        let logs = vec![fenced.clone(), r2_without_takeover];
        assert_eq!(
            check_with_pauses(&logs, &uids, &paused, LAPSE)
                .overlaps
                .len(),
            1
        );
        // A pause shorter than the renew deadline lapses nothing.
        let short = BTreeMap::from([("r1".to_owned(), vec![(at(9), at(11))])]);
        let logs = vec![fenced.clone(), r2.clone()];
        assert_eq!(
            check_with_pauses(&logs, &uids, &short, LAPSE)
                .overlaps
                .len(),
            1
        );
        // Never paused: compared whole.
        assert_eq!(check(&logs, &uids).overlaps.len(), 1);
        // A short pause 1..2 and the long one 5..15 (taken over at 12): the pieces before the
        // long pause are kept, so a pass of r2 at 3..4 overlaps the piece 2..5.
        let r2_early = log(
            "r2",
            &[
                start(3, "u", "r2", 2),
                end(4, "u", "r2", 2),
                acquired(12),
                start(13, "u", "r2", 1),
                end(20, "u", "r2", 1),
            ],
        );
        let two = BTreeMap::from([("r1".to_owned(), vec![(at(1), at(2)), (at(5), at(15))])]);
        let report = check_with_pauses(&[fenced, r2_early], &uids, &two, LAPSE);
        assert_eq!(
            report.overlaps,
            [overlap("u", ("r1", 1), ("r2", 2))],
            "{report}"
        );
    }

    fn uids(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn overlap(uid: &str, first: (&str, u64), second: (&str, u64)) -> Overlap {
        Overlap {
            uid: uid.to_owned(),
            first: (first.0.to_owned(), first.1),
            second: (second.0.to_owned(), second.1),
        }
    }

    #[test]
    fn parses_the_exact_line_shape() {
        let text = concat!(
            r#"{"timestamp":"2026-11-30T13:01:02.123456Z","level":"INFO","message":"reconcile start","target":"module_manager::work::controller","spans":[{"name":"reconcile","namespace":"ns","name":"m1","uid":"6f1c","module":"web","shard":17,"replica":"module-manager-0","reconcile_id":42}]}"#,
            "\n",
            r#"{"timestamp":"2026-11-30T13:01:02.223456Z","level":"INFO","message":"reconcile end","result":"ready","target":"module_manager::work::controller","spans":[{"name":"reconcile","namespace":"ns","name":"m1","uid":"6f1c","module":"web","shard":17,"replica":"module-manager-0","reconcile_id":42}]}"#,
            "\n",
        );
        let passes = parse_passes(text);
        assert_eq!(
            passes,
            vec![Pass {
                uid: "6f1c".into(),
                replica: "module-manager-0".into(),
                reconcile_id: 42,
                start: "2026-11-30T13:01:02.123456Z".parse().unwrap(),
                end: Some("2026-11-30T13:01:02.223456Z".parse().unwrap()),
                result: Some("ready".into()),
                shard: Some(17),
                fenced: None,
            }]
        );
    }

    #[test]
    fn finds_the_reconcile_span_whatever_the_key_order_and_nesting() {
        // tracing-subscriber writes the span's fields first and its name last; an outer span too.
        let text = [
            format!(
                r#"{{"timestamp":"{}","message":"reconcile start","spans":[{{"name":"worker","uid":"other","replica":"r0","reconcile_id":9}},{{"namespace":"ns","name":"m1","uid":"u1","replica":"r0","reconcile_id":3,"name":"reconcile"}}]}}"#,
                ts(1)
            ),
            // No span called `reconcile`: any span with the fields will do; `result` is absent.
            format!(
                r#"{{"timestamp":"{}","message":"reconcile end","spans":[{{"name":"m1","uid":"u1","replica":"r0","reconcile_id":"3"}}]}}"#,
                ts(2)
            ),
        ]
        .join("\n");
        let passes = parse_passes(&text);
        assert_eq!(passes.len(), 1);
        assert_eq!(passes[0].uid, "u1");
        assert_eq!(passes[0].reconcile_id, 3);
        assert_eq!(passes[0].end, Some(at(2)));
        assert_eq!(passes[0].result, None);
    }

    #[test]
    fn ignores_non_json_and_unrelated_lines() {
        let text = [
            "module-manager starting".to_owned(),
            "{not json".to_owned(),
            String::new(),
            other(1),
            start(2, "a", "r0", 1),
            r#"{"timestamp":"2026-11-30T13:01:03Z","message":"applied","spans":[{"name":"reconcile","uid":"a","replica":"r0","reconcile_id":1}]}"#.to_owned(),
            r#"{"timestamp":"bogus","message":"reconcile start","spans":[{"name":"reconcile","uid":"b","replica":"r0","reconcile_id":2}]}"#.to_owned(),
            r#"{"timestamp":"2026-11-30T13:01:03Z","message":"reconcile start","spans":[{"name":"reconcile","replica":"r0"}]}"#.to_owned(),
            r#"["an","array"]"#.to_owned(),
            end(4, "a", "r0", 1),
            end(5, "c", "r0", 7), // no start: ignored
        ]
        .join("\n");
        let passes = parse_passes(&text);
        assert_eq!(passes.len(), 1);
        assert_eq!((passes[0].start, passes[0].end), (at(2), Some(at(4))));
        assert_eq!(passes[0].result.as_deref(), Some("ready"));
    }

    #[test]
    fn reused_ids_after_a_restart_pair_with_the_latest_start() {
        let text = [
            start(1, "a", "r0", 1),
            start(2, "b", "r0", 2),
            // SIGKILL; restarted under the same name, ids from 1 again.
            start(10, "c", "r0", 1),
            end(11, "c", "r0", 1),
            start(12, "d", "r0", 2),
            end(13, "d", "r0", 2),
        ]
        .join("\n");
        let passes = parse_passes(&text);
        let summary: Vec<_> = passes
            .iter()
            .map(|p| (p.uid.as_str(), p.reconcile_id, p.start, p.end))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("a", 1, at(1), None),
                ("b", 2, at(2), None),
                ("c", 1, at(10), Some(at(11))),
                ("d", 2, at(12), Some(at(13))),
            ]
        );
    }

    #[test]
    fn sequential_passes_across_a_handover_are_clean() {
        let logs = [
            log(
                "r0.log",
                &[
                    start(1, "a", "r0", 1),
                    end(2, "a", "r0", 1),
                    start(3, "b", "r0", 2),
                    end(4, "b", "r0", 2),
                    start(5, "a", "r0", 3),
                    end(6, "a", "r0", 3),
                ],
            ),
            log(
                "r1.log",
                &[
                    // Starts exactly when r0's pass ended: touching is not overlapping.
                    start(6, "a", "r1", 1),
                    end(7, "a", "r1", 1),
                    start(8, "b", "r1", 2),
                    end(9, "b", "r1", 2),
                ],
            ),
        ];
        let report = check(&logs, &uids(&["a", "b"]));
        assert!(report.is_clean(), "{report}");
        assert_eq!((report.passes, report.open), (5, 0));
    }

    #[test]
    fn overlapping_passes_of_two_replicas_are_reported() {
        let logs = [
            log("r0.log", &[start(1, "a", "r0", 1), end(5, "a", "r0", 1)]),
            log(
                "r1.log",
                &[
                    start(3, "a", "r1", 7),
                    start(3, "b", "r1", 8),
                    end(4, "a", "r1", 7),
                    end(4, "b", "r1", 8),
                ],
            ),
        ];
        let report = check(&logs, &uids(&["a", "b"]));
        assert_eq!(report.overlaps, vec![overlap("a", ("r0", 1), ("r1", 7))]);
        assert!(!report.is_clean());
        let text = report.to_string();
        assert!(text.contains("overlap on a: r0 #1 and r1 #7"), "{text}");
    }

    #[test]
    fn a_killed_replicas_open_pass_lasts_until_its_last_line() {
        let killed = log("r0.log", &[start(1, "a", "r0", 1), other(3)]);

        // The takeover starts after the killed process's last line: clean.
        let after = log("r1.log", &[start(4, "a", "r1", 1), end(5, "a", "r1", 1)]);
        let report = check(&[killed.clone(), after], &uids(&["a"]));
        assert!(report.is_clean(), "{report}");
        assert_eq!((report.passes, report.open), (2, 1));

        // It starts while the killed process was still writing: overlap.
        let before = log("r1.log", &[start(2, "a", "r1", 1), end(5, "a", "r1", 1)]);
        let report = check(&[killed, before], &uids(&["a"]));
        assert_eq!(report.overlaps, vec![overlap("a", ("r0", 1), ("r1", 1))]);
    }

    #[test]
    fn expected_uids_without_a_completed_pass_are_unreconciled() {
        let logs = [log(
            "r0.log",
            &[
                start(1, "a", "r0", 1),
                end(2, "a", "r0", 1),
                start(3, "b", "r0", 2),
            ],
        )];
        let report = check(&logs, &uids(&["a", "b", "c"]));
        assert_eq!(report.unreconciled, vec!["b".to_owned(), "c".to_owned()]);
        assert!(report.overlaps.is_empty());
        assert!(!report.is_clean());
        assert!(report.to_string().contains("never reconciled: c"));
    }

    #[test]
    fn display_lists_at_most_twenty_of_each() {
        let expected: BTreeSet<String> = (0..25).map(|i| format!("u{i:02}")).collect();
        let report = check(&[], &expected);
        let text = report.to_string();
        assert_eq!(text.matches("never reconciled").count(), DISPLAY_LIMIT);
        assert!(text.contains("... and 5 more unreconciled"), "{text}");
    }
}
