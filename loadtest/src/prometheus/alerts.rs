//! What each alert of `deploy/monitoring/prometheusrule.yaml` may do during a run (pure).
//!
//! A run without faults must fire none (an alert may go pending: a queue wait spike on a
//! loaded machine is not an alert until its `for` has passed). A run with faults (`chaos`:
//! replicas killed and paused) may fire the alerts about what it does to the fleet, no other.
//! None is required to show: `ModuleManagerUnownedShards` went pending for 1 s in one short
//! `chaos` and not at all in the next (a replica's `fleet_shards_unowned` is above 0 only
//! between its seeing a member dead and its taking the shards over, often less than a scrape).

/// What a run expects of one alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Must never fire (pending is allowed).
    Silent,
    /// May go pending or fire.
    MayFire,
}

impl Expect {
    pub fn name(self) -> &'static str {
        match self {
            Expect::Silent => "silent",
            Expect::MayFire => "may fire",
        }
    }
}

/// The alerts a fault (a replica killed or paused) may set off.
const FAULT_ALERTS: &[&str] = &[
    // The victim's shards, until the survivors take them over (a lease duration).
    "ModuleManagerUnownedShards",
    // A paused replica that resumes finds its renew deadline passed: it fences itself, its
    // fence lapses, and its first renewals may fail.
    "ModuleManagerFenced",
    "ModuleManagerFenceLapses",
    "ModuleManagerLeaseRenewalFailures",
];

/// What `alert` may do in a run with or without faults.
pub fn expect(alert: &str, faults: bool) -> Expect {
    if faults && FAULT_ALERTS.contains(&alert) {
        Expect::MayFire
    } else {
        Expect::Silent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_run_expects_silence_and_faults_allow_only_the_fleet_alerts() {
        assert_eq!(expect("ModuleManagerUnownedShards", false), Expect::Silent);
        assert_eq!(expect("ModuleManagerUnownedShards", true), Expect::MayFire);
        assert_eq!(expect("ModuleManagerFenceLapses", true), Expect::MayFire);
        assert_eq!(
            expect("ModuleManagerOwnershipViolation", true),
            Expect::Silent
        );
        assert_eq!(expect("ModuleManagerReconcileErrors", true), Expect::Silent);
    }
}
