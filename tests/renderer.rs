//! The renderer backend with the real renderer binary: many renders at once on one child, and
//! every way a render or the child can go wrong — a chart that hangs, one that eats memory, one
//! that panics, an output too large, the child killed between renders and during one.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use module_manager::render::{Backend, HelmRenderer, RenderError, RenderLimits, RenderRequest};
use module_manager::source::{self, Limits};
use serde_json::{Map, Value, json};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .canonicalize()
        .unwrap()
}

async fn renderer(home: &Path, limits: RenderLimits) -> HelmRenderer {
    let binary = testenv::Tools::locate().expect("tools built").renderer;
    HelmRenderer::start(
        Backend::Renderer(binary),
        home.to_owned(),
        limits,
        Default::default(),
    )
    .await
    .expect("the renderer starts")
}

async fn helm(home: &Path) -> HelmRenderer {
    let helm = testenv::Tools::locate().expect("tools built").helm;
    HelmRenderer::new(
        helm,
        home.to_owned(),
        RenderLimits::default(),
        Default::default(),
    )
    .await
    .expect("helm runs")
}

/// [`request`] of the test chart `tests/fixtures/charts/<chart>`.
fn fixture(chart: &str, release: &str, values: Value) -> RenderRequest {
    request(&format!("tests/fixtures/charts/{chart}"), release, values)
}

fn request(chart: &str, release: &str, values: Value) -> RenderRequest {
    let source = module_manager::api::ChartSource {
        path: Some(chart.into()),
        ..Default::default()
    };
    RenderRequest {
        chart: source::resolve(&source, &repo(), Limits::default()).expect("chart resolves"),
        release: release.into(),
        namespace: "apps".into(),
        values: values.as_object().cloned().unwrap_or_else(Map::new),
        kube_version: "v1.36.3".into(),
        api_versions: vec!["apps/v1".into(), "v1".into()].into(),
        is_upgrade: false,
    }
}

fn kill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {pid}");
}

