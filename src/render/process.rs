//! The helm process (or renderer child) a backend starts: found on `PATH`, with a private helm
//! home, its address space bounded, and the useful part of its stderr as the error message.

use std::path::{Path, PathBuf};

use tokio::process::Command;

use crate::telemetry::events::{MESSAGE_LIMIT, shorten_ends};

/// Bounds a Go program's address space (`RLIMIT_AS`) well above its heap limit `memory_limit`:
/// a hard backstop for an allocation too fast for a heap check. Go reserves about 1.3 GiB of
/// address space at start, hence the margin.
#[cfg(target_os = "linux")]
pub(super) fn address_space_limit(command: &mut Command, memory_limit: u64) {
    let bytes = memory_limit.saturating_mul(2).saturating_add(4 << 30);
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit is async-signal-safe, and the closure touches nothing but its copy of
    // `limit`.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn address_space_limit(_: &mut Command, _: u64) {}

/// `program` found in the directories of `path` (this process's `PATH`) when it is a bare name
/// (`helm`): the child runs with an empty environment, where a bare name would be looked up in
/// the C library's default path only (`/bin:/usr/bin`). A path with a `/`, or a name found
/// nowhere (the spawn then says so), is kept as it is.
pub(super) fn on_path(program: &Path, path: Option<&std::ffi::OsStr>) -> PathBuf {
    let bare = program.components().count() == 1 && !program.to_string_lossy().contains('/');
    let found = bare
        .then(|| {
            std::env::split_paths(path?)
                .map(|dir| dir.join(program))
                .find(|candidate| candidate.is_file())
        })
        .flatten();
    found.unwrap_or_else(|| program.to_owned())
}

/// A private helm home in `home` and nothing else of the environment.
pub(super) fn private_home<'c>(command: &'c mut Command, home: &Path) -> &'c mut Command {
    command
        .env_clear()
        .env("HOME", home)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
}

/// The useful part of helm's stderr: from its first `Error` line on (warnings before it are
/// dropped), lines joined with `; `, at most [`MESSAGE_LIMIT`] bytes keeping the beginning and
/// the end (an include recursion's cause is the last line of ~130 kB). The backends keep a long
/// text's ends and call [`helm_message_ends`]; this is the whole-text reference.
#[cfg(test)]
pub(super) fn helm_message(stderr: &[u8]) -> String {
    helm_message_ends(stderr, 0, b"")
}

/// [`helm_message`] of a stderr of which only the ends were kept: `head`, `omitted` bytes
/// dropped, `tail`.
pub(super) fn helm_message_ends(head: &[u8], omitted: usize, tail: &[u8]) -> String {
    let (head, omitted, tail) = mend_cut(head, omitted, tail);
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let head_lines = lines(&head);
    let first_error = head_lines
        .iter()
        .position(|l| l.starts_with("Error"))
        .unwrap_or(0);
    let message = head_lines[first_error..].join("; ");
    let message = message.strip_prefix("Error: ").unwrap_or(&message);
    let tail = lines(&tail).join("; ");
    let separator = if message.is_empty() || tail.is_empty() || omitted > 0 {
        ""
    } else {
        "; "
    };
    shorten_ends(
        message,
        omitted,
        &format!("{separator}{tail}"),
        MESSAGE_LIMIT,
    )
}

