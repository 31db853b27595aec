//! Which IP addresses chart sources may reach: a pure classifier of the non-public ranges
//! (loopback, private, link-local and cloud metadata, CGNAT, …) and the operator's allowlist.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Why an address is not a public one; its text names the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// `0.0.0.0/8`, `::`.
    Unspecified,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918 (`10/8`, `172.16/12`, `192.168/16`), ULA `fc00::/7`, site-local `fec0::/10`.
    Private,
    /// `169.254.0.0/16` (cloud metadata at 169.254.169.254 included), `fe80::/10`.
    LinkLocal,
    /// Carrier-grade NAT, `100.64.0.0/10`.
    SharedNat,
    /// `224.0.0.0/4`, `255.255.255.255`, `ff00::/8`.
    Multicast,
    /// Other special-purpose ranges: `192.0.0.0/24`, `198.18.0.0/15`, `240.0.0.0/4`,
    /// documentation ranges, `100::/64`.
    Special,
}

impl fmt::Display for Reserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unspecified => "unspecified",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::LinkLocal => "link-local (or cloud metadata)",
            Self::SharedNat => "carrier-grade NAT",
            Self::Multicast => "multicast or broadcast",
            Self::Special => "special-purpose",
        })
    }
}

/// The range `ip` is in if it is not a public address. IPv4 addresses embedded in IPv6 ones
/// (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4
/// `2002::/16`) are judged by the IPv4 address they reach.
pub fn reserved(ip: IpAddr) -> Option<Reserved> {
    match ip {
        IpAddr::V4(v4) => reserved_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => reserved_v4(v4),
            None => reserved_v6(v6),
        },
    }
}

fn reserved_v4(ip: Ipv4Addr) -> Option<Reserved> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, ..) => Reserved::Unspecified,
        (127, ..) => Reserved::Loopback,
        (10, ..) | (172, 16..=31, _) | (192, 168, _) => Reserved::Private,
        (169, 254, _) => Reserved::LinkLocal,
        (100, 64..=127, _) => Reserved::SharedNat,
        _ if ip.is_broadcast() => Reserved::Multicast,
        (224..=239, ..) => Reserved::Multicast,
        (192, 0, 0 | 2) | (198, 18..=19, _) | (198, 51, 100) | (203, 0, 113) | (240..=255, ..) => {
            Reserved::Special
        }
        _ => return None,
    })
}

fn reserved_v6(ip: Ipv6Addr) -> Option<Reserved> {
    let segments = ip.segments();
    Some(match segments {
        _ if ip.is_unspecified() => Reserved::Unspecified,
        _ if ip.is_loopback() => Reserved::Loopback,
        [s, ..] if s & 0xfe00 == 0xfc00 || s & 0xffc0 == 0xfec0 => Reserved::Private,
        [s, ..] if s & 0xffc0 == 0xfe80 => Reserved::LinkLocal,
        [s, ..] if s & 0xff00 == 0xff00 => Reserved::Multicast,
        // Discard-only, Teredo (the IPv4 address it carries is obfuscated), documentation,
        // NAT64 local-use.
        [0x100, 0, 0, 0, ..] | [0x2001, 0 | 0xdb8, ..] | [0x64, 0xff9b, 1, ..] => Reserved::Special,
        _ => return None,
    })
}

/// The IPv4 address an IPv6 address reaches by a standard translation, if any.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        // IPv4-mapped and IPv4-compatible (`::1` and `::` are IPv6's own loopback/unspecified).
        [0, 0, 0, 0, 0, 0xffff, ..] => Some(low()),
        [0, 0, 0, 0, 0, 0, ..] if !ip.is_unspecified() && !ip.is_loopback() => Some(low()),
        // NAT64, RFC 6052's well-known prefix.
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => Some(low()),
        // 6to4: 2002:AABB:CCDD::/48 carries AA.BB.CC.DD.
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

