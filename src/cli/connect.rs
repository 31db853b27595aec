//! The cluster a command talks to, as kubectl finds it: `--kubeconfig`, `--context`, `-n`, else
//! `$KUBECONFIG`, `~/.kube/config` or the pod's ServiceAccount; and API errors that say what failed.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// The CLI's `User-Agent`: its writes (`reconcile`, `reset`) show in `managedFields` and audit
/// logs as `module-manager-cli`, apart from the operator's.
const CLI_USER_AGENT: &str = concat!("module-manager-cli/", env!("CARGO_PKG_VERSION"));

/// The connection flags of every Manifest command.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct KubeArgs {
    /// The kubeconfig file (default: `$KUBECONFIG`, then `~/.kube/config`, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// The Manifest's namespace (default: the context's namespace, else `default`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

/// A client of the cluster and the namespace the command works in.
pub struct Connection {
    /// The client, with the kubeconfig's identity.
    pub client: Client,
    /// `-n`, else the context's namespace.
    pub namespace: String,
}

/// Connects as the flags (else the environment) say; an error names what is missing.
pub async fn connect(args: &KubeArgs) -> anyhow::Result<Connection> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let mut config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("read the kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| anyhow::anyhow!("use the kubeconfig {}: {e}", path.display()))?
        }
        (None, Some(context)) => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| anyhow::anyhow!("use the kubeconfig context {context:?}: {e}"))?,
        (None, None) => Config::infer().await.map_err(|e| {
            anyhow::anyhow!(
                "no cluster to talk to: no kubeconfig ($KUBECONFIG, ~/.kube/config or --kubeconfig) and not in a pod: {e}"
            )
        })?,
    };
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    crate::telemetry::requests::with_user_agent(&mut config, CLI_USER_AGENT);
    let client = Client::try_from(config).map_err(|e| anyhow::anyhow!("connect: {e}"))?;
    Ok(Connection { client, namespace })
}

/// An API error as a sentence naming the step and the object: not found, forbidden (with the
/// server's message: who may not do what), or the error itself.
pub fn api_error(step: &str, what: &str, error: kube::Error) -> anyhow::Error {
    match error {
        kube::Error::Api(status) if status.code == 404 => {
            anyhow::anyhow!("{step}: {what} not found")
        }
        kube::Error::Api(status) if status.code == 403 => {
            anyhow::anyhow!("{step}: forbidden: {}", status.message)
        }
        error => anyhow::anyhow!("{step} {what}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn api_errors_say_what_failed() {
        let what = "Manifest apps/web";
        assert_eq!(
            api_error("get", what, status(404, "x")).to_string(),
            "get: Manifest apps/web not found"
        );
        let forbidden =
            r#"manifests.modulemanager.io "web" is forbidden: User "jane" cannot get resource"#;
        assert_eq!(
            api_error("get", what, status(403, forbidden)).to_string(),
            format!("get: forbidden: {forbidden}")
        );
        let other = api_error("patch", what, status(500, "boom")).to_string();
        assert!(other.starts_with("patch Manifest apps/web: "), "{other}");
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_is_named() {
        let args = KubeArgs {
            kubeconfig: Some("/nonexistent/module-manager/kubeconfig".into()),
            ..Default::default()
        };
        let error = connect(&args).await.err().unwrap().to_string();
        assert!(
            error.starts_with("read the kubeconfig /nonexistent/module-manager/kubeconfig: "),
            "{error}"
        );
    }
}
