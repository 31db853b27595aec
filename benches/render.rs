//! CPU per render, the renderer child vs one `helm template` per render, on the same chart in the
//! same run (`make bench`): the CPU of this process plus that of the renderer child (read from
//! `/proc`) or of the helm processes (`RUSAGE_CHILDREN`, counted as each is reaped). Prints the
//! ratio; docs/benchmarks.md records it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use module_manager::render::{Backend, HelmRenderer, RenderLimits, RenderRequest};
use module_manager::source::{self, Limits};
use serde_json::json;

/// Renders per backend (after a warm-up of a few).
const RENDERS: usize = 100;
const WARM_UP: usize = 5;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .canonicalize()
        .unwrap()
}

/// CPU time of this process (`RUSAGE_SELF`) and of its reaped children (`RUSAGE_CHILDREN`).
fn rusage(who: libc::c_int) -> Duration {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(who, &raw mut usage), 0);
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// User + system CPU of a running process, from `/proc/<pid>/stat`.
fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the renderer runs");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_secs_f64(ticks as f64 / per_second as f64)
}

fn request(i: usize) -> RenderRequest {
    let source = module_manager::api::ChartSource {
        path: Some("loadtest/charts/podinfo-like".into()),
        ..Default::default()
    };
    RenderRequest {
        chart: source::resolve(&source, &repo(), Limits::default()).expect("chart resolves"),
        release: format!("bench-{i}"),
        namespace: "apps".into(),
        values: json!({"replicaCount": 1 + i % 3})
            .as_object()
            .cloned()
            .unwrap(),
        kube_version: "v1.36.3".into(),
        api_versions: vec!["apps/v1".into(), "v1".into()].into(),
        is_upgrade: false,
    }
}

/// CPU and wall time of [`RENDERS`] sequential uncached renders, and the CPU of each.
async fn measure(renderer: &HelmRenderer) -> (Duration, Duration) {
    for i in 0..WARM_UP {
        renderer
            .render_uncached(&request(i))
            .await
            .expect("renders");
    }
    let child = renderer.renderer_state().await.and_then(|s| s.pid);
    let cpu = || {
        rusage(libc::RUSAGE_SELF)
            + match child {
                Some(pid) => process_cpu(pid),
                None => rusage(libc::RUSAGE_CHILDREN),
            }
    };
    let (cpu_before, started) = (cpu(), Instant::now());
    for i in 0..RENDERS {
        renderer
            .render_uncached(&request(i))
            .await
            .expect("renders");
    }
    let wall = started.elapsed();
    assert_eq!(
        renderer.renderer_state().await.and_then(|s| s.pid),
        child,
        "the same renderer child served every render"
    );
    ((cpu() - cpu_before) / RENDERS as u32, wall / RENDERS as u32)
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let tools = testenv::Tools::locate()?;
    let home = tempfile::tempdir()?;
    let limits = RenderLimits::default();
    let helm = HelmRenderer::start(
        Backend::Helm(tools.helm),
        home.path().join("helm"),
        limits,
        Default::default(),
    )
    .await?;
    let renderer = HelmRenderer::start(
        Backend::Renderer(tools.renderer),
        home.path().join("renderer"),
        limits,
        Default::default(),
    )
    .await?;
    let (cli_cpu, cli_wall) = measure(&helm).await;
    let (child_cpu, child_wall) = measure(&renderer).await;
    println!(
        "render of loadtest/charts/podinfo-like, {RENDERS} uncached renders each, one at a time:"
    );
    println!(
        "  helm CLI:  CPU {} per render, wall {}",
        ms(cli_cpu),
        ms(cli_wall)
    );
    println!(
        "  renderer:  CPU {} per render, wall {}",
        ms(child_cpu),
        ms(child_wall)
    );
    println!(
        "  renderer ÷ CLI CPU per render: {:.3} (1/{:.1}; goal ≤ 1/20)",
        child_cpu.as_secs_f64() / cli_cpu.as_secs_f64(),
        cli_cpu.as_secs_f64() / child_cpu.as_secs_f64()
    );
    Ok(())
}
