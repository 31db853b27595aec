//! Credentials of a chart source, read from its `spec.chart.secretRef` Secret: HTTP basic or a
//! bearer token for a Helm repository, a `.dockerconfigjson` entry (or basic) for an OCI
//! registry; which host they are for; and a fingerprint for the caches (a hash, never the
//! secret). Parsing is pure; errors name the Secret and the key, never a value.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The key of a `kubernetes.io/dockerconfigjson` Secret.
const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";
/// The keys of HTTP basic credentials (Flux's HelmRepository `secretRef`).
const USERNAME_KEY: &str = "username";
const PASSWORD_KEY: &str = "password";
/// The key of a bearer token (Flux's GitRepository `secretRef`).
const BEARER_KEY: &str = "bearerToken";

/// Why a chart source's credentials cannot be used: names the Secret and the key, never a
/// value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.chart.secretRef: {0}")]
pub struct CredentialsError(pub String);

impl CredentialsError {
    /// The Secret does not exist in the Manifest's namespace.
    pub fn missing(secret: &str) -> Self {
        Self(format!(
            "Secret {secret} does not exist in the Manifest's namespace"
        ))
    }
}

/// How a request is authorized.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Scheme {
    /// `Authorization: Basic base64(username:password)`.
    Basic { username: String, password: String },
    /// `Authorization: Bearer <token>`.
    Bearer(String),
}

/// One set of credentials and its fingerprint.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Auth {
    pub(super) scheme: Scheme,
    /// sha256 of the credentials (hex): what the caches are keyed by.
    pub(super) fingerprint: String,
}

impl Auth {
    fn new(scheme: Scheme) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"module-manager chart credentials v1\0");
        match &scheme {
            Scheme::Basic { username, password } => {
                hash.update(b"basic\0");
                hash.update(username.as_bytes());
                hash.update(b"\0");
                hash.update(password.as_bytes());
            }
            Scheme::Bearer(token) => {
                hash.update(b"bearer\0");
                hash.update(token.as_bytes());
            }
        }
        let fingerprint = format!("{:x}", hash.finalize());
        Self {
            scheme,
            fingerprint,
        }
    }

    /// A bearer token (a registry's pull token).
    pub(super) fn bearer(token: String) -> Self {
        Self::new(Scheme::Bearer(token))
    }

    /// Whether these are a bearer token (used as they are, never sent to a token service).
    pub(super) fn is_bearer(&self) -> bool {
        matches!(self.scheme, Scheme::Bearer(_))
    }

    /// `request` with the `Authorization` header.
    pub(super) fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.scheme {
            Scheme::Basic { username, password } => request.basic_auth(username, Some(password)),
            Scheme::Bearer(token) => request.bearer_auth(token),
        }
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.scheme {
            Scheme::Basic { .. } => "basic",
            Scheme::Bearer(_) => "bearer",
        };
        write!(f, "Auth({kind}, redacted)")
    }
}

/// A docker config's entries: by registry host, the credentials or why they are unusable.
type DockerEntries = Vec<(String, Result<Auth, String>)>;

/// What a Secret holds.
#[derive(Clone)]
enum Held {
    /// Basic or bearer, for whichever host the source names.
    One(Auth),
    /// A docker config: an entry (or why it is unusable) per registry host.
    Docker(DockerEntries),
}

/// A chart source's credentials, as read from its Secret. `Debug` shows no secret.
#[derive(Clone)]
pub struct Credentials {
    /// The Secret's name, for messages.
    secret: String,
    held: Held,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials(Secret {}, redacted)", self.secret)
    }
}

