//! Fixtures of the admin API's tests and the command line's: states and a fleet view.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::sync::watch;

use super::state::AdminState;
use crate::shard::fleet::{FleetView, ShardStatus, ShardView};
use crate::shard::membership::{MemberLoad, MemberState, MemberView, Members};

pub(crate) fn state(registry: Registry, members: Members) -> AdminState {
    AdminState {
        registry: Arc::new(registry),
        synced: Arc::default(),
        members: watch::channel(members).1,
        fleet: watch::channel(FleetView::default()).1,
        work: None,
        drain: watch::channel(false).0,
        client: None,
        reviews: Arc::default(),
        manifest_selector: None,
        target_budget: Default::default(),
    }
}

pub(crate) fn with_fleet(view: FleetView) -> AdminState {
    AdminState {
        fleet: watch::channel(view).1,
        ..state(crate::telemetry::metrics::registry(), Members::default())
    }
}

pub(crate) fn member(
    name: &str,
    live: bool,
    state: MemberState,
    load: Option<(u64, u64, u64)>,
) -> MemberView {
    // The Manifests not due nor in flight are scheduled.
    MemberView {
        name: name.into(),
        live,
        unchanged_for_seconds: 1.0,
        state,
        load: load.map(|(queued, in_flight, manifests)| MemberLoad {
            queued,
            scheduled: manifests - queued - in_flight,
            next_due: "2026-12-01T12:00:00Z".parse().ok(),
            in_flight,
            manifests,
            shards: BTreeMap::new(),
            targets: Vec::new(),
        }),
    }
}

pub(crate) fn shard_view(
    shard: u32,
    owner: Option<&str>,
    desired: Option<&str>,
    state: ShardStatus,
    load: Option<(u64, u64)>,
) -> ShardView {
    ShardView {
        shard,
        owner: owner.map(str::to_owned),
        desired_owner: desired.map(str::to_owned),
        state,
        epoch: 3,
        manifests: load.map(|l| l.0),
        queued: load.map(|l| l.1),
        scheduled: load.map(|l| l.0 - l.1),
    }
}

/// Four shards over `mm-0` (live), `mm-1` (draining) and `gone` (holds shard 3 without a
/// membership Lease).
pub(crate) fn fleet() -> FleetView {
    FleetView {
        fleet: "mm".into(),
        replica: "mm-0".into(),
        shard_count: 4,
        desired_replicas: Some(2),
        self_fenced: false,
        members: vec![
            member("mm-0", true, MemberState::Active, Some((2, 1, 10))),
            member("mm-1", true, MemberState::Draining, None),
        ],
        assigned: vec!["mm-0".into()],
        shards: vec![
            shard_view(
                0,
                Some("mm-0"),
                Some("mm-0"),
                ShardStatus::Owned,
                Some((7, 1)),
            ),
            shard_view(1, Some("mm-1"), Some("mm-0"), ShardStatus::Handover, None),
            shard_view(2, None, Some("mm-0"), ShardStatus::Free, None),
            shard_view(3, Some("gone"), Some("mm-0"), ShardStatus::Orphaned, None),
        ],
    }
}
