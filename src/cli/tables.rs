//! The admin API's answers as tables for a terminal (pure).

use k8s_openapi::jiff::Timestamp;

use crate::admin::{
    BudgetUse, DrainAnswer, ManifestAnswer, ManifestSource, QueueAnswer, ShardsAnswer,
    TargetsAnswer,
};
use crate::shard::fleet::{ShardStatus, ShardView};
use crate::shard::membership::{MemberState, Members};

/// Rows as aligned columns, two spaces apart, without trailing blanks.
pub(super) fn columns(rows: &[Vec<String>]) -> String {
    let widths = column_widths(rows);
    rows.iter().map(|row| aligned(row, &widths)).collect()
}

/// The width of each column of `rows`: its widest cell.
pub(super) fn column_widths(rows: &[Vec<String>]) -> Vec<usize> {
    let count = rows.iter().map(Vec::len).max().unwrap_or(0);
    (0..count)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// One row padded to `widths` (a cell wider than its column pushes the rest right), two spaces
/// apart, without trailing blanks, and a newline.
pub(super) fn aligned(row: &[String], widths: &[usize]) -> String {
    let mut line = String::new();
    for (i, cell) in row.iter().enumerate() {
        if i > 0 {
            line += "  ";
        }
        let width = widths.get(i).copied().unwrap_or(0);
        line += &format!("{cell:<width$}");
    }
    let mut line = line.trim_end().to_owned();
    line.push('\n');
    line
}

/// An age as kubectl prints it: `42s`, `5m`, `3h`, `12d`.
pub fn age(since: Option<Timestamp>, now: Timestamp) -> String {
    let Some(since) = since else {
        return "-".into();
    };
    let seconds = now.duration_since(since).as_secs().max(0);
    match seconds {
        0..120 => format!("{seconds}s"),
        120..7200 => format!("{}m", seconds / 60),
        7200..172_800 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86400),
    }
}

/// `text` cut to `width` characters, ending in `…` when cut.
pub(super) fn shortened(text: &str, width: usize) -> String {
    let one_line = text.replace('\n', " ");
    if one_line.chars().count() <= width {
        return one_line;
    }
    let kept: String = one_line.chars().take(width.saturating_sub(1)).collect();
    kept + "…"
}

pub(super) fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// How long until something is due, for a terminal: `45.0s`, `12m30s`, `2h05m`.
fn due_in(seconds: Option<f64>) -> String {
    let Some(seconds) = seconds else {
        return "-".to_owned();
    };
    let whole = seconds.max(0.0).round() as u64;
    match whole {
        _ if seconds < 60.0 => format!("{seconds:.1}s"),
        0..3600 => format!("{}m{:02}s", whole / 60, whole % 60),
        _ => format!("{}h{:02}m", whole / 3600, whole % 3600 / 60),
    }
}

fn yes_no(value: bool) -> String {
    if value { "yes" } else { "no" }.to_owned()
}

/// A shard state as the API spells it.
pub fn shard_status_name(status: ShardStatus) -> &'static str {
    match status {
        ShardStatus::Owned => "owned",
        ShardStatus::Handover => "handover",
        ShardStatus::Free => "free",
        ShardStatus::Orphaned => "orphaned",
    }
}

/// A member state as the API spells it.
pub fn member_state_name(state: MemberState) -> &'static str {
    match state {
        MemberState::Active => "active",
        MemberState::Restarting => "restarting",
        MemberState::Draining => "draining",
    }
}

/// The members as a table, for the command line.
pub fn members_table(members: &Members) -> String {
    let mut out = format!("{:<32} {:<5} {}\n", "NAME", "LIVE", "UNCHANGED FOR");
    for member in &members.members {
        let live = if member.live { "yes" } else { "no" };
        out += &format!(
            "{:<32} {:<5} {:.1}s\n",
            member.name, live, member.unchanged_for_seconds
        );
    }
    if !members.self_renewed {
        out += "(the replica asked has not renewed its own Lease within the lease duration)\n";
    }
    out
}

