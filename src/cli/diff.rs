//! `diff NAME`: what the next pass would change, computed in this process as the caller (their
//! kubeconfig identity) by the pipeline's own steps ([`crate::reconcile::preview`]), changing
//! nothing. Exit code as `kubectl diff`: 0 no changes, 1 changes, 2 an error.

use std::path::PathBuf;

use kube::api::Api;
use kube::runtime::events::Reporter;

use super::connect::{Connection, KubeArgs, api_error, connect};
use super::views::{Output, diff_text, encoded};
use crate::api::Manifest;
use crate::apply::Cluster;
use crate::apply::identity::Tenancy;
use crate::apply::target::TargetClients;
use crate::reconcile::Context;
use crate::reconcile::preview::preview;
use crate::render::{Backend, HelmRenderer, RenderLimits};
use crate::source::{Limits, RemoteCharts, RemoteConfig};

/// The renderer binary's name, looked for next to this executable.
const RENDERER_NAME: &str = "module-manager-renderer";

/// `--render-backend` of `diff` (as the operator's flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffBackend {
    /// The renderer child (`--renderer`).
    Renderer,
    /// `helm template` (`--helm`).
    Helm,
}

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
    /// What renders: `renderer` or `helm` (default: the renderer next to this executable if
    /// there is one, else helm).
    #[arg(long, value_enum)]
    pub render_backend: Option<DiffBackend>,
    /// The renderer binary (default: `module-manager-renderer` next to this executable).
    #[arg(long)]
    pub renderer: Option<PathBuf>,
    /// The helm binary.
    #[arg(long, default_value = "helm")]
    pub helm: PathBuf,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// The backend the flags choose: explicit, else the renderer next to `exe` when it exists,
/// else helm.
pub fn backend(args: &DiffArgs, exe: Option<PathBuf>) -> Backend {
    let beside = exe
        .and_then(|exe| Some(exe.parent()?.join(RENDERER_NAME)))
        .filter(|path| path.is_file());
    let renderer = args.renderer.clone().or(beside);
    match (args.render_backend, renderer) {
        (Some(DiffBackend::Helm), _) | (None, None) => Backend::Helm(args.helm.clone()),
        (_, Some(renderer)) => Backend::Renderer(renderer),
        (Some(DiffBackend::Renderer), None) => Backend::Renderer(RENDERER_NAME.into()),
    }
}

/// A reconcile Context on the caller's client: no impersonation, the chosen renderer in a
/// private helm home (`home`), default limits.
async fn context(args: &DiffArgs, client: kube::Client, home: PathBuf) -> anyhow::Result<Context> {
    let backend = backend(args, std::env::current_exe().ok());
    let renderer = HelmRenderer::start(backend, home, RenderLimits::default(), Default::default())
        .await
        .map_err(|e| anyhow::anyhow!("start the renderer: {e}"))?;
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
        reporter: Reporter {
            controller: "module-manager".into(),
            instance: None,
        },
        metrics: Default::default(),
        hook_timeout: crate::plan::hooks::DEFAULT_HOOK_TIMEOUT,
        tenancy: Tenancy::default(),
        pass_limits: Default::default(),
        written: Default::default(),
        dependencies: Default::default(),
        queue: Default::default(),
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
    fn the_renderer_beside_the_executable_is_the_default_else_helm() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("module-manager");
        // No renderer beside it: helm.
        assert_eq!(
            backend(&args(&[]), Some(exe.clone())),
            Backend::Helm("helm".into())
        );
        std::fs::write(dir.path().join(RENDERER_NAME), "").unwrap();
        assert_eq!(
            backend(&args(&[]), Some(exe.clone())),
            Backend::Renderer(dir.path().join(RENDERER_NAME))
        );
        assert_eq!(
            backend(
                &args(&["--render-backend", "helm", "--helm", "/bin/helm"]),
                Some(exe.clone())
            ),
            Backend::Helm("/bin/helm".into())
        );
        assert_eq!(
            backend(&args(&["--renderer", "/opt/r"]), None),
            Backend::Renderer("/opt/r".into())
        );
        assert_eq!(
            backend(&args(&["--render-backend", "renderer"]), None),
            Backend::Renderer(RENDERER_NAME.into())
        );
    }
}
