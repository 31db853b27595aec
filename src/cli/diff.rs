//! `diff NAME`: what the next pass would change, computed in this process as the caller (their
//! kubeconfig identity) by the pipeline's own steps ([`crate::reconcile::preview`]), changing
//! nothing. Exit code as `kubectl diff`: 0 no changes, 1 changes, 2 an error.

use std::path::PathBuf;

use kube::api::Api;
use kube::runtime::events::Reporter;

use super::connect::{Connection, KubeArgs, api_error, connect};
use super::locate::{Kind, Places, Wanted, binary, choose, exists};
use super::views::{Output, diff_text, encoded};
use crate::api::Manifest;
use crate::apply::Cluster;
use crate::apply::identity::Tenancy;
use crate::apply::target::TargetClients;
use crate::reconcile::Context;
use crate::reconcile::preview::preview;
use crate::render::{Backend, HelmRenderer, RenderLimits};
use crate::source::{Limits, RemoteCharts, RemoteConfig};

/// `diff NAME`, with the operator's chart and render flags.
#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The Manifest.
    pub name: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: Output,
    /// Directory local chart paths (`spec.chart.path`) resolve under, as the operator's
    /// `--chart-root` (default: the working directory).
    #[arg(long, default_value = ".")]
    pub chart_root: PathBuf,
    /// Where remote charts are cached (default: as the operator's, `module-manager-charts` in
    /// the temporary directory).
    #[arg(long)]
    pub chart_cache_dir: Option<PathBuf>,
    /// What renders: `renderer` or `helm` (default: the first found of the renderer, then of
    /// helm, beside this executable, where `hack/build-tools.sh` builds it, on `PATH`).
    #[arg(long, env = "MODULE_MANAGER_RENDER_BACKEND", value_enum)]
    pub render_backend: Option<Kind>,
    /// The renderer binary (default: looked for as `--render-backend` says).
    #[arg(long, env = "MODULE_MANAGER_RENDERER")]
    pub renderer: Option<PathBuf>,
    /// The helm binary (default: looked for as `--render-backend` says).
    #[arg(long, env = "MODULE_MANAGER_HELM")]
    pub helm: Option<PathBuf>,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// The backend the flags choose, else the one found ([`choose`]) in `places`.
pub fn backend(args: &DiffArgs, places: &Places) -> anyhow::Result<Backend> {
    let wanted = Wanted {
        kind: args.render_backend,
        renderer: args.renderer.clone(),
        helm: args.helm.clone(),
    };
    choose(&wanted, places, exists).map_err(|e| anyhow::anyhow!("find the renderer: {e}"))
}

/// A reconcile Context on the caller's client: no impersonation, the chosen renderer in a
/// private helm home (`home`), default limits.
async fn context(args: &DiffArgs, client: kube::Client, home: PathBuf) -> anyhow::Result<Context> {
    let backend = backend(args, &Places::of_this_process())?;
    let shown = binary(&backend).display().to_string();
    let renderer = HelmRenderer::start(backend, home, RenderLimits::default(), Default::default())
        .await
        .map_err(|e| anyhow::anyhow!("start the renderer {shown}: {e}"))?;
    let chart_root = args
        .chart_root
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("--chart-root {}: {e}", args.chart_root.display()))?;
    let cache = args
        .chart_cache_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("module-manager-charts"));
    Ok(Context {
        cluster: Cluster::connect(client.clone())
            .await
            .map_err(|e| anyhow::anyhow!("discover the cluster's API: {e}"))?,
        client,
        targets: TargetClients::default(),
        renderer,
        chart_root,
        chart_limits: Limits::default(),
        remote_charts: RemoteCharts::new(RemoteConfig::new(cache))
            .map_err(|e| anyhow::anyhow!("open the chart cache: {e}"))?,
        replica: "module-manager-diff".into(),
        shards: crate::shard::ShardCount::DEFAULT,
        shard_filter: Default::default(),
        reporter: Reporter {
            controller: "module-manager".into(),
            instance: None,
        },
        metrics: Default::default(),
        hook_timeout: crate::plan::hooks::DEFAULT_HOOK_TIMEOUT,
        tenancy: Tenancy::default(),
        pass_limits: Default::default(),
        written: Default::default(),
        drift_override_managers: Vec::new(),
        dependencies: Default::default(),
        queue: Default::default(),
        deletions: Default::default(),
        rollouts: Default::default(),
    })
}

/// `diff`: the text to print and whether anything would change.
pub async fn diff(args: DiffArgs) -> anyhow::Result<(String, bool)> {
    let Connection { client, namespace } = connect(&args.kube).await?;
    let what = format!("Manifest {namespace}/{}", args.name);
    let manifest = Api::<Manifest>::namespaced(client.clone(), &namespace)
        .get(&args.name)
        .await
        .map_err(|e| api_error("get", &what, e))?;
    let home = tempfile::Builder::new()
        .prefix("module-manager-diff-")
        .tempdir()
        .map_err(|e| anyhow::anyhow!("make a helm home: {e}"))?;
    let ctx = context(&args, client, home.path().to_owned()).await?;
    let diff = preview(&manifest, &ctx)
        .await
        .map_err(|e| anyhow::anyhow!("diff {what}: {e}"))?;
    let text = match encoded(&diff, args.output)? {
        Some(text) => text,
        None => diff_text(&diff),
    };
    Ok((text, diff.has_changes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        diff: DiffArgs,
    }

    fn args(extra: &[&str]) -> DiffArgs {
        Flags::try_parse_from(["diff", "web"].iter().chain(extra))
            .unwrap()
            .diff
    }

    #[test]
    fn the_flags_name_the_backend_and_nothing_found_names_the_step() {
        let none = Places::default();
        assert_eq!(
            backend(
                &args(&["--render-backend", "helm", "--helm", "/bin/helm"]),
                &none
            )
            .unwrap(),
            Backend::Helm("/bin/helm".into())
        );
        assert_eq!(
            backend(&args(&["--renderer", "/opt/r"]), &none).unwrap(),
            Backend::Renderer("/opt/r".into())
        );
        let empty = tempfile::tempdir().unwrap();
        let places = Places {
            path: vec![empty.path().to_owned()],
            ..Places::default()
        };
        let error = backend(&args(&["--render-backend", "renderer"]), &places).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("find the renderer: no renderer found; tried:"),
            "{error}"
        );
    }
}