impl Credentials {
    /// Reads the credentials of the Secret `secret` from its data (pure): `.dockerconfigjson`,
    /// or `username` and `password`, or `bearerToken`.
    pub fn from_secret(
        secret: &str,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Self, CredentialsError> {
        let text = |key: &str| -> Result<Option<String>, CredentialsError> {
            data.get(key)
                .map(|bytes| {
                    String::from_utf8(bytes.clone()).map_err(|_| {
                        CredentialsError(format!("Secret {secret} key {key} is not UTF-8"))
                    })
                })
                .transpose()
        };
        let held = if let Some(config) = data.get(DOCKER_CONFIG_KEY) {
            Held::Docker(docker_entries(secret, config)?)
        } else {
            let basic = (text(USERNAME_KEY)?, text(PASSWORD_KEY)?);
            Held::One(match (basic, text(BEARER_KEY)?) {
                ((None, None), Some(token)) => bearer_auth(secret, BEARER_KEY, token)?,
                (_, Some(_)) => {
                    return Err(CredentialsError(format!(
                        "Secret {secret} holds both {USERNAME_KEY}/{PASSWORD_KEY} and \
                         {BEARER_KEY}: keep one of them"
                    )));
                }
                ((Some(username), Some(password)), None) => basic_auth(secret, username, password)?,
                ((Some(_), None), None) => return Err(missing_key(secret, PASSWORD_KEY)),
                ((None, Some(_)), None) => return Err(missing_key(secret, USERNAME_KEY)),
                ((None, None), None) => {
                    return Err(CredentialsError(format!(
                        "Secret {secret} has none of the keys {USERNAME_KEY} and \
                         {PASSWORD_KEY}, {BEARER_KEY}, or {DOCKER_CONFIG_KEY}"
                    )));
                }
            })
        };
        Ok(Self {
            secret: secret.to_owned(),
            held,
        })
    }

    /// The credentials for a Helm repository: basic or bearer (a docker config is for
    /// registries).
    pub(super) fn for_repository(&self) -> Result<Auth, CredentialsError> {
        match &self.held {
            Held::One(auth) => Ok(auth.clone()),
            Held::Docker(_) => Err(CredentialsError(format!(
                "Secret {} is a {DOCKER_CONFIG_KEY} Secret, which is for OCI registries; a Helm \
                 repository needs {USERNAME_KEY} and {PASSWORD_KEY}, or {BEARER_KEY}",
                self.secret
            ))),
        }
    }

    /// The credentials for the OCI registry `registry` (`host[:port]`, as in the reference;
    /// `resolved` is the host actually spoken to, e.g. `index.docker.io` for `docker.io`): the
    /// docker config's entry for that host, matched as docker does (a key's scheme and path
    /// are ignored, the port is not).
    pub(super) fn for_registry(
        &self,
        registry: &str,
        resolved: &str,
    ) -> Result<Auth, CredentialsError> {
        let entries = match &self.held {
            Held::One(auth) => return Ok(auth.clone()),
            Held::Docker(entries) => entries,
        };
        let found = entries
            .iter()
            .find(|(host, _)| host == registry || host == resolved);
        match found {
            Some((_, Ok(auth))) => Ok(auth.clone()),
            Some((_, Err(why))) => Err(CredentialsError(why.clone())),
            None => Err(CredentialsError(format!(
                "Secret {} has no {DOCKER_CONFIG_KEY} entry for registry {registry}",
                self.secret
            ))),
        }
    }
}

fn missing_key(secret: &str, key: &str) -> CredentialsError {
    CredentialsError(format!("Secret {secret} has no key {key}"))
}

/// Basic credentials: a username without `:` (RFC 7617) and no control characters.
fn basic_auth(secret: &str, username: String, password: String) -> Result<Auth, CredentialsError> {
    if username.is_empty() || username.contains(':') || username.chars().any(char::is_control) {
        return Err(CredentialsError(format!(
            "Secret {secret}: the username is empty or holds ':' or a control character"
        )));
    }
    if password.chars().any(char::is_control) {
        return Err(CredentialsError(format!(
            "Secret {secret}: the password holds a control character (a trailing newline?)"
        )));
    }
    Ok(Auth::new(Scheme::Basic { username, password }))
}

/// A bearer token: visible ASCII only (it goes into a header as it is).
fn bearer_auth(secret: &str, key: &str, token: String) -> Result<Auth, CredentialsError> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CredentialsError(format!(
            "Secret {secret} key {key} is empty or holds a character other than visible ASCII \
             (a trailing newline?)"
        )));
    }
    Ok(Auth::new(Scheme::Bearer(token)))
}

/// `{"auths": {"<host>": {"auth": "<base64 user:password>"} | {"username", "password"} |
/// {"registrytoken"}}}`, as docker's `config.json`.
#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerEntry>,
}

#[derive(Deserialize)]
struct DockerEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    registrytoken: Option<String>,
    identitytoken: Option<String>,
}