fn shard_row(shard: &ShardView) -> Vec<String> {
    vec![
        shard.shard.to_string(),
        or_dash(shard.owner.as_deref()),
        or_dash(shard.desired_owner.as_deref()),
        shard_status_name(shard.state).to_owned(),
        shard.epoch.to_string(),
        or_dash(shard.manifests),
        or_dash(shard.queued),
        or_dash(shard.scheduled),
    ]
}

/// The columns of a shard's line ([`shard_row`]).
const SHARD_COLUMNS: [&str; 8] = [
    "SHARD",
    "OWNER",
    "DESIRED",
    "STATE",
    "EPOCH",
    "MANIFESTS",
    "DUE",
    "SCHEDULED",
];

/// `GET /v1/shards` as tables: one line per shard, then one per member, then the fleet.
pub fn shards_table(answer: &ShardsAnswer) -> String {
    let mut rows = vec![SHARD_COLUMNS.map(String::from).to_vec()];
    rows.extend(answer.shards.iter().map(shard_row));
    let mut out = columns(&rows);
    if answer.shards.is_empty() {
        out += "(no shard round has completed on the replica asked yet)\n";
    }
    out.push('\n');
    let mut rows = vec![
        [
            "MEMBER",
            "LIVE",
            "STATE",
            "SHARDS",
            "DESIRED",
            "DUE",
            "IN FLIGHT",
            "SCHEDULED",
            "MANIFESTS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    rows.extend(answer.members.iter().map(|m| {
        vec![
            m.name.clone(),
            yes_no(m.live),
            m.state.map_or("no lease", member_state_name).to_owned(),
            m.shards.to_string(),
            m.desired_shards.to_string(),
            or_dash(m.queued),
            or_dash(m.in_flight),
            or_dash(m.scheduled),
            or_dash(m.manifests),
        ]
    }));
    out += &columns(&rows);
    out += &format!(
        "\nfleet {}: {} shards, answered by {}",
        answer.fleet, answer.shard_count, answer.replica
    );
    if let Some(replicas) = answer.desired_replicas {
        out += &format!(", {replicas} desired replicas");
    }
    out.push('\n');
    if answer.self_fenced {
        out += "(the replica asked is fenced: its own Lease renewal is overdue, it does no work)\n";
    }
    out
}

/// `GET /v1/shards/{k}` as a table.
pub fn shard_table(shard: &ShardView) -> String {
    let rows: Vec<Vec<String>> = SHARD_COLUMNS
        .iter()
        .zip(shard_row(shard))
        .map(|(name, value)| vec![(*name).to_owned(), value])
        .collect();
    columns(&rows)
}

/// `GET /v1/queue` as tables: the replica's queue per shard (due and waiting, in flight,
/// scheduled for later), then every member's load.
pub fn queue_table(answer: &QueueAnswer) -> String {
    let mut rows = vec![
        [
            "SHARD",
            "DUE",
            "IN FLIGHT",
            "SCHEDULED",
            "OLDEST WAIT",
            "NEXT DUE IN",
        ]
        .map(String::from)
        .to_vec(),
    ];
    rows.extend(answer.queue.shards.iter().map(|(shard, q)| {
        vec![
            shard.to_string(),
            q.depth.to_string(),
            q.in_flight.to_string(),
            q.scheduled.to_string(),
            format!("{:.1}s", q.oldest_wait_seconds),
            due_in(q.next_due_in_seconds),
        ]
    }));
    let mut out = columns(&rows);
    let queue = &answer.queue;
    out += &format!(
        "{}: {} due, {} in flight, {} scheduled",
        if answer.replica.is_empty() {
            "the replica asked"
        } else {
            &answer.replica
        },
        queue.depth,
        queue.in_flight,
        queue.scheduled,
    );
    if let Some(next) = queue.next_due_in_seconds {
        out += &format!(" (next due in {})", due_in(Some(next)));
    }
    out += "\n\n";
    let mut rows = vec![
        [
            "MEMBER",
            "LIVE",
            "STATE",
            "DUE",
            "IN FLIGHT",
            "SCHEDULED",
            "NEXT DUE",
            "MANIFESTS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    rows.extend(answer.members.iter().map(|m| {
        vec![
            m.name.clone(),
            yes_no(m.live),
            member_state_name(m.state).to_owned(),
            or_dash(m.queued),
            or_dash(m.in_flight),
            or_dash(m.scheduled),
            or_dash(m.next_due),
            or_dash(m.manifests),
        ]
    }));
    out += &columns(&rows);
    out
}

