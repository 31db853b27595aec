//! Throwaway certificates and the admin kubeconfig of a test control plane.

use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;
use std::time::SystemTime;

use base64::{Engine, engine::general_purpose::STANDARD};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::Error;

/// PEM-encoded material for one control plane.
pub struct Pki {
    /// CA that signed the serving certificate; clients trust it.
    pub serving_ca_pem: String,
    /// kube-apiserver's serving certificate (SANs `localhost`, `127.0.0.1`).
    pub serving_cert_pem: String,
    /// Key of the serving certificate.
    pub serving_key_pem: String,
    /// CA the API server trusts for client certificates.
    pub client_ca_pem: String,
    /// Client certificate of the admin user (`O=system:masters`).
    pub admin_cert_pem: String,
    /// Key of the admin client certificate.
    pub admin_key_pem: String,
    /// Private key that signs service-account tokens.
    pub service_account_key_pem: String,
    /// Public half of `service_account_key_pem`.
    pub service_account_pub_pem: String,
    /// The client CA with its key, to issue more client certificates.
    client_issuer: CertifiedIssuer<'static, KeyPair>,
}

fn ca(common_name: &str) -> Result<CertifiedIssuer<'static, KeyPair>, Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name(common_name, None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

impl Pki {
    /// Generates a fresh set (ECDSA P-256 keys).
    pub fn generate() -> Result<Self, Error> {
        Self::generate_with(&[], &[])
    }

    /// Like [`Pki::generate`], with more addresses and names in the serving certificate (the
    /// real node's: its address, the `kubernetes` Service's address and names).
    pub fn generate_with(ips: &[Ipv4Addr], names: &[&str]) -> Result<Self, Error> {
        let serving_ca = ca("module-manager-testenv-serving-ca")?;
        let serving_key = KeyPair::generate()?;
        let mut dns = vec!["localhost".to_owned()];
        dns.extend(names.iter().map(|n| (*n).to_owned()));
        let mut serving = CertificateParams::new(dns)?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        for ip in ips {
            serving
                .subject_alt_names
                .push(SanType::IpAddress(IpAddr::V4(*ip)));
        }
        serving.distinguished_name = name("localhost", None);
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &serving_ca)?;

        let client_ca = ca("module-manager-testenv-client-ca")?;
        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name = name("testenv-admin", Some("system:masters"));
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &client_ca)?;

        let service_account_key = KeyPair::generate()?;
        Ok(Self {
            serving_ca_pem: serving_ca.pem(),
            serving_cert_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            client_ca_pem: client_ca.pem(),
            admin_cert_pem: admin_cert.pem(),
            admin_key_pem: admin_key.serialize_pem(),
            service_account_pub_pem: service_account_key.public_key_pem(),
            service_account_key_pem: service_account_key.serialize_pem(),
            client_issuer: client_ca,
        })
    }

    /// A client certificate (PEM) and its key for `user` (in `group`, if any), signed by the
    /// client CA, valid over `valid` (which may lie in the past or have begun long ago).
    pub fn client_certificate(
        &self,
        user: &str,
        group: Option<&str>,
        valid: Range<SystemTime>,
    ) -> Result<(String, String), Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(user, group);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = time::OffsetDateTime::from(valid.start);
        params.not_after = time::OffsetDateTime::from(valid.end);
        let certificate = params.signed_by(&key, &self.client_issuer)?;
        Ok((certificate.pem(), key.serialize_pem()))
    }

    /// A kubeconfig for `server` with `user`'s client certificate and key embedded.
    pub fn kubeconfig(&self, server: &str, user: &str, cert_pem: &str, key_pem: &str) -> String {
        let b64 = |pem: &str| STANDARD.encode(pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testenv\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: testenv\n  context:\n    cluster: testenv\n    user: {user}\ncurrent-context: testenv\n",
            ca = b64(&self.serving_ca_pem),
            cert = b64(cert_pem),
            key = b64(key_pem),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_embeds_the_credentials() {
        let pki = Pki::generate().unwrap();
        let kubeconfig = pki.kubeconfig(
            "https://127.0.0.1:6443",
            "testenv-admin",
            &pki.admin_cert_pem,
            &pki.admin_key_pem,
        );
        assert!(kubeconfig.contains("server: https://127.0.0.1:6443"));
        assert!(kubeconfig.contains(&STANDARD.encode(&pki.admin_cert_pem)));
    }
}
