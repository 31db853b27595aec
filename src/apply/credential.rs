//! When a remote target's credential stops working (issue 29 item 5): the `iat`/`exp` claims of
//! a bearer token that is a JWT (ServiceAccount tokens are) and the `notBefore`/`notAfter` of
//! an inline client certificate — whichever expires first. Read to be shown (the expiry metric,
//! docs/metrics.md), never trusted: the target verifies its credentials, this only tells when it
//! will stop accepting them. Pure, unit-tested; a credential that is not a JWT or not a
//! certificate (an opaque token) has no known expiry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use kube::config::AuthInfo;
use secrecy::ExposeSecret;

/// The longest token or certificate looked into: a kubeconfig is at most 1 MiB anyway.
const MAX_CREDENTIAL_BYTES: usize = 64 * 1024;

/// How long before its expiry a credential is due at most (a long-lived one: its last hour).
pub const DUE_WITHIN: Duration = Duration::from_secs(3600);

/// When a credential was issued (if it says) and when it expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// `iat` of a token, `notBefore` of a certificate.
    pub issued: Option<SystemTime>,
    /// `exp` of a token, `notAfter` of a certificate.
    pub expires: SystemTime,
}

impl Validity {
    /// Whether the credential is due at `now`: expired, or less than an hour *and* less than a
    /// fifth of its lifetime left. A token renewed by 80 % of its life (as the kubelet renews
    /// pods' tokens) is never due; one that is not renewed is due in its last fifth (a 1-hour
    /// token in its last 12 minutes, a 10-minute one in its last 2); a certificate valid for a
    /// year is due in its last hour.
    pub fn due(&self, now: SystemTime) -> bool {
        let lifetime = self
            .issued
            .and_then(|issued| self.expires.duration_since(issued).ok());
        let warning = lifetime.map_or(DUE_WITHIN, |lifetime| DUE_WITHIN.min(lifetime / 5));
        self.expires
            .duration_since(now)
            .map_or(true, |left| left < warning)
    }
}

/// When `user`'s credential expires (and was issued), if it says.
pub fn validity(user: &AuthInfo) -> Option<Validity> {
    let token = user
        .token
        .as_ref()
        .and_then(|token| token_validity(token.expose_secret()));
    let certificate = user
        .client_certificate_data
        .as_deref()
        .and_then(certificate_validity);
    match (token, certificate) {
        (Some(token), Some(certificate)) if certificate.expires < token.expires => {
            Some(certificate)
        }
        (token, certificate) => token.or(certificate),
    }
}

/// Seconds since the epoch.
fn at(seconds: u64) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// The `iat` and `exp` claims of a JWT (`header.payload.signature`, base64url).
pub fn token_validity(token: &str) -> Option<Validity> {
    if token.len() > MAX_CREDENTIAL_BYTES {
        return None;
    }
    let mut parts = token.trim().split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&payload).ok()?;
    let seconds = |claim: &str| {
        let value = claims.get(claim)?;
        value
            .as_u64()
            .or_else(|| value.as_f64().map(|f| f.max(0.0) as u64))
    };
    Some(Validity {
        issued: seconds("iat").and_then(at),
        expires: at(seconds("exp")?)?,
    })
}

/// The `notBefore` and `notAfter` of the first certificate of `data` (base64 of PEM, a
/// kubeconfig's `client-certificate-data`).
pub fn certificate_validity(data: &str) -> Option<Validity> {
    if data.len() > MAX_CREDENTIAL_BYTES {
        return None;
    }
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .ok()?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let certificate = pem.parse_x509().ok()?;
    let validity = certificate.validity();
    let seconds = |time: &x509_parser::time::ASN1Time| u64::try_from(time.timestamp()).ok();
    Some(Validity {
        issued: seconds(&validity.not_before).and_then(at),
        expires: at(seconds(&validity.not_after)?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let encode = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!(
            "{}.{}.c2lnbmF0dXJl",
            encode(r#"{"alg":"RS256"}"#),
            encode(claims)
        )
    }

    fn secs(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn a_service_account_token_is_valid_from_iat_to_exp() {
        let validity = |claims| token_validity(&jwt(claims));
        assert_eq!(
            validity(r#"{"iat":1700000000,"exp":1800000000,"sub":"x"}"#),
            Some(Validity {
                issued: Some(secs(1_700_000_000)),
                expires: secs(1_800_000_000)
            })
        );
        let fractional = validity(r#"{"exp":1800000000.5}"#).unwrap();
        assert_eq!(
            (fractional.issued, fractional.expires),
            (None, secs(1_800_000_000))
        );
        assert_eq!(validity(r#"{"sub":"no exp"}"#), None);
        assert_eq!(token_validity("an-opaque-token"), None);
        assert_eq!(token_validity("a.b.c.d"), None);
        assert_eq!(token_validity("a.!!!.c"), None);
    }

    #[test]
    fn a_client_certificate_is_valid_from_not_before_to_not_after() {
        let mut params = rcgen::CertificateParams::new(vec!["deployer".into()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2030, 3, 4);
        params.not_after = rcgen::date_time_ymd(2031, 3, 4);
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        let data = base64::engine::general_purpose::STANDARD.encode(pem);
        // 2030-03-04 and 2031-03-04, 00:00:00 UTC.
        let expected = Validity {
            issued: Some(secs(1_898_812_800)),
            expires: secs(1_930_348_800),
        };
        assert_eq!(certificate_validity(&data), Some(expected));
        assert_eq!(
            certificate_validity("bm90IGEgY2VydA=="),
            None,
            "not a certificate"
        );
    }

    #[test]
    fn the_first_to_expire_counts() {
        let user = AuthInfo {
            token: Some(jwt(r#"{"exp":2000000000}"#).into()),
            ..Default::default()
        };
        assert_eq!(
            validity(&user).map(|v| v.expires),
            Some(secs(2_000_000_000))
        );
        assert_eq!(validity(&AuthInfo::default()), None);
    }

    #[test]
    fn a_credential_is_due_in_its_last_hour_or_last_fifth_whichever_is_shorter() {
        let issued = secs(1_000_000);
        let valid_for = |seconds| Validity {
            issued: Some(issued),
            expires: issued + Duration::from_secs(seconds),
        };
        // A 10-minute token: due in its last 2 minutes, not before.
        let short = valid_for(600);
        assert!(
            !short.due(issued + Duration::from_secs(480)),
            "renewed at 80 %: not due"
        );
        assert!(short.due(issued + Duration::from_secs(481)));
        // A year-long certificate: due in its last hour.
        let year = valid_for(365 * 24 * 3600);
        assert!(!year.due(year.expires - Duration::from_secs(3601)));
        assert!(year.due(year.expires - Duration::from_secs(3599)));
        // Expired, and no issue time: the last hour.
        assert!(short.due(short.expires + Duration::from_secs(1)));
        let unknown = Validity {
            issued: None,
            expires: secs(10_000),
        };
        assert!(unknown.due(secs(10_000 - 3599)));
        assert!(!unknown.due(secs(10_000 - 3601)));
    }
}
