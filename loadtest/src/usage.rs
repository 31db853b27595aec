//! CPU and memory of a local replica as a pod would be charged for them: the process and every
//! descendant — the long-lived renderer child and any helm run in flight — from `/proc`.
//!
//! A replica's own `/proc/<pid>/stat` counts its children only once they have ended and been
//! reaped (`cutime`/`cstime`), and its `VmRSS` is its own: the renderer, which lives as long as
//! the replica, would never be counted. Here every process of the tree counts with
//! `utime + stime + cutime + cstime` (so a child that ends moves from its own line into its
//! parent's `cutime`, counted once either way) and its `VmRSS` (pages shared between the
//! processes are counted in each, as `ps` would).

use std::collections::BTreeMap;

use test_support::fleet::{cpu_seconds_from_stat, rss_bytes};

/// One process as read from `/proc/<pid>/stat`: (parent pid, CPU seconds incl. reaped children).
fn stat_of(text: &str) -> Option<(u32, f64)> {
    let rest = &text[text.rfind(')')? + 1..];
    // rest: state, ppid, …
    let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
    Some((ppid, cpu_seconds_from_stat(text)?))
}

/// The pids of `root` and all its descendants, given every process's parent.
pub fn descendants(root: u32, parents: &BTreeMap<u32, u32>) -> Vec<u32> {
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, p)| **p == parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    tree
}

/// (CPU seconds, resident bytes) of process `root` and its descendants; `None` when `root` is
/// gone. A descendant that exits while it is read is left out of this reading.
pub fn tree_usage(root: u32) -> Option<(f64, f64)> {
    tree_total(root, &processes(), rss_bytes)
}

/// Every process now: pid → (parent pid, CPU seconds incl. reaped children).
fn processes() -> BTreeMap<u32, (u32, f64)> {
    let mut table = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return table;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(stat) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .as_deref()
            .and_then(stat_of)
        {
            table.insert(pid, stat);
        }
    }
    table
}

/// The sums over `root` and its descendants in `table`, with each one's resident bytes from
/// `rss` (none: nothing resident, as for a zombie); `None` when `root` is not in the table or
/// has no RSS.
fn tree_total(
    root: u32,
    table: &BTreeMap<u32, (u32, f64)>,
    rss: impl Fn(u32) -> Option<f64>,
) -> Option<(f64, f64)> {
    let (_, root_cpu) = *table.get(&root)?;
    let (mut cpu, mut resident) = (root_cpu, rss(root)?);
    let parents: BTreeMap<u32, u32> = table.iter().map(|(pid, (ppid, _))| (*pid, *ppid)).collect();
    for pid in descendants(root, &parents).into_iter().skip(1) {
        cpu += table.get(&pid).map_or(0.0, |(_, c)| *c);
        resident += rss(pid).unwrap_or(0.0);
    }
    Some((cpu, resident))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_are_found_at_any_depth_and_strangers_are_not() {
        let parents = BTreeMap::from([(10, 1), (11, 10), (12, 11), (13, 10), (20, 1), (21, 20)]);
        let mut tree = descendants(10, &parents);
        tree.sort_unstable();
        assert_eq!(tree, vec![10, 11, 12, 13]);
        assert_eq!(descendants(12, &parents), vec![12]);
    }

    #[test]
    fn a_stat_line_gives_the_parent_and_the_cpu() {
        // SAFETY: sysconf has no memory effects.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let line = "42 (a) b) S 7 42 42 0 -1 4194560 1 0 0 0 10 20 30 40 20 0 1 0 5 6 7";
        let (ppid, cpu) = stat_of(line).unwrap();
        assert_eq!(ppid, 7);
        assert_eq!(cpu, 100.0 / hz);
    }

    #[test]
    fn the_tree_sums_cpu_and_memory_of_every_descendant() {
        // 10 is the replica, 11 its renderer, 12 a helm run the renderer… (any depth), 20 a
        // stranger.
        let table = BTreeMap::from([
            (10, (1, 5.0)),
            (11, (10, 2.0)),
            (12, (11, 0.5)),
            (20, (1, 100.0)),
        ]);
        let rss = |pid: u32| match pid {
            10 => Some(30.0),
            11 => Some(40.0),
            20 => Some(1000.0),
            _ => None, // a zombie
        };
        assert_eq!(tree_total(10, &table, rss), Some((7.5, 70.0)));
        assert_eq!(tree_total(11, &table, rss), Some((2.5, 40.0)));
        assert_eq!(tree_total(99, &table, rss), None, "gone");
    }

    #[test]
    fn a_running_child_is_found_under_this_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let table = processes();
        let parents: BTreeMap<u32, u32> =
            table.iter().map(|(pid, (ppid, _))| (*pid, *ppid)).collect();
        let tree = descendants(std::process::id(), &parents);
        let usage = tree_usage(std::process::id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(tree.contains(&child.id()), "{tree:?}");
        assert!(usage.is_some_and(|(cpu, rss)| cpu >= 0.0 && rss > 0.0));
    }
}
