//! What the watch loop remembers of a Manifest ([`Seen`]): enough to tell a spec change, a
//! deletion, a request or a wrong shard label from a status-only write.

use kube::{Resource, ResourceExt};

use crate::api::Manifest;
use crate::plan::trigger::Requests;
use crate::shard::SHARD_LABEL;
use crate::shard::label::LabelState;

/// What the watch loop remembers of a Manifest to tell a spec change or a request from a
/// status-only write.
#[derive(Debug, PartialEq)]
pub(super) struct Seen {
    uid: Option<String>,
    generation: Option<i64>,
    deleting: bool,
    /// The requests (pass now, reset) no pass has echoed yet.
    requests: Requests,
    /// The shard label when it is wrong (names another shard or none): a change to or between
    /// wrong labels (no new generation) is looked at at once. A correct or missing label is not
    /// kept, so the first pass's own stamp does not queue a second pass.
    wrong_label: Option<String>,
}

impl Seen {
    pub(super) fn of(manifest: &Manifest, label: LabelState) -> Self {
        let wrong = matches!(label, LabelState::Wrong(_) | LabelState::Invalid);
        Self {
            uid: manifest.uid(),
            generation: manifest.meta().generation,
            deleting: manifest.meta().deletion_timestamp.is_some(),
            requests: Requests::of(manifest),
            wrong_label: manifest
                .labels()
                .get(SHARD_LABEL)
                .filter(|_| wrong)
                .cloned(),
        }
    }

    /// Whether the Manifest as it is now needs a pass, after `before` (what was seen last): it is
    /// new to this replica or re-created, its spec changed (generation), its deletion started, or
    /// it asks for a pass or a reset it did not ask for before, or its shard label became wrong
    /// or changed between wrong values (to be relabelled). Anything else does not: status writes
    /// (ours, also the echo of a handled request, which ends the request) and other metadata (an
    /// unrelated annotation, a label, the first pass's own stamp of the shard label).
    pub(super) fn wants_pass_after(&self, before: Option<&Seen>) -> bool {
        let Some(before) = before else {
            return true;
        };
        let new = |now: &Option<String>, then: &Option<String>| now.is_some() && now != then;
        self.uid != before.uid
            || self.generation != before.generation
            || self.deleting != before.deleting
            || new(&self.requests.reconcile, &before.requests.reconcile)
            || new(&self.requests.reset, &before.requests.reset)
            || self.wrong_label != before.wrong_label
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(
        generation: i64,
        annotations: serde_json::Value,
        status: serde_json::Value,
    ) -> Manifest {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": generation,
                "annotations": annotations},
            "spec": {"module": "m", "chart": {"path": "p"}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_request_queues_a_pass_and_its_echo_does_not() {
        use crate::api::{RECONCILE_REQUESTED_AT as NOW, RESET_REQUESTED_AT as RESET};
        use serde_json::json;
        let seen =
            |annotations, status| Seen::of(&manifest(1, annotations, status), LabelState::Missing);
        let plain = seen(json!({}), json!({}));
        assert!(plain.wants_pass_after(None), "new to this replica");
        let status_write = seen(json!({}), json!({"state": "Ready"}));
        assert!(!status_write.wants_pass_after(Some(&plain)));
        let unrelated = seen(json!({"team": "a"}), json!({}));
        assert!(
            !unrelated.wants_pass_after(Some(&plain)),
            "another annotation"
        );
        assert!(
            Seen::of(&manifest(2, json!({}), json!({})), LabelState::Missing)
                .wants_pass_after(Some(&plain))
        );

        // requestedAt set: a pass, whatever spec.interval; the echo ends the request, no pass.
        let asked = seen(json!({NOW: "t1"}), json!({}));
        assert!(asked.wants_pass_after(Some(&plain)));
        let echoed = seen(json!({NOW: "t1"}), json!({"lastHandledReconcileAt": "t1"}));
        assert!(!echoed.wants_pass_after(Some(&asked)));
        assert!(
            !asked.wants_pass_after(Some(&asked)),
            "the same request once"
        );
        // A new value asks again.
        let again = seen(json!({NOW: "t2"}), json!({"lastHandledReconcileAt": "t1"}));
        assert!(again.wants_pass_after(Some(&echoed)));
        // resetAt the same way.
        let reset = seen(json!({RESET: "r1"}), json!({}));
        assert!(reset.wants_pass_after(Some(&plain)));
        let reset_echoed = seen(json!({RESET: "r1"}), json!({"lastHandledResetAt": "r1"}));
        assert!(!reset_echoed.wants_pass_after(Some(&reset)));
    }

    #[test]
    fn a_wrong_label_is_a_change_and_the_first_stamp_is_not() {
        let manifest = |label: Option<&str>| {
            let mut m = Manifest::new(
                "m",
                serde_json::from_value(serde_json::json!({
                    "module": "x", "chart": {"path": "x"}
                }))
                .unwrap(),
            );
            m.metadata.labels = label.map(|l| {
                [(SHARD_LABEL.to_owned(), l.to_owned())]
                    .into_iter()
                    .collect()
            });
            m
        };
        let seen = |label: Option<&str>, state| Seen::of(&manifest(label), state);
        // The first pass stamps the label: no second pass for that.
        assert!(seen(None, LabelState::Missing) == seen(Some("5"), LabelState::Correct));
        // A label made wrong, or changed between wrong values: looked at again.
        assert!(seen(Some("5"), LabelState::Correct) != seen(Some("9"), LabelState::Wrong(9)));
        assert!(seen(Some("9"), LabelState::Wrong(9)) != seen(Some("x"), LabelState::Invalid));
        // … and what the watch loop decides from it.
        let stamped = seen(Some("5"), LabelState::Correct);
        assert!(!stamped.wants_pass_after(Some(&seen(None, LabelState::Missing))));
        let wrong = seen(Some("9"), LabelState::Wrong(9));
        assert!(wrong.wants_pass_after(Some(&stamped)), "made wrong");
        assert!(
            seen(Some("x"), LabelState::Invalid).wants_pass_after(Some(&wrong)),
            "another wrong value"
        );
        assert!(
            !wrong.wants_pass_after(Some(&wrong)),
            "the same wrong label once"
        );
    }
}