/// `GET /v1/manifests/{namespace}/{name}` as a table.
pub fn manifest_table(answer: &ManifestAnswer) -> String {
    let state = answer.state.map(|s| format!("{s:?}"));
    let source = match answer.source {
        ManifestSource::Cache => "the cache of the replica asked",
        ManifestSource::Api => "the API server",
    };
    let rows = [
        (
            "MANIFEST",
            Some(format!("{}/{}", answer.namespace, answer.name)),
        ),
        ("UID", answer.uid.clone()),
        ("SHARD", answer.shard.map(|k| k.to_string())),
        ("OWNER", answer.owner.clone()),
        ("STATE", state),
        ("REASON", answer.reason.clone()),
        ("MESSAGE", answer.message.clone()),
        ("FROM", Some(source.to_owned())),
    ];
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(name, value)| vec![name.to_owned(), or_dash(value)])
        .collect();
    columns(&rows)
}

/// `POST`/`DELETE /v1/drain` as a line.
pub fn drain_table(answer: &DrainAnswer) -> String {
    if answer.draining {
        "draining: the replica asked hands its shards over and takes none\n".to_owned()
    } else {
        "not draining: the replica asked takes shards again\n".to_owned()
    }
}

/// `GET /v1/targets` as a table at `now`: one line per target (failing ones first, by reason),
/// then the fleet's counts by reason.
pub fn targets_table(answer: &TargetsAnswer, now: Timestamp) -> String {
    let mut rows = vec![
        [
            "TARGET",
            "SERVER",
            "READY",
            "REASON",
            "FAILING FOR",
            "CREDENTIAL EXPIRES IN",
            "REQUESTS/MIN",
            "MESSAGE",
        ]
        .map(String::from)
        .to_vec(),
    ];
    rows.extend(answer.rows.iter().map(|row| {
        let key = if row.key == "kubeconfig" {
            String::new()
        } else {
            format!(":{}", row.key)
        };
        let expires = row.credential_expires.map(|at| {
            let left = at.duration_since(now).as_secs();
            let text = if left < 0 {
                format!("expired {} ago", age(Some(at), now))
            } else {
                age(Some(now), at)
            };
            if row.credential_due {
                format!("{text} (due)")
            } else {
                text
            }
        });
        let message = row.message.as_deref().or(row.secret_problem.as_deref());
        vec![
            format!("{}/{}{key}", row.namespace, row.secret),
            or_dash(row.server.as_deref()),
            format!("{}/{}", row.ready, row.manifests),
            or_dash(row.reason.as_deref()),
            row.failing_since
                .map_or_else(|| "-".to_owned(), |s| age(Some(s), now)),
            or_dash(expires),
            or_dash(row.budget.as_ref().map(budget_use)),
            message.map_or_else(|| "-".to_owned(), |m| shortened(m, 80)),
        ]
    }));
    let mut out = columns(&rows);
    if answer.rows_omitted > 0 {
        out += &format!("({} more not shown: --limit)\n", answer.rows_omitted);
    }
    let reasons: Vec<String> = answer
        .by_reason
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    out += &format!(
        "{} targets, {} Manifests; {} failing{}; {} with a credential due; {} throttled\n",
        answer.targets,
        answer.manifests,
        answer.failing,
        if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join(", "))
        },
        answer.expiring,
        answer.throttled,
    );
    out
}