/// An address range the operator allows chart sources to reach (`10.0.0.0/8`, `::1/128`, or
/// one address). IPv4 ranges are written as IPv4; an IPv4-mapped address is matched as the
/// IPv4 address it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` (IPv4-mapped addresses as their IPv4 address) is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// IPv4-mapped IPv6 addresses as the IPv4 address they are.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad =
            || format!("{text:?} is not an address range (e.g. 10.0.0.0/8, fd00::/8, 127.0.0.1)");
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network = address.parse::<IpAddr>().map_err(|_| bad())?;
        let most = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => most,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= most)
                .ok_or_else(bad)?,
        };
        Ok(Self { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// Whether `ip` may be reached: a public address, or one in a range the operator allows.
/// `Err` names the range it is in.
pub fn check(ip: IpAddr, allowed: &[Cidr]) -> Result<(), Reserved> {
    match reserved(ip) {
        Some(range) if !allowed.iter().any(|cidr| cidr.contains(ip)) => Err(range),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(text: &str) -> Option<Reserved> {
        reserved(text.parse().unwrap())
    }

    #[test]
    fn non_public_addresses_are_classified() {
        use Reserved::*;
        for (address, expected) in [
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("127.0.0.1", Loopback),
            ("127.255.255.254", Loopback),
            ("10.0.0.1", Private),
            ("10.255.255.255", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("169.254.169.254", LinkLocal),
            ("169.254.0.1", LinkLocal),
            ("100.64.0.1", SharedNat),
            ("100.127.255.255", SharedNat),
            ("224.0.0.1", Multicast),
            ("239.255.255.250", Multicast),
            ("255.255.255.255", Multicast),
            ("240.0.0.1", Special),
            ("255.255.255.254", Special),
            ("192.0.0.8", Special),
            ("192.0.2.1", Special),
            ("198.18.0.1", Special),
            ("198.51.100.7", Special),
            ("203.0.113.9", Special),
            ("::", Unspecified),
            ("::1", Loopback),
            ("fc00::1", Private),
            ("fd12:3456::1", Private),
            ("fec0::1", Private),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("ff02::1", Multicast),
            ("100::1", Special),
            ("2001:db8::1", Special),
            // IPv4 inside IPv6: judged by the IPv4 address.
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:169.254.169.254", LinkLocal),
            ("::ffff:10.1.2.3", Private),
            ("::ffff:0.0.0.0", Unspecified),
            ("::127.0.0.1", Loopback),
            ("::10.0.0.1", Private),
            ("64:ff9b::a9fe:a9fe", LinkLocal),
            ("64:ff9b::7f00:1", Loopback),
            ("2002:a9fe:a9fe::1", LinkLocal),
            ("2002:c0a8:0101::", Private),
            ("2002:7f00:1::", Loopback),
            ("::0.0.1.0", Unspecified),
            ("2001::1", Special),
            ("64:ff9b:1::1", Special),
        ] {
            assert_eq!(class(address), Some(expected), "{address}");
        }
    }

    #[test]
    fn public_addresses_are_not_reserved() {
        for address in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.1",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.255.255",
            "192.169.0.0",
            "192.0.1.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
            "fbff::1",
            "fe00::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2001:db9::1",
        ] {
            assert_eq!(class(address), None, "{address}");
        }
    }

    #[test]
    fn allowed_ranges_let_reserved_addresses_through() {
        let loopback: Cidr = "127.0.0.1".parse().unwrap();
        assert_eq!(loopback.to_string(), "127.0.0.1/32");
        let lan: Cidr = "10.0.0.0/8".parse().unwrap();
        let ula: Cidr = "fd00::/8".parse().unwrap();
        let allowed = [loopback, lan, ula];
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        for ok in [
            "127.0.0.1",
            "::ffff:127.0.0.1",
            "10.9.8.7",
            "fd00::5",
            "8.8.8.8",
        ] {
            assert_eq!(check(ip(ok), &allowed), Ok(()), "{ok}");
        }
        for (refused, range) in [
            ("127.0.0.2", Reserved::Loopback),
            ("::1", Reserved::Loopback),
            ("169.254.169.254", Reserved::LinkLocal),
            ("192.168.0.1", Reserved::Private),
            ("fc00::1", Reserved::Private),
            ("::ffff:169.254.169.254", Reserved::LinkLocal),
        ] {
            assert_eq!(check(ip(refused), &allowed), Err(range), "{refused}");
        }
        assert_eq!(check(ip("10.0.0.1"), &[]), Err(Reserved::Private));
        let everything: [Cidr; 2] = ["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()];
        for any in ["127.0.0.1", "::1", "169.254.169.254", "fe80::1"] {
            assert_eq!(check(ip(any), &everything), Ok(()), "{any}");
        }
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "example.com",
            "10.0.0.0/-1",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