/// The entries of a `.dockerconfigjson`, by host (parse errors say where, never what).
fn docker_entries(secret: &str, bytes: &[u8]) -> Result<DockerEntries, CredentialsError> {
    let config: DockerConfig = serde_json::from_slice(bytes).map_err(|e| {
        CredentialsError(format!(
            "Secret {secret} key {DOCKER_CONFIG_KEY} is not a docker config (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    Ok(config
        .auths
        .into_iter()
        .map(|(key, entry)| {
            let host = docker_host(&key);
            let auth = docker_auth(secret, &host, entry).map_err(|e| e.0);
            (host, auth)
        })
        .collect())
}

/// A docker config key as a host: without `http://`/`https://` and without a path (docker's
/// `ConvertToHostname`).
fn docker_host(key: &str) -> String {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    rest.split('/').next().unwrap_or_default().to_owned()
}

fn docker_auth(secret: &str, host: &str, entry: DockerEntry) -> Result<Auth, CredentialsError> {
    let what = format!("Secret {secret} {DOCKER_CONFIG_KEY} entry {host}");
    if let Some(encoded) = entry.auth.filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(|| CredentialsError(format!("{what}: auth is not base64 of UTF-8")))?;
        let (username, password) = decoded
            .split_once(':')
            .ok_or_else(|| CredentialsError(format!("{what}: auth is not username:password")))?;
        return basic_auth(secret, username.to_owned(), password.to_owned());
    }
    match (entry.username, entry.password, entry.registrytoken) {
        (Some(username), Some(password), _) => basic_auth(secret, username, password),
        (_, _, Some(token)) => bearer_auth(secret, &format!("{host} registrytoken"), token),
        _ if entry.identitytoken.is_some() => Err(CredentialsError(format!(
            "{what}: identitytoken (an OAuth2 refresh token) is not supported; use a username \
             and password (or a token as the password)"
        ))),
        _ => Err(CredentialsError(format!(
            "{what} has no auth, username and password, or registrytoken"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    fn error(pairs: &[(&str, &str)]) -> String {
        Credentials::from_secret("repo-creds", &data(pairs))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn basic_and_bearer_credentials_are_read() {
        let basic = data(&[("username", "alice"), ("password", "hunter2")]);
        let creds = Credentials::from_secret("repo-creds", &basic).unwrap();
        let auth = creds.for_repository().unwrap();
        assert!(matches!(&auth.scheme, Scheme::Basic { username, password }
            if username == "alice" && password == "hunter2"));
        assert_eq!(
            creds.for_registry("r.example.com", "r.example.com"),
            Ok(auth.clone())
        );
        let bearer = data(&[("bearerToken", "t0ken")]);
        let other = Credentials::from_secret("repo-creds", &bearer).unwrap();
        let other = other.for_repository().unwrap();
        assert!(matches!(&other.scheme, Scheme::Bearer(t) if t == "t0ken"));
        assert_ne!(auth.fingerprint, other.fingerprint);
        let rotated = data(&[("username", "alice"), ("password", "hunter3")]);
        let rotated = Credentials::from_secret("repo-creds", &rotated).unwrap();
        assert_ne!(
            rotated.for_repository().unwrap().fingerprint,
            auth.fingerprint
        );
    }

    #[test]
    fn bad_secrets_name_the_secret_and_key_never_a_value() {
        for (pairs, expected) in [
            (&[("username", "alice")][..], "has no key password"),
            (&[("password", "hunter2")], "has no key username"),
            (&[], "has none of the keys"),
            (&[("token", "hunter2")], "has none of the keys"),
            (
                &[
                    ("username", "a"),
                    ("password", "hunter2"),
                    ("bearerToken", "hunter2"),
                ],
                "keep one of them",
            ),
            (&[("username", "a:b"), ("password", "hunter2")], "holds ':'"),
            (
                &[("username", "a"), ("password", "hunter2\n")],
                "trailing newline",
            ),
            (
                &[("bearerToken", "hunter2\n")],
                "key bearerToken is empty or holds",
            ),
            (
                &[(".dockerconfigjson", "{hunter2")],
                "is not a docker config (line 1",
            ),
        ] {
            let message = error(pairs);
            assert!(message.contains("Secret repo-creds"), "{message}");
            assert!(message.contains(expected), "{message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
        let creds = Credentials::from_secret("x", &data(&[("bearerToken", "hunter2")])).unwrap();
        assert!(!format!("{creds:?}").contains("hunter2"));
        assert!(!format!("{:?}", creds.for_repository().unwrap()).contains("hunter2"));
    }

    #[test]
    fn docker_config_entries_are_matched_by_host_as_docker_does() {
        let auth = base64::engine::general_purpose::STANDARD.encode("bob:hunter2");
        let config = serde_json::json!({"auths": {
            "https://registry.example.com/v1/": {"auth": auth},
            "127.0.0.1:5000": {"username": "carol", "password": "pw"},
            "https://index.docker.io/v1/": {"registrytoken": "tok"},
            "broken.example.com": {"auth": "!!"},
            "azure.example.com": {"identitytoken": "hunter2"},
        }})
        .to_string();
        let creds =
            Credentials::from_secret("pull", &data(&[(".dockerconfigjson", &config)])).unwrap();
        let found = |host: &str| creds.for_registry(host, host);
        assert!(matches!(found("registry.example.com").unwrap().scheme,
            Scheme::Basic { ref username, ref password } if username == "bob" && password == "hunter2"));
        assert!(matches!(found("127.0.0.1:5000").unwrap().scheme,
            Scheme::Basic { ref username, .. } if username == "carol"));
        let hub = creds.for_registry("docker.io", "index.docker.io").unwrap();
        assert!(matches!(hub.scheme, Scheme::Bearer(ref t) if t == "tok"));
        for (host, expected) in [
            (
                "127.0.0.1:5001",
                "has no .dockerconfigjson entry for registry 127.0.0.1:5001",
            ),
            ("registry.example.com:443", "no .dockerconfigjson entry"),
            ("broken.example.com", "auth is not base64"),
            (
                "azure.example.com",
                "identitytoken (an OAuth2 refresh token) is not supported",
            ),
        ] {
            let message = found(host).unwrap_err().to_string();
            assert!(message.contains(expected), "{message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
        let repository = creds.for_repository().unwrap_err().to_string();
        assert!(
            repository.contains("which is for OCI registries"),
            "{repository}"
        );
    }
}
