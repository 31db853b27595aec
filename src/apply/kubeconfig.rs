//! Kubeconfigs of remote targets: parsed with a size limit and checked ([`validate`]) so that
//! only inline credentials of the current context are kept — never a command, a plugin or a file.

use kube::config::{
    AuthInfo, Cluster as KubeconfigCluster, Context as KubeconfigContext, Kubeconfig,
    NamedAuthInfo, NamedCluster, NamedContext,
};

/// The largest kubeconfig accepted (a kubeconfig with a CA bundle is a few KiB).
pub const MAX_KUBECONFIG_BYTES: usize = 256 * 1024;

/// Why a kubeconfig is refused. Messages name fields and entries, never values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// no `current-context`.
    #[error("it has no current-context")]
    NoCurrentContext,
    /// the current context is not defined.
    #[error("its current-context {0:?} is not among its contexts")]
    MissingContext(String),
    /// the context's cluster is not defined.
    #[error("cluster {0:?} of the current context is not among its clusters")]
    MissingCluster(String),
    /// the context's user is not defined.
    #[error("user {0:?} of the current context is not among its users")]
    MissingUser(String),
    /// the cluster has no server.
    #[error("cluster {0:?} has no server")]
    NoServer(String),
    /// the server URL is not acceptable.
    #[error(
        "the server of cluster {cluster:?} must be an https:// URL without credentials, query or fragment: {problem}"
    )]
    BadServer {
        /// The cluster entry.
        cluster: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// a field that would run code, read a file, or weaken TLS.
    #[error("{owner} sets {field}: {why}")]
    Forbidden {
        /// `user "name"` or `cluster "name"`.
        owner: String,
        /// The kubeconfig field.
        field: &'static str,
        /// Why it is refused and what to use instead.
        why: &'static str,
    },
    /// a client certificate without its key, or the other way round.
    #[error("user {0:?} sets only one of client-certificate-data and client-key-data")]
    IncompleteCertificate(String),
}

const RUNS_CODE: &str = "module-manager never runs commands or plugins named by a kubeconfig; embed a token or a client certificate (token, client-certificate-data and client-key-data)";
const READS_FILE: &str = "module-manager never reads files named by a kubeconfig; embed the content instead (token, client-certificate-data, client-key-data, certificate-authority-data)";

/// A kubeconfig that passed [`validate`]: the current context only, with nothing but the
/// accepted fields.
#[derive(Clone)]
pub struct ValidKubeconfig {
    /// The server URL (it carries no credentials: those are refused).
    pub server: String,
    kubeconfig: Kubeconfig,
}

impl ValidKubeconfig {
    /// When its credential expires, if the token (a JWT's `exp`) or the client certificate
    /// (`notAfter`) says ([`super::credential`]).
    pub fn credential_validity(&self) -> Option<super::credential::Validity> {
        let user = self.kubeconfig.auth_infos.first()?.auth_info.as_ref()?;
        super::credential::validity(user)
    }

    /// A digest of the cluster it names (server, CA, TLS server name, proxy): two kubeconfigs
    /// with the same digest reach the same API server the same way. No credential goes in.
    pub fn cluster_digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let cluster = self
            .kubeconfig
            .clusters
            .first()
            .and_then(|c| c.cluster.as_ref());
        let bytes = serde_json::to_vec(&cluster).unwrap_or_default();
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The kubeconfig to build a client from (credentials included).
    pub fn into_kubeconfig(self) -> Kubeconfig {
        self.kubeconfig
    }
}