/// Polls (every 20 ms, up to a minute) until `check` holds for the renderer's state.
async fn until(
    renderer: &HelmRenderer,
    what: &str,
    check: impl Fn(&module_manager::render::RendererState) -> bool,
) {
    for _ in 0..3000 {
        if check(&renderer.renderer_state().await.unwrap()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: {:?}", renderer.renderer_state().await);
}

#[tokio::test]
async fn many_renders_at_once_on_one_child_match_helm() {
    let home = tempfile::tempdir().unwrap();
    let renderer = Arc::new(renderer(home.path(), RenderLimits::default()).await);
    assert_eq!(renderer.backend(), "renderer");
    assert_eq!(
        renderer.version(),
        format!("v{}", testenv::tools::pinned_version("HELM_VERSION"))
    );
    let requests: Vec<RenderRequest> = (0..24)
        .map(|i| {
            request(
                "examples/charts/web",
                &format!("web-{i}"),
                json!({"replicaCount": i}),
            )
        })
        .collect();
    let rendered = futures::future::join_all(requests.iter().map(|r| {
        let renderer = renderer.clone();
        async move { renderer.render_uncached(r).await }
    }))
    .await;
    let helm = helm(home.path()).await;
    for (request, rendered) in requests.iter().zip(rendered) {
        let rendered = rendered.unwrap();
        let expected = helm.render_uncached(request).await.unwrap();
        assert_eq!(rendered, expected, "{}", request.release);
        assert!(
            rendered
                .manifest
                .contains(&format!("name: {}-web", request.release))
        );
    }
    let state = renderer.renderer_state().await.unwrap();
    assert_eq!(
        (state.starts, state.retries, state.in_flight),
        (1, 0, 0),
        "{state:?}"
    );
}

#[tokio::test]
async fn a_hanging_chart_times_out_and_the_renders_beside_it_are_retried() {
    let home = tempfile::tempdir().unwrap();
    let timeout = Duration::from_secs(10);
    let renderer = Arc::new(
        renderer(
            home.path(),
            RenderLimits {
                timeout,
                ..Default::default()
            },
        )
        .await,
    );
    // Slow renders go back to back beside a hanging one until its timeout kills the child; the
    // one in flight then must be sent again to the new child rather than fail. A kill can fall
    // between two of them (a busy machine): then the hang is repeated, at most 5 times.
    for attempt in 0..5 {
        let before = renderer.renderer_state().await.unwrap();
        let hanging = {
            let renderer = renderer.clone();
            let request = fixture("loop", &format!("loop-{attempt}"), json!({}));
            tokio::spawn(async move { renderer.render(&request).await })
        };
        until(&renderer, "the looping render is in flight", |s| {
            s.in_flight == 1
        })
        .await;
        let mut rounds = 0;
        while renderer.renderer_state().await.unwrap().starts == before.starts {
            let slow = fixture("slow", &format!("slow-{attempt}-{rounds}"), json!({}));
            let rendered = renderer.render_uncached(&slow).await;
            assert!(
                rendered
                    .as_ref()
                    .is_ok_and(|r| r.manifest.contains("slow-")),
                "a render beside the hanging one: {rendered:?}"
            );
            rounds += 1;
            assert!(rounds < 1000, "the hanging render never stopped its child");
        }
        let hung = hanging.await.unwrap();
        assert!(
            matches!(hung, Err(RenderError::Timeout(t)) if t == timeout),
            "{hung:?}"
        );
        assert!(
            !hung.unwrap_err().is_permanent(),
            "a timeout backs off as a transient error, not at the interval"
        );
        let state = renderer.renderer_state().await.unwrap();
        assert_ne!(state.pid, before.pid, "the hung child was replaced");
        assert!(
            state.retries <= before.retries + 1,
            "at most the one render beside it was sent again: {state:?}"
        );
        if state.retries == before.retries + 1 {
            return;
        }
    }
    panic!("in 5 hangs, no kill found a render beside the hanging one in flight");
}

#[tokio::test]
async fn a_hanging_render_whose_caller_gave_up_still_stops_its_child_at_the_timeout() {
    let home = tempfile::tempdir().unwrap();
    let renderer = renderer(
        home.path(),
        RenderLimits {
            timeout: Duration::from_secs(3),
            ..Default::default()
        },
    )
    .await;
    let first_pid = renderer.renderer_state().await.unwrap().pid.unwrap();
    // The pass that asked is cancelled (its shard was lost): the render's future is dropped
    // while the child still executes the looping template.
    let looping = fixture("loop", "loop", json!({}));
    let given_up = tokio::time::timeout(
        Duration::from_millis(500),
        renderer.render_uncached(&looping),
    )
    .await;
    assert!(
        given_up.is_err(),
        "the looping render answered: {given_up:?}"
    );
    assert_eq!(renderer.renderer_state().await.unwrap().in_flight, 1);
    until(
        &renderer,
        "the child spinning on the abandoned render is stopped",
        |s| s.pid != Some(first_pid),
    )
    .await;
    let web = request("examples/charts/web", "web", json!({}));
    assert!(renderer.render_uncached(&web).await.is_ok());
}

#[tokio::test]
async fn a_killed_child_is_restarted_between_renders_and_during_one() {
    let home = tempfile::tempdir().unwrap();
    let renderer = renderer(home.path(), RenderLimits::default()).await;
    let web = request("examples/charts/web", "web", json!({}));
    let expected = renderer.render_uncached(&web).await.unwrap();

    // Between renders: the next render starts a new child.
    let pid = renderer.renderer_state().await.unwrap().pid.unwrap();
    kill(pid);
    until(&renderer, "the death is noticed", |s| s.pid.is_none()).await;
    assert_eq!(renderer.render_uncached(&web).await.unwrap(), expected);
    let state = renderer.renderer_state().await.unwrap();
    assert_eq!((state.starts, state.retries), (2, 0), "{state:?}");
    assert_ne!(state.pid, Some(pid));

    // During one: the render is sent again to the next child and succeeds.
    let slow = fixture("slow", "slow", json!({"rounds": 3000}));
    let rendering = renderer.render_uncached(&slow);
    let killer = async {
        until(&renderer, "the slow render is in flight", |s| {
            s.in_flight == 1
        })
        .await;
        kill(renderer.renderer_state().await.unwrap().pid.unwrap());
    };
    let (rendered, ()) = tokio::join!(rendering, killer);
    assert!(rendered.unwrap().manifest.contains("rounds: \"3000\""));
    let state = renderer.renderer_state().await.unwrap();
    assert_eq!((state.starts, state.retries), (3, 1), "{state:?}");
}

#[tokio::test]
async fn memory_panics_and_huge_output_fail_that_render_only() {
    let home = tempfile::tempdir().unwrap();
    let limits = RenderLimits {
        memory_limit: 64 * 1024 * 1024,
        max_output: 512 * 1024,
        ..Default::default()
    };
    let renderer = renderer(home.path(), limits).await;
    let web = request("examples/charts/web", "web", json!({}));
    assert!(renderer.render_uncached(&web).await.is_ok());

    let huge = renderer
        .render_uncached(&fixture("huge", "huge", json!({})))
        .await;
    assert!(
        matches!(huge, Err(RenderError::OutputTooLarge(524_288))),
        "{huge:?}"
    );
    let panicked = renderer
        .render_uncached(&fixture("panic", "panic", json!({})))
        .await;
    assert!(
        matches!(&panicked, Err(e @ RenderError::Helm(m)) if e.is_permanent() && m.contains("negative Repeat count")),
        "{panicked:?}"
    );
    assert_eq!(
        renderer.renderer_state().await.unwrap().starts,
        1,
        "the child survived both"
    );

    let eaten = renderer
        .render_uncached(&fixture("memory", "memory", json!({})))
        .await;
    assert!(
        matches!(&eaten, Err(e @ RenderError::MemoryLimit(67_108_864)) if e.is_permanent()),
        "{eaten:?}"
    );
    assert!(
        renderer.render_uncached(&web).await.is_ok(),
        "a new child renders"
    );
    let state = renderer.renderer_state().await.unwrap();
    // The render was alone on the child when it ran out of memory: blamed at once, not sent
    // again; the next render starts a second child.
    assert_eq!((state.starts, state.retries), (2, 0), "{state:?}");
}

/// A renderer whose child may use 64 MiB of heap.
async fn small_renderer(home: &Path) -> Arc<HelmRenderer> {
    let limits = RenderLimits {
        memory_limit: 64 * 1024 * 1024,
        ..Default::default()
    };
    Arc::new(renderer(home, limits).await)
}

/// Slow renders in flight, then `chart` beside them: the one that stops the child.
async fn beside_slow_renders(
    renderer: &Arc<HelmRenderer>,
    chart: &str,
) -> (
    Result<Arc<module_manager::render::Rendered>, RenderError>,
    Vec<Result<module_manager::render::Rendered, RenderError>>,
) {
    let slow: Vec<_> = (0..3)
        .map(|i| {
            let renderer = renderer.clone();
            tokio::spawn(async move {
                let slow = fixture("slow", &format!("slow-{i}"), json!({"rounds": 3000}));
                renderer.render_uncached(&slow).await
            })
        })
        .collect();
    until(renderer, "the slow renders are in flight", |s| {
        s.in_flight == 3
    })
    .await;
    let culprit = renderer.render(&request(chart, "culprit", json!({}))).await;
    let mut innocents = Vec::new();
    for render in slow {
        innocents.push(render.await.unwrap());
    }
    (culprit, innocents)
}

/// Asserts that each slow render beside the culprit rendered.
fn assert_rendered(innocents: &[Result<module_manager::render::Rendered, RenderError>]) {
    for (i, rendered) in innocents.iter().enumerate() {
        assert!(
            rendered
                .as_ref()
                .is_ok_and(|r| r.manifest.contains(&format!("name: slow-{i}-slow"))),
            "innocent render {i}: {rendered:?}"
        );
    }
}

#[tokio::test]
async fn a_render_that_kills_the_child_fails_alone_and_the_renders_beside_it_succeed() {
    let home = tempfile::tempdir().unwrap();
    let renderer = small_renderer(home.path()).await;
    let (culprit, innocents) = beside_slow_renders(&renderer, "tests/fixtures/charts/memory").await;
    assert!(
        matches!(&culprit, Err(e @ RenderError::MemoryLimit(67_108_864)) if e.is_permanent()),
        "{culprit:?}"
    );
    assert_rendered(&innocents);
    let state = renderer.renderer_state().await.unwrap();
    // Two deaths: one with four renders in flight (nobody blamed), one of the culprit alone (a
    // child runs after it only if an innocent's turn came later).
    let deaths = |s: &module_manager::render::RendererState| s.starts - u64::from(s.pid.is_some());
    assert_eq!(deaths(&state), 2, "{state:?}");
    assert_eq!(
        state.retries, 4,
        "each render in flight ran again: {state:?}"
    );
    // The failure is cached: rendering it again does not stop the child again.
    let again = renderer
        .render(&fixture("memory", "culprit", json!({})))
        .await;
    assert!(
        matches!(again, Err(RenderError::MemoryLimit(_))),
        "{again:?}"
    );
    assert_eq!(renderer.renderer_state().await.unwrap(), state);
}

#[tokio::test]
async fn an_allocation_past_the_address_space_is_a_memory_failure_of_that_render() {
    let home = tempfile::tempdir().unwrap();
    let renderer = small_renderer(home.path()).await;
    let (culprit, innocents) =
        beside_slow_renders(&renderer, "tests/fixtures/charts/address-space").await;
    // The runtime's "out of memory" line comes before a goroutine dump longer than the stderr
    // tail kept.
    assert!(
        matches!(&culprit, Err(e @ RenderError::MemoryLimit(_)) if e.is_permanent()),
        "{culprit:?}"
    );
    assert_eq!(
        culprit.unwrap_err().to_string(),
        "render exceeded the renderer's memory limit of 67108864 bytes"
    );
    assert_rendered(&innocents);
}

#[tokio::test]
async fn a_huge_error_is_a_bounded_template_error_and_the_child_survives() {
    let home = tempfile::tempdir().unwrap();
    let renderer = renderer(home.path(), RenderLimits::default()).await;
    let failed = renderer
        .render_uncached(&fixture("fail-huge", "fail-huge", json!({})))
        .await;
    match &failed {
        Err(e @ RenderError::Helm(message)) => {
            assert!(e.is_permanent());
            assert!(message.len() <= 2048, "{} bytes", message.len());
            assert!(
                message.starts_with("execution error at (fail-huge/templates/cm.yaml:"),
                "{message:.200}"
            );
            assert!(message.contains("bytes omitted]"), "{message:.200}");
        }
        other => panic!("{:.300}", format!("{other:?}")),
    }
    let state = renderer.renderer_state().await.unwrap();
    assert_eq!((state.starts, state.retries), (1, 0), "{state:?}");
    let web = request("examples/charts/web", "web", json!({}));
    assert!(renderer.render_uncached(&web).await.is_ok());
}

/// The child writes its frames on a copy of fd 1 and points fd 1 at stderr: a stray print
/// to stdout cannot land inside a frame.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_childs_stdout_is_its_stderr_and_frames_go_elsewhere() {
    let home = tempfile::tempdir().unwrap();
    let renderer = renderer(home.path(), RenderLimits::default()).await;
    let pid = renderer.renderer_state().await.unwrap().pid.unwrap();
    let fd = |n: u32| std::fs::read_link(format!("/proc/{pid}/fd/{n}")).unwrap();
    assert_eq!(fd(1), fd(2), "stdout is stderr");
    let web = request("examples/charts/web", "web", json!({}));
    assert!(
        renderer.render_uncached(&web).await.is_ok(),
        "frames still flow"
    );
}

/// A measurement, not a check (figures in docs/benchmarks.md): 20 renders of the web chart at
/// once, alone and beside each hostile chart in flight; prints their median and slowest
/// latency, the ratio to the run without a hostile chart, and the children started.
/// `cargo test --test renderer -- --ignored --nocapture innocent_latency`
#[tokio::test]
#[ignore = "a measurement, run by hand"]
async fn innocent_latency_beside_hostile_charts() {
    let home = tempfile::tempdir().unwrap();
    let limits = RenderLimits {
        memory_limit: 256 * 1024 * 1024,
        ..Default::default()
    };
    let mut baseline = None;
    for hostile in [
        None,
        Some("loop"),
        Some("memory"),
        Some("fail-huge"),
        Some("address-space"),
    ] {
        let renderer = Arc::new(renderer(home.path(), limits).await);
        let culprit = hostile.map(|chart| {
            let renderer = renderer.clone();
            tokio::spawn(async move {
                renderer
                    .render_uncached(&fixture(chart, "hostile", json!({})))
                    .await
            })
        });
        if culprit.is_some() {
            // In flight, or already past (the 10 GB allocation fails at once).
            until(&renderer, "the hostile render is sent", |s| {
                s.in_flight == 1 || s.starts > 1 || s.pid.is_none()
            })
            .await;
        }
        let innocents = (0..20).map(|i| {
            let renderer = renderer.clone();
            async move {
                let web = request("examples/charts/web", &format!("web-{i}"), json!({}));
                let started = std::time::Instant::now();
                let rendered = renderer.render_uncached(&web).await;
                assert!(rendered.is_ok(), "{rendered:?}");
                started.elapsed()
            }
        });
        let mut latencies = futures::future::join_all(innocents).await;
        latencies.sort();
        let (median, slowest) = (latencies[10], latencies[19]);
        let base = *baseline.get_or_insert(slowest);
        let starts = renderer.renderer_state().await.unwrap().starts;
        println!(
            "{:<14} median {median:>9.1?} slowest {slowest:>9.1?} ratio {:.2} starts {starts}",
            hostile.unwrap_or("none"),
            slowest.as_secs_f64() / base.as_secs_f64()
        );
        if let Some(culprit) = culprit {
            culprit.abort();
        }
    }
}
