//! An apply's precondition on the wire ([`Guard`] in the body's metadata) and how the API
//! server's refusal of it is told from server-side apply's field conflict.

use kube::core::Status;
use serde_json::{Value, json};

use crate::plan::ownership::{ABSENT_RESOURCE_VERSION, Guard};

/// Puts `guard`'s precondition into an apply body's `metadata`.
pub(super) fn precondition(body: &mut Value, guard: &Guard) {
    let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match guard {
        Guard::Absent => {
            metadata.insert("resourceVersion".into(), json!(ABSENT_RESOURCE_VERSION));
        }
        Guard::Uid(uid) => {
            metadata.insert("uid".into(), json!(uid));
        }
        Guard::Read {
            uid,
            resource_version,
        } => {
            metadata.insert("uid".into(), json!(uid));
            metadata.insert("resourceVersion".into(), json!(resource_version));
        }
    }
}

/// Whether a 409 is server-side apply's field conflict (another manager owns a field the body
/// sets), answered by a forced apply — not a failed precondition.
pub(super) fn field_conflict(status: &Status) -> bool {
    status.details.as_ref().is_some_and(|details| {
        details
            .causes
            .iter()
            .any(|cause| cause.reason == "FieldManagerConflict")
    })
}

/// Whether the API server refused a guarded apply's precondition: a 409 that is no field
/// conflict (a resourceVersion that is not the stored one; a UID given for an object that does
/// not exist), or a 422 about `metadata.uid` (a UID that is not the stored one).
pub(super) fn refused(status: &Status) -> bool {
    match status.code {
        409 => !field_conflict(status),
        422 => status.details.as_ref().is_some_and(|details| {
            details
                .causes
                .iter()
                .any(|cause| cause.field == "metadata.uid")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::response::{StatusCause, StatusDetails};

    fn status(code: u16, causes: &[(&str, &str)]) -> Status {
        let mut status = Status::failure("refused", "Conflict").with_code(code);
        status.details = Some(StatusDetails {
            causes: causes
                .iter()
                .map(|(reason, field)| StatusCause {
                    reason: (*reason).into(),
                    message: String::new(),
                    field: (*field).into(),
                })
                .collect(),
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            retry_after_seconds: 0,
        });
        status
    }

    #[test]
    fn a_field_conflict_is_forced_a_refused_precondition_is_not() {
        let conflict = status(409, &[("FieldManagerConflict", ".data.k")]);
        assert!(field_conflict(&conflict) && !refused(&conflict));
        let stale = status(409, &[]);
        assert!(!field_conflict(&stale) && refused(&stale));
        assert!(refused(&status(
            422,
            &[("FieldValueInvalid", "metadata.uid")]
        )));
        assert!(
            !refused(&status(422, &[("FieldValueInvalid", "data")])),
            "an invalid object stays a chart's error"
        );
    }

    #[test]
    fn each_guard_puts_its_precondition_into_the_metadata() {
        let body = || json!({"metadata": {"name": "a"}});
        let mut absent = body();
        precondition(&mut absent, &Guard::Absent);
        assert_eq!(absent["metadata"]["resourceVersion"], "1");
        let mut recorded = body();
        precondition(&mut recorded, &Guard::Uid("u".into()));
        assert_eq!(recorded["metadata"], json!({"name": "a", "uid": "u"}));
        let mut read = body();
        let guard = Guard::Read {
            uid: "u".into(),
            resource_version: "7".into(),
        };
        precondition(&mut read, &guard);
        assert_eq!(
            read["metadata"],
            json!({"name": "a", "uid": "u", "resourceVersion": "7"})
        );
    }
}
