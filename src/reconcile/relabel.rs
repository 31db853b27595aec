//! Relabel: rewrites a shard label that names another shard than the Manifest's UID's, so that
//! the UID's owner sees the Manifest (run by the owner of the shard the label names).

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::events::EventType;
use serde_json::json;

use super::context::Context;
use super::pass::Next;
use super::records::{patch_metadata, publish, read_fresh};
use crate::api::Manifest;
use crate::shard::SHARD_LABEL;
use crate::shard::fence::Fence;
use crate::shard::label::{LabelState, label_state};

/// Relabels `manifest` to its UID's shard if its label, as stored now, still names the fence's
/// (wrong) shard: one write, guarded by the resourceVersion it was read at, so that of two
/// writers (a handover, a user) the second gets a conflict and the next try re-reads. `Idle`
/// when done or no longer needed.
pub async fn relabel(manifest: &Manifest, ctx: &Context, fence: &Fence) -> Next {
    let fresh = match read_fresh(manifest, ctx).await {
        Ok(Some(fresh)) => fresh,
        Ok(None) => return Next::Idle,
        Err(e) => {
            tracing::warn!("relabel: {e}");
            return Next::Retry(e);
        }
    };
    let uid_shard = ctx.shards.shard_of(&fresh.uid().unwrap_or_default());
    let label = fresh.labels().get(SHARD_LABEL).cloned();
    if label_state(label.as_deref(), uid_shard, ctx.shards) != LabelState::Wrong(fence.shard()) {
        return Next::Idle;
    }
    if let Err(lost) = fence.check() {
        tracing::warn!("not relabelling: {lost}");
        return Next::After(Duration::from_secs(1));
    }
    let labels = json!({ "labels": { SHARD_LABEL: uid_shard.to_string() } });
    // Written under another shard's fence: not a write the UID's owner may start from.
    ctx.written.forget(&fresh);
    if let Err(e) = patch_metadata(&fresh, ctx, labels).await {
        tracing::warn!("relabel: {e}");
        return Next::Retry(e);
    }
    let note = format!(
        "the shard label said {}, but the Manifest's UID is in shard {uid_shard}: relabelled (a copy or restore keeps the old label)",
        label.unwrap_or_default()
    );
    tracing::info!("{note}");
    publish(&fresh, ctx, EventType::Normal, "Relabelled", &note).await;
    Next::Idle
}
