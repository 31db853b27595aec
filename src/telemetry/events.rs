//! Events: the one publisher of Kubernetes Events, with notes shortened to the API's byte limit
//! (and [`shorten`], which keeps a long message's beginning and end, for every message limit).

use std::borrow::Cow;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The longest Event note the API server accepts, in bytes.
pub const NOTE_LIMIT: usize = 1024;

/// The longest message the operator writes to a status condition or `lastOperation`, in bytes
/// (a status carries it several times, and is written whole).
pub const MESSAGE_LIMIT: usize = 2048;

/// `text` in at most `max` bytes: when longer, its beginning and its end (where an error's
/// cause usually is: wrapped errors put the innermost last) around a marker
/// `… [N bytes omitted] …`, cut at character boundaries. A `max` too small for the marker
/// keeps the beginning only.
pub fn shorten(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        Cow::Borrowed(text)
    } else {
        let (head, tail) = text.split_at(ceil(text, text.len() / 2));
        Cow::Owned(cut_ends(head, 0, tail, max))
    }
}

/// [`shorten`] of a text of which only the ends were kept: `head`, then `omitted` bytes
/// already dropped, then `tail` (a bounded read of a long stream). The marker counts every
/// byte missing, those dropped before and those cut here.
pub fn shorten_ends(head: &str, omitted: usize, tail: &str, max: usize) -> String {
    if omitted == 0 {
        shorten(&format!("{head}{tail}"), max).into_owned()
    } else {
        cut_ends(head, omitted, tail, max)
    }
}

/// The beginning of `head` and the end of `tail` around the marker, in at most `max` bytes.
fn cut_ends(head: &str, omitted: usize, tail: &str, max: usize) -> String {
    let total = head.len() + omitted + tail.len();
    // The marker is sized for the most bytes that could be omitted, so the real one (with as
    // many digits or fewer) always fits.
    let Some(budget) = max.checked_sub(omitted_marker(total).len()) else {
        return floor(&format!("{head}{tail}"), max).to_owned();
    };
    // Half each, and what one side does not need goes to the other.
    let tail_want = (budget - budget / 2).min(tail.len());
    let kept_head = floor(head, budget - tail_want);
    let kept_tail = &tail[ceil(
        tail,
        tail.len() - (budget - kept_head.len()).min(tail.len()),
    )..];
    let marker = omitted_marker(total - kept_head.len() - kept_tail.len());
    format!("{kept_head}{marker}{kept_tail}")
}

/// The marker [`shorten`] puts where it cut `omitted` bytes out.
fn omitted_marker(omitted: usize) -> String {
    format!(" … [{omitted} bytes omitted] … ")
}

/// The longest prefix of `text` of at most `max` bytes that ends at a character boundary.
fn floor(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The first character boundary of `text` at or after `start`.
fn ceil(text: &str, start: usize) -> usize {
    let mut start = start.min(text.len());
    while !text.is_char_boundary(start) {
        start += 1;
    }
    start
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

    /// Publishes one Event about `regarding`, its note shortened to [`NOTE_LIMIT`] bytes. The caller
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
            note: Some(shorten(note, NOTE_LIMIT).into_owned()),
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
    fn short_text_is_kept_whole() {
        assert_eq!(shorten("abc", 1024), "abc");
        assert!(matches!(shorten("abc", 3), Cow::Borrowed("abc")));
        assert_eq!(shorten("", 0), "");
    }

    #[test]
    fn long_text_keeps_its_beginning_and_its_end() {
        let text = format!("Error: start{}the cause", "x".repeat(10_000));
        let short = shorten(&text, 200);
        assert!(short.len() <= 200, "{} bytes", short.len());
        assert!(short.starts_with("Error: start"), "{short}");
        assert!(short.ends_with("the cause"), "{short}");
        let omitted = short
            .split(" … [")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        let omitted: usize = omitted.parse().unwrap();
        let marker = omitted_marker(omitted);
        assert_eq!(
            short.len() - marker.len() + omitted,
            text.len(),
            "the marker counts exactly the bytes cut out"
        );
    }

    #[test]
    fn every_limit_is_kept_at_character_boundaries_in_multi_byte_text() {
        // 1, 2, 3 and 4 bytes per character, so every cut position falls inside one somewhere
        // (a cut off a boundary would panic when slicing).
        let text = "aé→🦀".repeat(300);
        for max in 0..=text.len() + 1 {
            let short = shorten(&text, max);
            assert!(short.len() <= max, "max {max}: {} bytes", short.len());
            match short.split_once(" … [") {
                Some((head, rest)) => {
                    let (_, tail) = rest.split_once("] … ").unwrap();
                    assert!(text.starts_with(head) && text.ends_with(tail), "max {max}");
                    assert!(head.len().abs_diff(tail.len()) <= 4, "max {max}: halves");
                }
                None => assert!(text.starts_with(&*short), "max {max}"),
            }
        }
    }

    #[test]
    fn the_ends_of_a_stream_count_what_was_dropped_before() {
        let short = shorten_ends("Error: begin", 100_000, "the cause", 1024);
        assert_eq!(short, "Error: begin … [100000 bytes omitted] … the cause");
        let head = "h".repeat(5000);
        let short = shorten_ends(&head, 10, "the cause", 100);
        assert!(
            short.len() <= 100 && short.ends_with("] … the cause"),
            "{short}"
        );
        let omitted = 5000 + 10 + 9 - (short.len() - omitted_marker(4937).len());
        assert!(short.contains(&format!("[{omitted} bytes")), "{short}");
        assert_eq!(shorten_ends("a", 0, "b", 2), "ab");
    }

    #[test]
    fn a_limit_smaller_than_the_marker_keeps_the_beginning() {
        let short = shorten("→→→→→→→→→→", 10);
        assert_eq!(short, "→→→");
    }

    #[test]
    fn a_fleet_note_of_multi_byte_characters_fits_the_limit() {
        // 1024 characters of 3 bytes: cutting by characters (as the fleet loop did) sent 3 KiB.
        let shards = "→".repeat(NOTE_LIMIT);
        let cut = shorten(&shards, NOTE_LIMIT);
        assert!(cut.len() <= NOTE_LIMIT);
        assert!(
            cut.len() > NOTE_LIMIT - 40,
            "the budget is used: {}",
            cut.len()
        );
        assert!(cut.starts_with('→') && cut.ends_with('→'));
    }
}