impl std::fmt::Debug for ValidKubeconfig {
    // Never the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValidKubeconfig")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// Parses the bytes of a kubeconfig Secret key. The parser's own message is not passed on: it
/// may quote the Secret's content.
pub fn parse(bytes: &[u8]) -> Result<Kubeconfig, String> {
    if bytes.len() > MAX_KUBECONFIG_BYTES {
        return Err(format!(
            "it is {} bytes, more than the limit of {MAX_KUBECONFIG_BYTES}",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_owned())?;
    // Before decoding: an alias is copied at every use, without a bound in bytes, and deep
    // nesting costs the decoder time quadratic in its depth.
    use crate::source::yaml::YamlRefusal;
    if let Err(refusal @ (YamlRefusal::Alias { .. } | YamlRefusal::TooDeep { .. })) =
        crate::source::yaml::refuse_aliases(text)
    {
        return Err(format!("it is refused: {refusal}"));
    }
    Kubeconfig::from_yaml(text).map_err(|_| {
        "it is not a valid kubeconfig (YAML); the parser's message is not shown because it may quote the Secret".to_owned()
    })
}

/// Checks the current context of a kubeconfig and keeps only what module-manager accepts:
/// the cluster's `server` (https), `certificate-authority-data`, `tls-server-name`; the user's
/// `token`, `client-certificate-data` + `client-key-data` and impersonation. Refused: `exec`,
/// `auth-provider`, `tokenFile`, `client-certificate`, `client-key`, `certificate-authority`
/// (files), `username`/`password`, `insecure-skip-tls-verify: true`, `proxy-url`, and `http://`
/// servers. Other contexts, clusters and users are ignored (never used).
pub fn validate(kubeconfig: &Kubeconfig) -> Result<ValidKubeconfig, Refusal> {
    let Current {
        context,
        cluster,
        user,
    } = current_entries(kubeconfig)?;
    // The user first: the fields that would run code matter most.
    let accepted_user = match user {
        Some((name, user)) => accept_user(name, user)?,
        None => AuthInfo::default(),
    };
    let (server, accepted_cluster) = accept_cluster(&context.cluster, cluster)?;
    Ok(ValidKubeconfig {
        server,
        kubeconfig: single_context(accepted_cluster, accepted_user),
    })
}

/// The entries of a kubeconfig's current context.
struct Current<'a> {
    context: &'a KubeconfigContext,
    cluster: &'a KubeconfigCluster,
    /// The user's name and entry, when the context names one.
    user: Option<(&'a str, &'a AuthInfo)>,
}

/// The current context of a kubeconfig, its cluster and (when it names one) its user.
fn current_entries(kubeconfig: &Kubeconfig) -> Result<Current<'_>, Refusal> {
    let context_name = kubeconfig
        .current_context
        .as_deref()
        .filter(|c| !c.is_empty())
        .ok_or(Refusal::NoCurrentContext)?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| Refusal::MissingContext(context_name.to_owned()))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| Refusal::MissingCluster(context.cluster.clone()))?;
    let user = match context.user.as_deref().filter(|u| !u.is_empty()) {
        None => None,
        Some(name) => Some((
            name,
            kubeconfig
                .auth_infos
                .iter()
                .find(|u| u.name == name)
                .and_then(|u| u.auth_info.as_ref())
                .ok_or_else(|| Refusal::MissingUser(name.to_owned()))?,
        )),
    };
    Ok(Current {
        context,
        cluster,
        user,
    })
}

/// The accepted fields of user `name`: a token or an inline client certificate, and
/// impersonation; anything that runs code or reads a file is refused.
fn accept_user(name: &str, user: &AuthInfo) -> Result<AuthInfo, Refusal> {
    let forbidden = |field, why| Refusal::Forbidden {
        owner: format!("user {name:?}"),
        field,
        why,
    };
    if user.exec.is_some() {
        return Err(forbidden("exec", RUNS_CODE));
    }
    if user.auth_provider.is_some() {
        return Err(forbidden("auth-provider", RUNS_CODE));
    }
    if set(&user.token_file) {
        return Err(forbidden("tokenFile", READS_FILE));
    }
    if set(&user.client_certificate) {
        return Err(forbidden("client-certificate", READS_FILE));
    }
    if set(&user.client_key) {
        return Err(forbidden("client-key", READS_FILE));
    }
    if set(&user.username) || user.password.is_some() {
        return Err(forbidden(
            "username/password",
            "basic authentication was removed from Kubernetes in 1.19; use a token or a client certificate",
        ));
    }
    if set(&user.client_certificate_data) != user.client_key_data.is_some() {
        return Err(Refusal::IncompleteCertificate(name.to_owned()));
    }
    Ok(AuthInfo {
        token: user.token.clone(),
        client_certificate_data: user.client_certificate_data.clone(),
        client_key_data: user.client_key_data.clone(),
        impersonate: user.impersonate.clone(),
        impersonate_uid: user.impersonate_uid.clone(),
        impersonate_groups: user.impersonate_groups.clone(),
        impersonate_user_extra: user.impersonate_user_extra.clone(),
        ..Default::default()
    })
}