/// A target's requests of the last minute, as a share of its budget, and those that waited:
/// `1800 (60%), 12 waited`.
fn budget_use(used: &BudgetUse) -> String {
    let share = format!("{} ({:.0}%)", used.requests_per_minute, used.used * 100.0);
    if used.waits_per_minute > 0 {
        format!("{share}, {} waited", used.waits_per_minute)
    } else {
        share
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::testing::fleet;
    use crate::admin::{ManifestSource, queue_answer, shards_answer};
    use crate::api::State as ManifestState;
    use crate::shard::membership::MemberView;
    use crate::work::queue::{QueueSnapshot, ShardQueue};
    use serde_json::json;

    #[test]
    fn members_print_as_a_table() {
        let members = Members {
            members: vec![
                MemberView {
                    name: "module-manager-0".into(),
                    live: true,
                    unchanged_for_seconds: 1.25,
                    state: Default::default(),
                    load: None,
                },
                MemberView {
                    name: "module-manager-1".into(),
                    live: false,
                    unchanged_for_seconds: 20.0,
                    state: Default::default(),
                    load: None,
                },
            ],
            self_renewed: false,
            renewed_at: None,
        };
        let table = members_table(&members);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("NAME") && lines[0].contains("LIVE"));
        assert!(
            lines[1].starts_with("module-manager-0")
                && lines[1].contains("yes")
                && lines[1].ends_with("1.2s")
        );
        assert!(lines[2].contains(" no ") && lines[2].ends_with("20.0s"));
        assert!(lines[3].contains("has not renewed"));
    }

    /// The command line's client against the real router on a loopback port.
    #[test]
    fn shards_print_as_tables() {
        let table = shards_table(&shards_answer(&fleet()));
        let lines: Vec<&str> = table.lines().collect();
        let words = |line: &str| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            words(lines[0]),
            [
                "SHARD",
                "OWNER",
                "DESIRED",
                "STATE",
                "EPOCH",
                "MANIFESTS",
                "DUE",
                "SCHEDULED"
            ]
        );
        assert_eq!(
            words(lines[1]),
            ["0", "mm-0", "mm-0", "owned", "3", "7", "1", "6"]
        );
        assert_eq!(
            words(lines[2]),
            ["1", "mm-1", "mm-0", "handover", "3", "-", "-", "-"]
        );
        assert_eq!(
            words(lines[3]),
            ["2", "-", "mm-0", "free", "3", "-", "-", "-"]
        );
        assert_eq!(
            words(lines[4]),
            ["3", "gone", "mm-0", "orphaned", "3", "-", "-", "-"]
        );
        assert_eq!(lines[5], "");
        assert!(lines[6].starts_with("MEMBER") && lines[6].contains("IN FLIGHT"));
        assert_eq!(
            words(lines[7]),
            ["gone", "no", "no", "lease", "1", "0", "-", "-", "-", "-"]
        );
        assert_eq!(
            words(lines[8]),
            ["mm-0", "yes", "active", "1", "4", "2", "1", "7", "10"]
        );
        assert_eq!(
            lines[11],
            "fleet mm: 4 shards, answered by mm-0, 2 desired replicas"
        );
        // Columns line up: every shard row's OWNER starts where the header's does.
        let owner_at = lines[0].find("OWNER").unwrap();
        assert_eq!(lines[3].find("- ").unwrap(), owner_at);
        assert!(table.lines().all(|l| !l.ends_with(' ')));

        let empty = shards_table(&ShardsAnswer {
            self_fenced: true,
            ..Default::default()
        });
        assert!(empty.contains("no shard round has completed"), "{empty}");
        assert!(empty.contains("fenced"), "{empty}");
    }

    #[test]
    fn one_shard_prints_as_a_table() {
        let table = shard_table(&fleet().shards[0]);
        assert_eq!(
            table,
            "SHARD      0\nOWNER      mm-0\nDESIRED    mm-0\nSTATE      owned\nEPOCH      3\nMANIFESTS  7\nDUE        1\nSCHEDULED  6\n"
        );
    }

    #[test]
    fn the_queue_prints_as_tables() {
        let answer = QueueAnswer {
            replica: "mm-0".into(),
            queue: QueueSnapshot {
                depth: 3,
                in_flight: 1,
                scheduled: 40,
                next_due_in_seconds: Some(750.4),
                shards: [
                    (
                        0,
                        ShardQueue {
                            depth: 2,
                            in_flight: 1,
                            scheduled: 0,
                            oldest_wait_seconds: 1.25,
                            next_due_in_seconds: None,
                        },
                    ),
                    (
                        3,
                        ShardQueue {
                            depth: 1,
                            in_flight: 0,
                            scheduled: 40,
                            oldest_wait_seconds: 0.0,
                            next_due_in_seconds: Some(750.4),
                        },
                    ),
                ]
                .into(),
            },
            members: queue_answer(
                String::new(),
                QueueSnapshot::default(),
                &Members {
                    members: fleet().members,
                    ..Default::default()
                },
            )
            .members,
        };
        let table = queue_table(&answer);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "SHARD  DUE  IN FLIGHT  SCHEDULED  OLDEST WAIT  NEXT DUE IN"
        );
        assert_eq!(lines[1], "0      2    1          0          1.2s         -");
        assert_eq!(
            lines[2],
            "3      1    0          40         0.0s         12m30s"
        );
        assert_eq!(
            lines[3],
            "mm-0: 3 due, 1 in flight, 40 scheduled (next due in 12m30s)"
        );
        assert_eq!(lines[4], "");
        assert_eq!(
            lines[5],
            "MEMBER  LIVE  STATE     DUE  IN FLIGHT  SCHEDULED  NEXT DUE              MANIFESTS"
        );
        assert_eq!(
            lines[6],
            "mm-0    yes   active    2    1          7          2026-12-01T12:00:00Z  10"
        );
        assert_eq!(
            lines[7],
            "mm-1    yes   draining  -    -          -          -                     -"
        );
    }

    #[test]
    fn due_times_print_in_the_largest_fitting_units() {
        assert_eq!(due_in(None), "-");
        assert_eq!(due_in(Some(45.04)), "45.0s");
        assert_eq!(due_in(Some(59.96)), "60.0s");
        assert_eq!(due_in(Some(61.0)), "1m01s");
        assert_eq!(due_in(Some(3599.4)), "59m59s");
        assert_eq!(due_in(Some(7500.0)), "2h05m");
    }

    #[test]
    fn a_manifest_prints_as_a_table() {
        let answer = ManifestAnswer {
            namespace: "default".into(),
            name: "web".into(),
            uid: Some("0b7a4a2c-6a4f-4d0e-9a53-3c1f6a3e2b10".into()),
            shard: Some(4),
            owner: Some("mm-1".into()),
            state: Some(ManifestState::Ready),
            reason: Some("Ready".into()),
            message: None,
            source: ManifestSource::Api,
        };
        assert_eq!(
            manifest_table(&answer),
            "MANIFEST  default/web\nUID       0b7a4a2c-6a4f-4d0e-9a53-3c1f6a3e2b10\nSHARD     4\nOWNER     mm-1\nSTATE     Ready\nREASON    Ready\nMESSAGE   -\nFROM      the API server\n"
        );
    }

    #[test]
    fn the_drain_switch_prints_as_a_line() {
        assert!(drain_table(&DrainAnswer { draining: true }).starts_with("draining:"));
        assert!(drain_table(&DrainAnswer { draining: false }).starts_with("not draining:"));
        assert_eq!(
            serde_json::to_value(DrainAnswer { draining: true }).unwrap(),
            json!({"draining": true})
        );
    }
}
