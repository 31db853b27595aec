//! Events: the one publisher of Kubernetes Events, with notes cut to the API's byte limit.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The longest Event note the API server accepts, in bytes.
pub const NOTE_LIMIT: usize = 1024;

/// At most `max` bytes of `text`, cut at a character boundary (Event notes are limited in bytes).
pub fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Publishes Events as one reporter (controller and replica).
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    reporter: Reporter,
}

impl Publisher {
    /// A publisher writing through `client` as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self { client, reporter }
    }

    /// Publishes one Event about `regarding`, its note cut to [`NOTE_LIMIT`] bytes. The caller
    /// logs a failure (under its own module, inside its own span) and goes on: an Event is never
    /// worth failing the work it reports on.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, NOTE_LIMIT).to_owned()),
            action: action.to_owned(),
            secondary: None,
        };
        // A fresh Recorder each time: kube's Recorder folds events with the same reason into one
        // series that keeps the *first* note (and PATCHes it, a permission the operator does not
        // have), which would show an on-call engineer a stale message. Callers publish only
        // when something changed, so this cannot spam.
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        recorder.publish(&event, regarding).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_are_cut_by_bytes_at_a_character_boundary() {
        assert_eq!(truncate("abc", 1024), "abc");
        let long = "é".repeat(1000); // 2 bytes each
        let cut = truncate(&long, 1023);
        assert_eq!(cut.len(), 1022);
        assert!(long.starts_with(cut));
    }

    #[test]
    fn a_fleet_note_of_multi_byte_characters_fits_the_limit() {
        // 1024 characters of 3 bytes: cutting by characters (as the fleet loop did) sent 3 KiB.
        let shards = "→".repeat(NOTE_LIMIT);
        let cut = truncate(&shards, NOTE_LIMIT);
        assert!(cut.len() <= NOTE_LIMIT);
        assert_eq!(cut.len(), NOTE_LIMIT / 3 * 3);
        assert!(shards.starts_with(cut));
    }
}