/// The server and the accepted fields of cluster `cluster_name`: an https server, its CA data
/// and TLS server name; a CA file, skipped verification and proxies are refused.
fn accept_cluster(
    cluster_name: &str,
    cluster: &KubeconfigCluster,
) -> Result<(String, KubeconfigCluster), Refusal> {
    let forbidden = |field, why| Refusal::Forbidden {
        owner: format!("cluster {cluster_name:?}"),
        field,
        why,
    };
    if set(&cluster.certificate_authority) {
        return Err(forbidden("certificate-authority", READS_FILE));
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        return Err(forbidden(
            "insecure-skip-tls-verify",
            "the server's certificate must be verified (set certificate-authority-data, or use a certificate the system trusts)",
        ));
    }
    if set(&cluster.proxy_url) {
        return Err(forbidden(
            "proxy-url",
            "proxies are not supported for targets",
        ));
    }
    let server = cluster
        .server
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Refusal::NoServer(cluster_name.to_owned()))?;
    check_server(server).map_err(|problem| Refusal::BadServer {
        cluster: cluster_name.to_owned(),
        problem,
    })?;
    let accepted = KubeconfigCluster {
        server: Some(server.to_owned()),
        certificate_authority_data: cluster.certificate_authority_data.clone(),
        tls_server_name: cluster.tls_server_name.clone(),
        ..Default::default()
    };
    Ok((server.to_owned(), accepted))
}