/// The two ends of a cut stream as text, the cut moved past what would read differently from
/// the whole text: a character split by it and the spaces at it (trimmed as a line's ends,
/// which they are not) count as omitted. So the message is the one the whole stderr gives.
fn mend_cut(head: &[u8], omitted: usize, tail: &[u8]) -> (String, usize, String) {
    if omitted == 0 {
        let text = |bytes| String::from_utf8_lossy(bytes).into_owned();
        return (text(head), 0, text(tail));
    }
    let whole_head = head.len();
    let head = match std::str::from_utf8(head) {
        Err(e) if e.error_len().is_none() => &head[..e.valid_up_to()],
        _ => head,
    };
    let split = tail
        .iter()
        .take(3)
        .take_while(|b| (**b & 0xC0) == 0x80)
        .count();
    let (head_text, tail_text) = (
        String::from_utf8_lossy(head),
        String::from_utf8_lossy(&tail[split..]),
    );
    let kept_head = head_text.trim_end_matches([' ', '\t']);
    let kept_tail = tail_text.trim_start_matches([' ', '\t']);
    let cut_off = (whole_head - head.len())
        + (head_text.len() - kept_head.len())
        + split
        + (tail_text.len() - kept_tail.len());
    (
        kept_head.to_owned(),
        omitted + cut_off,
        kept_tail.to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_program_names_are_found_on_this_processs_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("helm"), "").unwrap();
        let path = std::env::join_paths(["/nonexistent".into(), dir.path().to_owned()]).unwrap();
        assert_eq!(
            on_path(Path::new("helm"), Some(&path)),
            dir.path().join("helm")
        );
        assert_eq!(
            on_path(Path::new("nothere"), Some(&path)),
            PathBuf::from("nothere")
        );
        assert_eq!(
            on_path(Path::new("./helm"), Some(&path)),
            PathBuf::from("./helm")
        );
        assert_eq!(
            on_path(Path::new("/usr/bin/helm"), None),
            PathBuf::from("/usr/bin/helm")
        );
        assert_eq!(on_path(Path::new("helm"), None), PathBuf::from("helm"));
    }

    #[test]
    fn helm_messages_keep_the_error_lines() {
        let stderr = b"walk.go:74: found symbolic link\nError: template: web/templates/x.yaml:3:4: executing \"x\": nil pointer\n";
        assert_eq!(
            helm_message(stderr),
            "template: web/templates/x.yaml:3:4: executing \"x\": nil pointer"
        );
        let schema = b"Error: values don't meet the specifications of the schema(s):\ntyped:\n- at '/replicaCount': got string\n";
        assert_eq!(
            helm_message(schema),
            "values don't meet the specifications of the schema(s):; typed:; - at '/replicaCount': got string"
        );
        assert_eq!(helm_message(b"  something odd \n"), "something odd");
        let long = helm_message(&[b'x'; 5000]);
        assert_eq!(long.len(), MESSAGE_LIMIT);
        assert!(long.contains(" … [2982 bytes omitted] … "), "{long}");
    }

    #[test]
    fn a_long_helm_error_keeps_its_cause_at_the_end() {
        let nested = "error calling include: template: c/templates/_h.tpl:2:3: executing \"loop\" at <include \"loop\" .>: ".repeat(1000);
        let stderr = format!(
            "walk.go:74: a warning\nError: template: c/templates/cm.yaml:6:12: {nested}error calling include: rendering template has a nested reference name: loop: unable to execute template\n\nUse --debug flag to render out invalid YAML\n"
        );
        let message = helm_message(stderr.as_bytes());
        assert!(message.len() <= MESSAGE_LIMIT);
        assert!(
            message.starts_with("template: c/templates/cm.yaml:6:12: error calling include"),
            "{message}"
        );
        assert!(message.ends_with("nested reference name: loop: unable to execute template; Use --debug flag to render out invalid YAML"), "{message}");
        assert!(message.contains("bytes omitted"));
    }

    #[test]
    fn a_stderr_kept_by_its_ends_keeps_both_and_counts_the_gap() {
        let message = helm_message_ends(
            b"noise\nError: the start\nmore",
            70_000,
            b"tail of a line\nthe cause\n",
        );
        assert_eq!(
            message,
            "the start; more … [70000 bytes omitted] … tail of a line; the cause"
        );
        assert_eq!(helm_message_ends(b"Error: a\n", 0, b"b\n"), "a; b");
    }

    #[test]
    fn a_cut_inside_a_character_or_at_spaces_reads_as_the_whole_text() {
        // The same stderr whole and as two ends cut inside "é" (2 bytes), followed by spaces:
        // the same message, marker count included.
        let whole = format!(
            "Error: {}é  {}the cause\n",
            "a".repeat(3000),
            "b".repeat(3000)
        );
        let bytes = whole.as_bytes();
        let cut = 7 + 3000 + 1;
        let (head, omitted, tail) = mend_cut(&bytes[..cut], 1, &bytes[cut + 1..]);
        assert_eq!((head.len(), omitted), (7 + 3000, 1 + 1 + 2));
        assert!(tail.starts_with('b'));
        assert_eq!(
            helm_message_ends(&bytes[..cut], 1, &bytes[cut + 1..]),
            helm_message(bytes)
        );
        // Cut inside the character on the tail's side.
        assert_eq!(
            helm_message_ends(&bytes[..cut - 1], 1, &bytes[cut..]),
            helm_message(bytes)
        );
    }
}
