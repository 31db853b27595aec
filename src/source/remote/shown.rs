//! URLs, references and server text as they may appear in a status or log: no credentials, no
//! query, bounded.

use reqwest::Url;

/// Most characters of a server's message quoted in an error.
const MAX_QUOTE: usize = 300;

/// A URL as it may appear in a status or log: scheme, host, port and path only.
pub(super) fn shown(url: &Url) -> String {
    let mut shown = format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default());
    if let Some(port) = url.port() {
        shown.push_str(&format!(":{port}"));
    }
    shown.push_str(url.path());
    bounded_text(&shown)
}

/// A URL from the spec as it may be shown (credentials and query dropped).
pub(super) fn shown_url(text: &str) -> String {
    Url::parse(text).map_or_else(|_| "an invalid URL".to_owned(), |url| shown(&url))
}

/// An OCI reference as it may be shown: without user info before the host, bounded.
pub(super) fn shown_reference(text: &str) -> String {
    let (scheme, rest) = text.split_at(if text.starts_with("oci://") { 6 } else { 0 });
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = host.rsplit_once('@').map_or(host, |(_, host)| host);
    bounded_text(&format!("{scheme}{host}{path}"))
}

/// At most [`MAX_QUOTE`] characters of text from outside.
pub(super) fn bounded_text(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTE) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Up to ten items, then how many more.
pub(super) fn listing(items: &[&str]) -> String {
    if items.is_empty() {
        return "none".into();
    }
    let mut text = items
        .iter()
        .take(10)
        .map(|s| bounded_text(s))
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > 10 {
        text.push_str(&format!(" and {} more", items.len() - 10));
    }
    text
}

/// An error and its causes, `a: b: c`, without repeats, bounded.
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = c.source();
    }
    bounded_text(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_carry_no_credentials_or_query() {
        let url = Url::parse("https://user:pw@example.com:8443/charts/x.tgz?token=t").unwrap();
        assert_eq!(shown(&url), "https://example.com:8443/charts/x.tgz");
        assert_eq!(
            shown_url("https://user:pw@example.com/c"),
            "https://example.com/c"
        );
        assert_eq!(shown_url("::"), "an invalid URL");
    }
}
