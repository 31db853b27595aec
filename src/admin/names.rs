//! The Kubernetes names the admin API accepts in paths (DNS-1123 labels and subdomains).

/// Whether `text` is a DNS-1123 label (a namespace): lowercase alphanumerics and `-`, starting
/// and ending alphanumeric, at most 63 characters.
pub fn is_dns_label(text: &str) -> bool {
    text.len() <= 63 && is_label_part(text)
}

/// Whether `text` is a DNS-1123 subdomain (a Manifest's name): labels joined by `.`, at most
/// 253 characters.
pub fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(is_label_part)
}

fn is_label_part(part: &str) -> bool {
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = part.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        for good in ["a", "default", "kube-system", "0", &"a".repeat(63)] {
            assert!(is_dns_label(good) && is_dns_subdomain(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a b", "ä", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(!is_dns_label("a.b") && is_dns_subdomain("a.b") && is_dns_subdomain("web-1.v2"));
        for bad in ["", ".a", "a.", "a..b", "a/b", "a.-b", &"a".repeat(254)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        assert!(is_dns_subdomain(&"a".repeat(253)));
    }
}