/// A kubeconfig of one context, `target`, of the accepted cluster and user.
fn single_context(cluster: KubeconfigCluster, user: AuthInfo) -> Kubeconfig {
    const NAME: &str = "target";
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: NAME.into(),
            cluster: Some(cluster),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: NAME.into(),
            auth_info: Some(user),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: NAME.into(),
            context: Some(KubeconfigContext {
                cluster: NAME.into(),
                user: Some(NAME.into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(NAME.into()),
        ..Default::default()
    }
}

fn set(field: &Option<String>) -> bool {
    field.as_deref().is_some_and(|f| !f.is_empty())
}

/// `https://host[:port][/path]`, nothing else: a URL with credentials would put them in every
/// message naming the server.
fn check_server(server: &str) -> Result<(), &'static str> {
    let uri: http::Uri = server.parse().map_err(|_| "not a URL")?;
    if uri.scheme_str() != Some("https") {
        return Err("the scheme is not https");
    }
    let authority = uri.authority().ok_or("no host")?;
    if authority.as_str().contains('@') {
        return Err("it carries credentials");
    }
    if uri.query().is_some() || server.contains('#') {
        return Err("it has a query or fragment");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cr3t-t0ken-value";

    fn kubeconfig(user: &str, cluster: &str) -> Kubeconfig {
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: ctx\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nclusters:\n- name: c\n  cluster:\n{cluster}\nusers:\n- name: u\n  user:\n{user}\n"
        );
        parse(text.as_bytes()).unwrap()
    }

    const SERVER: &str =
        "    server: https://10.0.0.1:6443\n    certificate-authority-data: Q0E=\n";

    fn refusal(user: &str, cluster: &str) -> Refusal {
        validate(&kubeconfig(user, cluster)).unwrap_err()
    }

    #[test]
    fn inline_token_and_certificates_are_accepted_and_nothing_else_is_kept() {
        let valid = validate(&kubeconfig(
            &format!("    token: {TOKEN}\n    as: deployer\n"),
            &format!("{SERVER}    tls-server-name: api.example\n    disable-compression: true\n"),
        ))
        .unwrap();
        assert_eq!(valid.server, "https://10.0.0.1:6443");
        let kept = &valid.kubeconfig;
        assert_eq!(kept.current_context.as_deref(), Some("target"));
        let cluster = kept.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        assert_eq!(cluster.tls_server_name.as_deref(), Some("api.example"));
        assert_eq!(cluster.disable_compression, None);
        let user = kept.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(user.token.is_some());
        assert_eq!(user.impersonate.as_deref(), Some("deployer"));
        assert!(
            !format!("{valid:?}").contains(TOKEN),
            "Debug shows no token"
        );

        let certificate = validate(&kubeconfig(
            "    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n",
            SERVER,
        ))
        .unwrap();
        let user = certificate.kubeconfig.auth_infos[0]
            .auth_info
            .as_ref()
            .unwrap();
        assert_eq!(user.client_certificate_data.as_deref(), Some("Q0VSVA=="));
        assert!(user.client_key_data.is_some());
    }

    #[test]
    fn commands_plugins_and_files_are_refused_naming_the_field_not_the_value() {
        let cases = [
            (
                format!(
                    "    token: {TOKEN}\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/touch\n      args: [/tmp/pwned]\n"
                ),
                SERVER.to_owned(),
                "exec",
            ),
            (
                "    auth-provider:\n      name: oidc\n      config:\n        id-token: abc\n"
                    .into(),
                SERVER.into(),
                "auth-provider",
            ),
            (
                "    tokenFile: /var/run/secrets/token\n".into(),
                SERVER.into(),
                "tokenFile",
            ),
            (
                "    client-certificate: /etc/cert.pem\n    client-key-data: S0VZ\n".into(),
                SERVER.into(),
                "client-certificate",
            ),
            (
                "    client-certificate-data: Q0VSVA==\n    client-key: /etc/key.pem\n".into(),
                SERVER.into(),
                "client-key",
            ),
            (
                format!("    username: admin\n    password: {TOKEN}\n"),
                SERVER.into(),
                "username/password",
            ),
            (
                format!("    token: {TOKEN}\n"),
                "    server: https://10.0.0.1:6443\n    certificate-authority: /etc/ca.pem\n"
                    .into(),
                "certificate-authority",
            ),
            (
                format!("    token: {TOKEN}\n"),
                "    server: https://10.0.0.1:6443\n    insecure-skip-tls-verify: true\n".into(),
                "insecure-skip-tls-verify",
            ),
            (
                format!("    token: {TOKEN}\n"),
                format!("{SERVER}    proxy-url: http://proxy:3128\n"),
                "proxy-url",
            ),
        ];
        for (user, cluster, field) in cases {
            let refusal = refusal(&user, &cluster);
            assert!(
                matches!(&refusal, Refusal::Forbidden { field: f, .. } if *f == field),
                "{field}: {refusal:?}"
            );
            let message = refusal.to_string();
            assert!(message.contains(field), "{message}");
            for value in [TOKEN, "/bin/touch", "/etc/", "/var/run", "abc"] {
                assert!(!message.contains(value), "{field}: {message} shows {value}");
            }
        }
    }

    #[test]
    fn incomplete_or_unnamed_entries_are_refused() {
        assert_eq!(
            refusal("    client-certificate-data: Q0VSVA==\n", SERVER),
            Refusal::IncompleteCertificate("u".into())
        );
        let no_context = parse(b"apiVersion: v1\nkind: Config\n").unwrap();
        assert_eq!(
            validate(&no_context).unwrap_err(),
            Refusal::NoCurrentContext
        );
        let mut missing = kubeconfig("    token: t\n", SERVER);
        missing.current_context = Some("other".into());
        assert_eq!(
            validate(&missing).unwrap_err(),
            Refusal::MissingContext("other".into())
        );
        let mut no_user = kubeconfig("    token: t\n", SERVER);
        no_user.auth_infos.clear();
        assert_eq!(
            validate(&no_user).unwrap_err(),
            Refusal::MissingUser("u".into())
        );
        let mut no_cluster = kubeconfig("    token: t\n", SERVER);
        no_cluster.clusters.clear();
        assert_eq!(
            validate(&no_cluster).unwrap_err(),
            Refusal::MissingCluster("c".into())
        );
        assert_eq!(
            refusal("    token: t\n", "    certificate-authority-data: Q0E=\n"),
            Refusal::NoServer("c".into())
        );
    }

    /// Other contexts, users and clusters are never read nor kept: a command in another
    /// user is not run (and not refused), a current context that names it is refused.
    #[test]
    fn only_the_current_context_is_read_and_kept() {
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: ctx\ncontexts:\n- name: ctx\n  context: {{cluster: c, user: u}}\n- name: evil\n  context: {{cluster: e, user: e}}\nclusters:\n- name: c\n  cluster:\n{SERVER}- name: e\n  cluster: {{server: 'http://169.254.169.254', insecure-skip-tls-verify: true}}\nusers:\n- name: u\n  user: {{token: {TOKEN}}}\n- name: e\n  user: {{exec: {{apiVersion: client.authentication.k8s.io/v1, command: /bin/touch}}, tokenFile: /etc/x}}\n"
        );
        let mut kubeconfig = parse(text.as_bytes()).unwrap();
        let valid = validate(&kubeconfig).unwrap();
        assert_eq!(valid.server, "https://10.0.0.1:6443");
        let kept = valid.into_kubeconfig();
        assert_eq!(
            (
                kept.contexts.len(),
                kept.clusters.len(),
                kept.auth_infos.len()
            ),
            (1, 1, 1)
        );
        assert!(
            !format!("{kept:?}").contains("/bin/touch") && !format!("{kept:?}").contains("169.254")
        );
        kubeconfig.current_context = Some("evil".into());
        assert!(matches!(
            validate(&kubeconfig).unwrap_err(),
            Refusal::Forbidden { field: "exec", .. }
        ));
    }

    #[test]
    fn servers_must_be_plain_https_urls() {
        for (server, problem) in [
            ("http://10.0.0.1:8080", "the scheme is not https"),
            (
                "https://admin:hunter2@10.0.0.1:6443",
                "it carries credentials",
            ),
            (
                "https://10.0.0.1:6443/?token=x",
                "it has a query or fragment",
            ),
            ("not a url", "not a URL"),
        ] {
            let refusal = refusal("    token: t\n", &format!("    server: {server}\n"));
            assert_eq!(
                refusal,
                Refusal::BadServer {
                    cluster: "c".into(),
                    problem
                },
                "{server}"
            );
            assert!(!refusal.to_string().contains("hunter2"));
        }
        assert!(
            validate(&kubeconfig(
                "    token: t\n",
                "    server: https://api.example/prefix\n"
            ))
            .is_ok()
        );
    }

    #[test]
    fn oversized_binary_and_malformed_secrets_are_refused_without_quoting_them() {
        let big = vec![b'a'; MAX_KUBECONFIG_BYTES + 1];
        assert!(parse(&big).unwrap_err().contains("more than the limit"));
        assert!(parse(&[0xff, 0xfe, 0x00]).unwrap_err().contains("UTF-8"));
        let malformed = format!("clusters: {TOKEN}\n");
        let problem = parse(malformed.as_bytes()).unwrap_err();
        assert!(problem.contains("not a valid kubeconfig"));
        assert!(!problem.contains(TOKEN));
        // Anchors and aliases: refused before decoding, the token not quoted.
        let aliased =
            format!("users:\n- name: u\n  user: &u {{token: {TOKEN}}}\n- name: v\n  user: *u\n");
        let problem = parse(aliased.as_bytes()).unwrap_err();
        assert_eq!(
            problem,
            "it is refused: YAML anchors and aliases are not allowed (line 3, column 12)"
        );
        // Nesting deeper than the decoder reads (its time is quadratic in the depth).
        let deep = format!("users: {}", "[".repeat(200_000));
        let problem = parse(deep.as_bytes()).unwrap_err();
        assert!(
            problem.starts_with("it is refused: YAML nested deeper than 128 levels"),
            "{problem}"
        );
    }

    mod properties {
        use proptest::prelude::*;
        use serde_json::{Map, Value, json};

        use super::*;

        /// Values that must never appear in a refusal's message.
        const SECRETS: [&str; 6] = [
            "s3cr3t-t0ken-value",
            "hunter2",
            "/etc/secret",
            "/bin/touch",
            "/var/run/secret",
            "id-t0ken",
        ];

        /// The user fields a kubeconfig may set, the accepted and the refused.
        fn user_fields() -> Vec<(&'static str, Value)> {
            vec![
                ("token", json!("s3cr3t-t0ken-value")),
                (
                    "exec",
                    json!({"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/touch", "args": ["/tmp/pwned"]}),
                ),
                (
                    "auth-provider",
                    json!({"name": "oidc", "config": {"id-token": "id-t0ken"}}),
                ),
                ("tokenFile", json!("/var/run/secret/token")),
                ("client-certificate", json!("/etc/secret/cert.pem")),
                ("client-key", json!("/etc/secret/key.pem")),
                ("client-certificate-data", json!("Q0VSVA==")),
                ("client-key-data", json!("S0VZ")),
                ("username", json!("admin")),
                ("password", json!("hunter2")),
                ("as", json!("deployer")),
            ]
        }

        fn cluster_fields() -> Vec<(&'static str, Value)> {
            vec![
                ("certificate-authority", json!("/etc/secret/ca.pem")),
                ("certificate-authority-data", json!("Q0E=")),
                ("insecure-skip-tls-verify", json!(true)),
                ("insecure-skip-tls-verify", json!(false)),
                ("proxy-url", json!("http://proxy:3128")),
                ("tls-server-name", json!("api.example")),
            ]
        }

        const SERVERS: [&str; 7] = [
            "https://10.0.0.1:6443",
            "https://api.example/prefix",
            "https://admin:hunter2@10.0.0.1:6443",
            "http://10.0.0.1:8080",
            "https://10.0.0.1:6443/?token=s3cr3t-t0ken-value",
            "not a url",
            "",
        ];

        /// A subset of `fields` as a JSON map.
        fn subset(fields: Vec<(&'static str, Value)>) -> impl Strategy<Value = Map<String, Value>> {
            let count = fields.len();
            prop::collection::vec(any::<bool>(), count).prop_map(move |chosen| {
                fields
                    .iter()
                    .zip(chosen)
                    .filter(|(_, c)| *c)
                    .map(|((k, v), _)| ((*k).to_owned(), v.clone()))
                    .collect()
            })
        }

        /// A kubeconfig: a user `u` and a cluster `c` of any fields, context `ctx` of them,
        /// and a context `other` whose user `evil` runs a command.
        #[derive(Debug, Clone)]
        struct Shape {
            user: Map<String, Value>,
            cluster: Map<String, Value>,
            server: Option<&'static str>,
            current: Option<&'static str>,
            with_user: bool,
            as_json: bool,
        }

        fn shape() -> impl Strategy<Value = Shape> {
            (
                subset(user_fields()),
                subset(cluster_fields()),
                prop::option::of(prop::sample::select(SERVERS.to_vec())),
                prop::option::of(prop::sample::select(vec!["ctx", "other", "missing", ""])),
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(|(user, cluster, server, current, with_user, as_json)| {
                    Shape {
                        user,
                        cluster,
                        server,
                        current,
                        with_user,
                        as_json,
                    }
                })
        }

        fn text(shape: &Shape) -> String {
            let mut cluster = shape.cluster.clone();
            if let Some(server) = shape.server {
                cluster.insert("server".into(), json!(server));
            }
            let mut context = json!({"cluster": "c"});
            if shape.with_user {
                context["user"] = json!("u");
            }
            let mut config = json!({
                "apiVersion": "v1",
                "kind": "Config",
                "contexts": [
                    {"name": "ctx", "context": context},
                    {"name": "other", "context": {"cluster": "c", "user": "evil"}},
                ],
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [
                    {"name": "u", "user": shape.user},
                    {"name": "evil", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/touch"}}},
                ],
            });
            if let Some(current) = shape.current {
                config["current-context"] = json!(current);
            }
            if shape.as_json {
                config.to_string()
            } else {
                serde_yaml_ng::to_string(&config).unwrap()
            }
        }

        const REFUSED_USER_FIELDS: [&str; 7] = [
            "exec",
            "auth-provider",
            "tokenFile",
            "client-certificate",
            "client-key",
            "username",
            "password",
        ];

        fn refused_cluster(cluster: &Map<String, Value>) -> bool {
            ["certificate-authority", "proxy-url"]
                .iter()
                .any(|f| cluster.contains_key(*f))
                || cluster.get("insecure-skip-tls-verify") == Some(&json!(true))
        }

        proptest! {
            /// Accepted only when the current context's user and cluster set nothing that runs
            /// code, reads a file or weakens TLS, with an https server; what is accepted holds
            /// nothing else; a refusal quotes no value.
            #[test]
            fn only_inline_credentials_of_the_current_context_are_accepted(shape in shape()) {
                let parsed = parse(text(&shape).as_bytes());
                prop_assert!(parsed.is_ok(), "{:?}", parsed.err());
                let outcome = validate(&parsed.unwrap());
                let user_refused = shape.with_user
                    && REFUSED_USER_FIELDS.iter().any(|f| shape.user.contains_key(*f));
                let server_ok = matches!(
                    shape.server,
                    Some("https://10.0.0.1:6443" | "https://api.example/prefix")
                );
                if shape.current != Some("ctx") || user_refused || refused_cluster(&shape.cluster) || !server_ok {
                    prop_assert!(outcome.is_err(), "{:?}", shape);
                }
                match outcome {
                    Err(refusal) => {
                        let message = refusal.to_string();
                        for secret in SECRETS {
                            prop_assert!(!message.contains(secret), "{}", message);
                        }
                    }
                    Ok(valid) => {
                        let kept = valid.into_kubeconfig();
                        prop_assert_eq!((kept.clusters.len(), kept.auth_infos.len(), kept.contexts.len()), (1, 1, 1));
                        let user = kept.auth_infos[0].auth_info.clone().unwrap();
                        prop_assert!(user.exec.is_none() && user.auth_provider.is_none());
                        prop_assert!(user.token_file.is_none() && user.client_certificate.is_none());
                        prop_assert!(user.client_key.is_none() && user.username.is_none() && user.password.is_none());
                        let cluster = kept.clusters[0].cluster.clone().unwrap();
                        prop_assert!(cluster.certificate_authority.is_none() && cluster.proxy_url.is_none());
                        prop_assert!(cluster.insecure_skip_tls_verify.is_none());
                        prop_assert!(cluster.server.unwrap().starts_with("https://"));
                    }
                }
            }

            /// Any bytes are refused or parsed, never a panic; a refusal quotes none of them.
            #[test]
            fn any_bytes_are_parsed_or_refused_without_quoting_them(
                bytes in prop::collection::vec(any::<u8>(), 0..400),
                shape in shape(),
                cut in any::<prop::sample::Index>(),
            ) {
                let _ = parse(&bytes);
                let whole = text(&shape);
                let end = cut.index(whole.len() + 1);
                match parse(&whole.as_bytes()[..end]) {
                    Ok(kubeconfig) => {
                        if let Err(refusal) = validate(&kubeconfig) {
                            let message = refusal.to_string();
                            prop_assert!(SECRETS.iter().all(|s| !message.contains(s)), "{}", message);
                        }
                    }
                    Err(message) => {
                        prop_assert!(SECRETS.iter().all(|s| !message.contains(s)), "{}", message);
                    }
                }
            }
        }
    }
}
