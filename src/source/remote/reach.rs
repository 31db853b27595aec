//! Where chart requests may go: the resolver that hands the connector only allowed addresses
//! (so the address checked is the address connected to), and the checks of IP-literal hosts and
//! plain `http://` made before every request and every redirect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::address::{self, Cidr, Reserved};

/// The operator's rules for chart hosts, shared by the client's resolver and redirect policy
/// and checked before each request.
#[derive(Clone, Debug, Default)]
pub(super) struct Reach {
    /// Reserved ranges the operator allows (`--allow-private-chart-hosts`).
    pub(super) allowed: Arc<[Cidr]>,
    /// `--allow-insecure-http`: plain http to any host.
    pub(super) plain_http: bool,
    /// Registries (`host` or `host:port`) spoken to over plain HTTP (`--insecure-registry`).
    pub(super) insecure_registries: Arc<[String]>,
}

/// A request refused before it was sent: where it would go is not allowed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// the host is, or resolves only to, an address of a reserved range.
    #[error(
        "the host {host} has a {range} address, which chart sources may not reach (an operator \
         may allow the range with --allow-private-chart-hosts)"
    )]
    Address {
        /// The host, as in the URL.
        host: String,
        /// The range its address is in.
        range: Reserved,
    },
    /// the URL is plain `http://`.
    #[error(
        "{url} is plain http, which chart sources may not use (an operator may allow it with \
         --allow-insecure-http)"
    )]
    PlainHttp {
        /// The URL as shown (no credentials or query).
        url: String,
    },
}

impl Reach {
    /// Whether a request to `url` may be sent: plain http only when allowed, an IP-literal host
    /// only when allowed (a name is checked when it resolves, by [`Resolver`]).
    pub(super) fn check(&self, url: &Url) -> Result<(), Refusal> {
        if url.scheme() == "http" && !self.plain_http && !self.plain_registry(&authority(url)) {
            return Err(Refusal::PlainHttp {
                url: super::shown::shown(url),
            });
        }
        let literal = match url.host() {
            Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            _ => None,
        };
        match literal.map(|ip| address::check(ip, &self.allowed)) {
            Some(Err(range)) => Err(Refusal::Address {
                host: url.host_str().unwrap_or_default().to_owned(),
                range,
            }),
            _ => Ok(()),
        }
    }

    /// Whether `registry` (`host` or `host:port`) is spoken to over plain HTTP: a loopback one
    /// (whose traffic never leaves the pod; reaching it needs `--allow-private-chart-hosts`)
    /// or one the operator lists.
    pub(super) fn plain_registry(&self, registry: &str) -> bool {
        let host = registry
            .rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(registry, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
            || self
                .insecure_registries
                .iter()
                .any(|r| r == registry || r == host)
    }

    /// The resolver of the client.
    pub(super) fn resolver(&self) -> Arc<Resolver> {
        Arc::new(Resolver {
            allowed: self.allowed.clone(),
        })
    }
}

/// `host[:port]` of a URL, as messages name it.
pub(super) fn authority(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

/// Resolves names with the system resolver and keeps only the addresses that may be reached:
/// the connector connects to what this returns, so a name that resolves to a public address
/// for a check and to an internal one for the connection (DNS rebinding) has no window.
pub(super) struct Resolver {
    allowed: Arc<[Cidr]>,
}

impl Resolve for Resolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allowed = self.allowed.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept = allowed_addresses(&host, found, &allowed)?;
            Ok(Box::new(kept.into_iter()) as Addrs)
        })
    }
}

/// The addresses of `host` that may be reached; refused when every one is in a reserved range
/// not allowed (a name with public and reserved addresses is reached at its public ones only).
fn allowed_addresses(
    host: &str,
    found: Vec<SocketAddr>,
    allowed: &[Cidr],
) -> Result<Vec<SocketAddr>, Refusal> {
    let mut refused = None;
    let kept: Vec<SocketAddr> = found
        .into_iter()
        .filter(|a| match address::check(a.ip(), allowed) {
            Ok(()) => true,
            Err(range) => {
                refused.get_or_insert(range);
                false
            }
        })
        .collect();
    match refused {
        Some(range) if kept.is_empty() => Err(Refusal::Address {
            host: host.to_owned(),
            range,
        }),
        _ => Ok(kept),
    }
}

