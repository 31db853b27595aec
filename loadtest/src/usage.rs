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
    let mut parents = BTreeMap::new();
    let mut cpu = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((ppid, seconds)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .as_deref()
            .and_then(stat_of)
        {
            parents.insert(pid, ppid);
            cpu.insert(pid, seconds);
        }
    }
    let root_cpu = *cpu.get(&root)?;
    let root_rss = rss_bytes(root)?;
    let (mut total_cpu, mut total_rss) = (root_cpu, root_rss);
    for pid in descendants(root, &parents).into_iter().skip(1) {
        total_cpu += cpu.get(&pid).copied().unwrap_or(0.0);
        // A zombie has no VmRSS line: nothing resident.
        total_rss += rss_bytes(pid).unwrap_or(0.0);
    }
    Some((total_cpu, total_rss))
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
    fn a_child_counts_in_the_tree() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let own = test_support::fleet::proc_usage(std::process::id()).unwrap();
        let tree = tree_usage(std::process::id()).unwrap();
        let child_rss = rss_bytes(child.id()).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(child_rss > 0.0);
        // The tree holds at least this process and the child (this process's RSS may move a
        // little between the two readings).
        assert!(
            tree.1 > own.1 * 0.9 + child_rss * 0.5,
            "{tree:?} {own:?} {child_rss}"
        );
    }
}
