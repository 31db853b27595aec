//! A CPU quota per local replica, so that a fleet of N replicas on one machine behaves like N
//! pods with CPU limits (the thesis gave each shard 2 CPUs): without it every replica competes
//! for the same cores and adding replicas cannot add capacity. One cgroup per replica name
//! (`module-manager-loadtest/<harness pid>-<fleet>/<replica>`, kept across restarts of that replica; the quota is written at every start); helm
//! processes the replica starts are its children and inherit the cgroup. Needs root and a
//! writable cgroup filesystem (v2 with the cpu controller, or v1's `cpu` hierarchy).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

const PERIOD_US: u64 = 100_000;

enum Version {
    /// `cpu.cfs_quota_us` / `cpu.cfs_period_us` under `/sys/fs/cgroup/cpu`.
    V1,
    /// `cpu.max` under the unified hierarchy.
    V2,
}

/// The cgroups of one fleet's replicas.
pub struct CpuLimit {
    dir: PathBuf,
    version: Version,
    quota_us: u64,
}

impl CpuLimit {
    /// Prepares `module-manager-loadtest/<fleet>` with a quota of `cores` per replica.
    pub fn create(fleet: &str, cores: f64) -> anyhow::Result<Self> {
        if !(0.01..=1024.0).contains(&cores) {
            bail!("CPU limit per replica must be between 0.01 and 1024 cores, not {cores}");
        }
        let (root, version) = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (PathBuf::from("/sys/fs/cgroup"), Version::V2)
        } else if Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() {
            (PathBuf::from("/sys/fs/cgroup/cpu"), Version::V1)
        } else {
            bail!(
                "no cgroup CPU controller found under /sys/fs/cgroup: run without --cpu-per-replica"
            );
        };
        let base = root.join("module-manager-loadtest");
        // This process's id in the name: a directory left by a crashed run is never reused
        // with its old quota.
        let dir = base.join(format!("{}-{fleet}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| {
            format!(
                "create {} (CPU limits need root and a writable cgroup filesystem)",
                dir.display()
            )
        })?;
        if let Version::V2 = version {
            // Delegate the cpu controller down to the replicas' cgroups.
            for parent in [&root, &base, &dir] {
                std::fs::write(parent.join("cgroup.subtree_control"), "+cpu").with_context(
                    || format!("enable the cpu controller in {}", parent.display()),
                )?;
            }
        }
        Ok(Self {
            dir,
            version,
            quota_us: (cores * PERIOD_US as f64).round() as u64,
        })
    }

    /// Puts process `pid` (replica `member`) into the replica's cgroup.
    pub fn add(&self, member: &str, pid: u32) -> anyhow::Result<()> {
        let dir = self.dir.join(member);
        if !dir.exists() {
            std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
        }
        {
            match self.version {
                Version::V1 => {
                    std::fs::write(dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())?;
                    std::fs::write(dir.join("cpu.cfs_quota_us"), self.quota_us.to_string())?;
                }
                Version::V2 => {
                    std::fs::write(
                        dir.join("cpu.max"),
                        format!("{} {PERIOD_US}", self.quota_us),
                    )?;
                }
            }
        }
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("move {member} (pid {pid}) into {}", dir.display()))
    }

    /// Removes the replicas' cgroups (their processes must have exited).
    pub fn remove(self) {
        drop(self);
    }
}

impl Drop for CpuLimit {
    /// Best effort: a cgroup that still holds a process (an orphaned helm) stays.
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                if entry.path().is_dir() {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