/// The refusal among an error's causes, if one is there (reqwest wraps what the resolver or
/// the redirect policy returned).
pub(super) fn refusal_in(error: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut cause = Some(error);
    while let Some(c) = cause {
        if let Some(refusal) = c.downcast_ref::<Refusal>() {
            return Some(refusal.clone());
        }
        cause = c.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(allowed: &[&str], plain_http: bool) -> Reach {
        Reach {
            allowed: allowed.iter().map(|c| c.parse().unwrap()).collect(),
            plain_http,
            insecure_registries: Arc::from(vec!["registry.lan:5000".to_owned()]),
        }
    }

    #[test]
    fn ip_literal_hosts_and_plain_http_are_checked_before_sending() {
        let strict = reach(&[], false);
        let url = |text: &str| Url::parse(text).unwrap();
        assert_eq!(strict.check(&url("https://charts.example.com/x")), Ok(()));
        assert_eq!(strict.check(&url("https://8.8.8.8/x")), Ok(()));
        // The URL parser writes decimal, hex and short IPv4 forms as the address they are.
        for (text, host, range) in [
            ("https://127.0.0.1:8443/x", "127.0.0.1", Reserved::Loopback),
            ("https://2130706433/x", "127.0.0.1", Reserved::Loopback),
            ("https://0x7f.1/x", "127.0.0.1", Reserved::Loopback),
            (
                "https://169.254.169.254/latest/meta-data",
                "169.254.169.254",
                Reserved::LinkLocal,
            ),
            (
                "https://[::ffff:a9fe:a9fe]/",
                "[::ffff:a9fe:a9fe]",
                Reserved::LinkLocal,
            ),
            ("https://[fd00::1]/", "[fd00::1]", Reserved::Private),
            ("https://0/", "0.0.0.0", Reserved::Unspecified),
        ] {
            assert_eq!(
                strict.check(&url(text)),
                Err(Refusal::Address {
                    host: host.into(),
                    range
                }),
                "{text}"
            );
        }
        let refused = strict.check(&url("http://charts.example.com/x?token=t"));
        assert_eq!(
            refused,
            Err(Refusal::PlainHttp {
                url: "http://charts.example.com/x".into()
            })
        );
        // Plain http: allowed by the flag, or to registries the operator lists or loopback.
        assert_eq!(strict.check(&url("http://registry.lan:5000/v2/")), Ok(()));
        assert!(strict.check(&url("http://registry.lan:5001/v2/")).is_err());
        let local = reach(&["127.0.0.1"], false);
        assert_eq!(local.check(&url("http://127.0.0.1:5000/v2/")), Ok(()));
        assert!(local.check(&url("http://127.0.0.2:5000/v2/")).is_err());
        let open = reach(&["10.0.0.0/8"], true);
        assert_eq!(open.check(&url("http://10.1.2.3/charts")), Ok(()));
        assert!(open.check(&url("http://192.168.0.1/charts")).is_err());
    }

    #[test]
    fn resolved_addresses_are_filtered_not_just_checked() {
        let addr = |text: &str| text.parse::<SocketAddr>().unwrap();
        let public = addr("93.184.216.34:0");
        let metadata = addr("169.254.169.254:0");
        let loopback = addr("[::1]:0");
        assert_eq!(
            allowed_addresses("h", vec![metadata, public, loopback], &[]),
            Ok(vec![public])
        );
        assert_eq!(
            allowed_addresses("h", vec![metadata, loopback], &[]),
            Err(Refusal::Address {
                host: "h".into(),
                range: Reserved::LinkLocal
            })
        );
        let allowed = ["::1".parse().unwrap()];
        assert_eq!(
            allowed_addresses("h", vec![metadata, loopback], &allowed),
            Ok(vec![loopback])
        );
        assert_eq!(allowed_addresses("h", vec![], &[]), Ok(vec![]));
    }

    #[test]
    fn refusals_are_found_among_the_causes() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] Box<dyn std::error::Error + Send + Sync>);
        let refusal = Refusal::PlainHttp { url: "u".into() };
        let wrapped = Outer(Box::new(Outer(Box::new(refusal.clone()))));
        assert_eq!(refusal_in(&wrapped), Some(refusal));
        assert_eq!(refusal_in(&Outer("other".into())), None);
    }
}
