//! The renderer backend: one long-lived `renderer` child (Helm's engine, `renderer/` at the repo
//! root) serving many renders at once over its pipes; killed when a render times out, restarted
//! (with backoff) when it dies, its other renders in flight retried once on the new child.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot};

use super::frame::{self, Hello, Request, Response};
use super::{RenderError, RenderLimits, RenderRequest, RendererState, helm_message};

/// The renderer's exit status when its heap outgrew `--memory-limit` (`renderer/limits.go`).
const EXIT_MEMORY: i32 = 3;
/// Most bytes of one request frame (`maxRequest` in `renderer/protocol.go`).
const MAX_REQUEST: usize = 64 << 20;
/// How long a new child may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest wait before starting a child again after it died.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How much of the child's stderr is kept to explain its death.
const STDERR_TAIL: usize = 4096;

/// Why a child stopped (every render in flight on it gets this).
#[derive(Clone, Debug)]
enum Death {
    /// We killed it (a render on it timed out, or the backend was dropped).
    Killed(&'static str),
    /// Its heap outgrew the memory limit.
    Memory,
    /// It exited, crashed or broke the protocol: what it said.
    Exited(String),
}

impl Death {
    fn into_error(self, memory_limit: u64) -> RenderError {
        match self {
            Self::Killed(why) => RenderError::RendererDied(why.to_owned()),
            Self::Memory => RenderError::MemoryLimit(memory_limit),
            Self::Exited(what) => RenderError::RendererDied(what),
        }
    }
}

/// What a render waits on: the child's answer or its death.
type Reply = oneshot::Sender<Result<Response, Death>>;

/// Renders in flight on one child; closed when the child is gone.
#[derive(Default)]
struct Pending {
    closed: bool,
    waiting: HashMap<u64, Reply>,
}

/// A running child.
struct Live {
    pid: Option<u32>,
    stdin: tokio::sync::Mutex<ChildStdin>,
    pending: Arc<Mutex<Pending>>,
    kill: mpsc::UnboundedSender<Death>,
}

impl Live {
    fn is_open(&self) -> bool {
        !lock(&self.pending).closed
    }

    /// Sends one request frame and waits for its answer or the child's death.
    async fn call(&self, id: u64, request: &[u8]) -> Result<Response, Death> {
        let (reply, answer) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if pending.closed {
                return Err(Death::Exited("the renderer had stopped".into()));
            }
            pending.waiting.insert(id, reply);
        }
        let mut stdin = self.stdin.lock().await;
        // A write cut off (its render was given up on mid-write) leaves half a frame on the
        // pipe, and the next request would be read as its rest: the child must go.
        let mut cut_off = CutOff {
            kill: &self.kill,
            armed: true,
        };
        // A failed write means the child is going; its supervisor answers with the reason.
        if stdin.write_all(request).await.is_ok() {
            let _ = stdin.flush().await;
        }
        cut_off.armed = false;
        drop(stdin);
        answer
            .await
            .unwrap_or_else(|_| Err(Death::Exited("the renderer's supervisor stopped".into())))
    }
}

/// The log target of the child's own lifecycle (not one render's).
const PROCESS_TARGET: &str = "module_manager::process::renderer";
/// Why a child ends when its backend is dropped (the replica shuts down).
const DROPPED: &str = "the renderer backend was dropped";

/// Stops the child when dropped armed: a request frame was cut off mid-write.
struct CutOff<'a> {
    kill: &'a mpsc::UnboundedSender<Death>,
    armed: bool,
}

impl Drop for CutOff<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self
                .kill
                .send(Death::Killed("a request to it was cut off mid-write"));
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The long-lived renderer child and how to start it again.
pub(super) struct ChildRenderer {
    binary: PathBuf,
    home: PathBuf,
    limits: RenderLimits,
    current: tokio::sync::Mutex<Option<Arc<Live>>>,
    next_id: AtomicU64,
    /// Unexpected deaths (and failed starts) since the last answer: the restart backoff.
    deaths_in_a_row: Arc<AtomicU32>,
    starts: AtomicU64,
    retries: AtomicU64,
}

impl ChildRenderer {
    /// Starts the child (it must answer its hello); returns the backend and the helm version.
    pub(super) async fn start(
        binary: PathBuf,
        home: PathBuf,
        limits: RenderLimits,
    ) -> Result<(Self, String), RenderError> {
        let deaths_in_a_row = Arc::new(AtomicU32::new(0));
        let (live, version) = spawn(&binary, &home, &limits, &deaths_in_a_row).await?;
        let backend = Self {
            binary,
            home,
            limits,
            current: tokio::sync::Mutex::new(Some(live)),
            next_id: AtomicU64::new(1),
            deaths_in_a_row,
            starts: AtomicU64::new(1),
            retries: AtomicU64::new(0),
        };
        Ok((backend, version))
    }

    /// The child's process id, its renders in flight, and the counts so far.
    pub(super) async fn state(&self) -> RendererState {
        let current = self.current.lock().await;
        let live = current.as_ref().filter(|l| l.is_open());
        RendererState {
            pid: live.and_then(|l| l.pid),
            in_flight: live.map_or(0, |l| lock(&l.pending).waiting.len()),
            starts: self.starts.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }

    /// Renders on the running child (starting one if needed). A render still unanswered when
    /// the child dies is sent once more to the next child; a render past the timeout kills the
    /// child, because Go cannot stop a template that is executing.
    pub(super) async fn render(&self, request: &RenderRequest) -> Result<String, RenderError> {
        let values = Value::Object(request.values.clone()).to_string();
        let mut retried = false;
        loop {
            let live = self.live().await?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let frame = frame::encode(&Request {
                id,
                chart: &request.chart.path.to_string_lossy(),
                release: &request.release,
                namespace: &request.namespace,
                values: &values,
                kube_version: &request.kube_version,
                api_versions: &request.api_versions,
                is_upgrade: request.is_upgrade,
                include_crds: true,
                skip_tests: true,
                max_output: self.limits.max_output,
            });
            if frame.len() - 4 > MAX_REQUEST {
                return Err(RenderError::Helm(format!(
                    "the values exceed the renderer's request limit of {MAX_REQUEST} bytes"
                )));
            }
            let mut watchdog = Watchdog {
                live: live.clone(),
                id,
                deadline: tokio::time::Instant::now() + self.limits.timeout,
                armed: true,
            };
            let answered = tokio::time::timeout(self.limits.timeout, live.call(id, &frame)).await;
            watchdog.armed = false;
            match answered {
                Err(_) => {
                    let _ = live
                        .kill
                        .send(Death::Killed("another render on it timed out"));
                    return Err(RenderError::Timeout(self.limits.timeout));
                }
                Ok(Ok(response)) => {
                    self.deaths_in_a_row.store(0, Ordering::Relaxed);
                    return answer(response, self.limits.max_output);
                }
                Ok(Err(death)) if !retried => {
                    tracing::info!(?death, release = %request.release, "renderer stopped during a render; sending it again");
                    retried = true;
                    self.retries.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(death)) => return Err(death.into_error(self.limits.memory_limit)),
            }
        }
    }

    /// The running child, or a new one (after a backoff when children keep dying).
    async fn live(&self) -> Result<Arc<Live>, RenderError> {
        let mut current = self.current.lock().await;
        if let Some(live) = current.as_ref().filter(|l| l.is_open()) {
            return Ok(live.clone());
        }
        let deaths = self.deaths_in_a_row.load(Ordering::Relaxed);
        if deaths > 0 {
            tokio::time::sleep(backoff(deaths)).await;
        }
        let spawned = spawn(
            &self.binary,
            &self.home,
            &self.limits,
            &self.deaths_in_a_row,
        )
        .await;
        let (live, _) = spawned.inspect_err(|_| {
            self.deaths_in_a_row.fetch_add(1, Ordering::Relaxed);
        })?;
        self.starts.fetch_add(1, Ordering::Relaxed);
        tracing::info!(pid = ?live.pid, "renderer started");
        *current = Some(live.clone());
        Ok(live)
    }
}

/// Stops the child when a render whose caller gave up on it (its pass was cancelled, e.g. the
/// shard was lost) is still running at its deadline: Go cannot stop the template, and with its
/// caller gone nothing else would notice that it hangs.
struct Watchdog {
    live: Arc<Live>,
    id: u64,
    deadline: tokio::time::Instant,
    /// Cleared once the caller has its answer or its timeout (the timeout kills by itself).
    armed: bool,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.armed {
            return;
        }
        let (live, id, deadline) = (self.live.clone(), self.id, self.deadline);
        runtime.spawn(async move {
            tokio::time::sleep_until(deadline).await;
            if lock(&live.pending).waiting.contains_key(&id) {
                let _ = live
                    .kill
                    .send(Death::Killed("a render given up on ran past its timeout"));
            }
        });
    }
}

/// 100 ms after the first death in a row, doubling, at most [`MAX_BACKOFF`].
fn backoff(deaths: u32) -> Duration {
    let shift = deaths.saturating_sub(1).min(16);
    (Duration::from_millis(100) * (1u32 << shift)).min(MAX_BACKOFF)
}

/// A render's result from the child's answer.
fn answer(response: Response, max_output: usize) -> Result<String, RenderError> {
    match (response.manifest, response.error) {
        (Some(manifest), None) => Ok(manifest),
        (_, Some(failure)) if failure.kind == "outputTooLarge" => {
            Err(RenderError::OutputTooLarge(max_output))
        }
        // The same text helm prints after `Error: `, cut as the CLI backend cuts stderr.
        (_, Some(failure)) => Err(RenderError::Helm(helm_message(
            format!("Error: {}", failure.message).as_bytes(),
        ))),
        (None, None) => Err(RenderError::RendererDied(
            "the renderer answered with neither a manifest nor an error".into(),
        )),
    }
}

/// Starts a child with an empty environment and a private home, reads its hello and leaves a
/// supervisor task reading its answers.
async fn spawn(
    binary: &std::path::Path,
    home: &std::path::Path,
    limits: &RenderLimits,
    deaths: &Arc<AtomicU32>,
) -> Result<(Arc<Live>, String), RenderError> {
    let mut command = Command::new(binary);
    super::private_home(&mut command, home)
        .arg("--memory-limit")
        .arg(limits.memory_limit.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    super::address_space_limit(&mut command, limits.memory_limit);
    let mut child = command
        .spawn()
        .map_err(|e| RenderError::Spawn("the renderer", e))?;
    let stdin = child.stdin.take().expect("stdin is piped");
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let hello = tokio::time::timeout(HELLO_TIMEOUT, frame::read::<Hello, _>(&mut stdout, 4096));
    let version = match hello.await {
        Ok(Ok(Some(hello))) => hello.hello.helm,
        Ok(Ok(None)) => {
            let tail = tail(stderr).await;
            let status = child
                .wait()
                .await
                .map_err(|e| RenderError::Spawn("the renderer", e))?;
            return Err(RenderError::Version(format!(
                "the renderer exited before its hello ({status}): {tail}"
            )));
        }
        Ok(Err(e)) => return Err(RenderError::Version(format!("renderer hello: {e}"))),
        Err(_) => {
            return Err(RenderError::Version(format!(
                "the renderer did not say hello within {HELLO_TIMEOUT:?}"
            )));
        }
    };
    let pending = Arc::new(Mutex::new(Pending::default()));
    let (kill, killed) = mpsc::unbounded_channel();
    let live = Arc::new(Live {
        pid: child.id(),
        stdin: tokio::sync::Mutex::new(stdin),
        pending: pending.clone(),
        kill,
    });
    let supervisor = Supervisor {
        pending,
        max_frame: limits.max_output.saturating_mul(6) + 64 * 1024,
        deaths: deaths.clone(),
    };
    tokio::spawn(supervisor.run(child, stdout, stderr, killed));
    Ok((live, version))
}

/// Reads one child's answers and hands them to their renders; on its end, tells every render
/// still waiting why.
struct Supervisor {
    pending: Arc<Mutex<Pending>>,
    max_frame: usize,
    deaths: Arc<AtomicU32>,
}

impl Supervisor {
    async fn run(
        self,
        mut child: Child,
        mut stdout: ChildStdout,
        stderr: ChildStderr,
        mut killed: mpsc::UnboundedReceiver<Death>,
    ) {
        let stderr = tokio::spawn(tail(stderr));
        let cause = loop {
            tokio::select! {
                reason = killed.recv() => {
                    let _ = child.start_kill();
                    break reason.unwrap_or(Death::Killed(DROPPED));
                }
                frame = frame::read::<Response, _>(&mut stdout, self.max_frame) => match frame {
                    Ok(Some(response)) => self.deliver(response),
                    Ok(None) => break Death::Exited(String::new()),
                    Err(e) => {
                        let _ = child.start_kill();
                        break Death::Exited(format!("protocol: {e}"));
                    }
                },
            }
        };
        let status = child.wait().await;
        let said = stderr.await.unwrap_or_default();
        let death = classify(cause, status.ok(), &said);
        if !matches!(death, Death::Killed(_)) {
            self.deaths.fetch_add(1, Ordering::Relaxed);
        }
        let waiting = {
            let mut pending = lock(&self.pending);
            pending.closed = true;
            std::mem::take(&mut pending.waiting)
        };
        // The child serves every pass: its end is the process's news, not one pass's (its own
        // log target, outside the pipeline's; tests/logs.rs holds pipeline lines to a pass).
        if matches!(death, Death::Killed(DROPPED)) {
            tracing::info!(target: PROCESS_TARGET, in_flight = waiting.len(), "renderer stopped: the backend was dropped");
        } else {
            tracing::warn!(target: PROCESS_TARGET, ?death, in_flight = waiting.len(), "renderer stopped");
        }
        for (_, reply) in waiting {
            let _ = reply.send(Err(death.clone()));
        }
    }

    fn deliver(&self, response: Response) {
        let reply = lock(&self.pending).waiting.remove(&response.id);
        if let Some(reply) = reply {
            let _ = reply.send(Ok(response));
        }
    }
}

/// Why a child ended, from how its supervisor saw it end, its exit status and its last words.
fn classify(cause: Death, status: Option<ExitStatus>, stderr: &str) -> Death {
    if matches!(cause, Death::Killed(_)) {
        return cause;
    }
    // Go's runtime says "out of memory" when the address-space limit refuses it memory.
    if status.and_then(|s| s.code()) == Some(EXIT_MEMORY) || stderr.contains("out of memory") {
        return Death::Memory;
    }
    let status = status.map_or_else(|| "status unknown".to_owned(), |s| s.to_string());
    let mut what = format!("the renderer exited ({status})");
    let first = match &cause {
        Death::Exited(what) => what.as_str(),
        _ => "",
    };
    for part in [first, stderr.trim()] {
        if !part.is_empty() {
            what.push_str(": ");
            what.push_str(part);
        }
    }
    Death::Exited(what)
}

/// The last [`STDERR_TAIL`] bytes the child writes to stderr (all of it is read, so it never
/// blocks on a full pipe).
async fn tail(mut stderr: ChildStderr) -> String {
    let mut kept = Vec::new();
    let mut buffer = [0u8; 8192];
    while let Ok(n) = stderr.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buffer[..n]);
        if kept.len() > 2 * STDERR_TAIL {
            kept.drain(..kept.len() - STDERR_TAIL);
        }
    }
    let start = kept.len().saturating_sub(STDERR_TAIL);
    String::from_utf8_lossy(&kept[start..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(4), Duration::from_millis(800));
        assert_eq!(backoff(10), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn deaths_are_told_apart() {
        let exited = |code: i32| Some(ExitStatus::from_raw(code << 8));
        assert!(matches!(
            classify(Death::Exited(String::new()), exited(3), ""),
            Death::Memory
        ));
        assert!(matches!(
            classify(
                Death::Exited(String::new()),
                exited(2),
                "fatal error: runtime: out of memory"
            ),
            Death::Memory
        ));
        assert!(matches!(
            classify(Death::Killed("timeout"), exited(3), ""),
            Death::Killed("timeout")
        ));
        match classify(
            Death::Exited("protocol: x".into()),
            exited(2),
            "renderer: boom\n",
        ) {
            Death::Exited(what) => assert_eq!(
                what,
                "the renderer exited (exit status: 2): protocol: x: renderer: boom"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn answers_become_results() {
        let response = |manifest: Option<&str>, kind: Option<&str>| Response {
            id: 1,
            manifest: manifest.map(Into::into),
            error: kind.map(|kind| frame::Failure {
                kind: kind.into(),
                message: "template: x\n\nUse --debug flag to render out invalid YAML".into(),
            }),
        };
        assert_eq!(answer(response(Some("a: 1\n"), None), 9).unwrap(), "a: 1\n");
        assert!(matches!(
            answer(response(None, Some("outputTooLarge")), 9),
            Err(RenderError::OutputTooLarge(9))
        ));
        match answer(response(None, Some("helm")), 9) {
            Err(RenderError::Helm(message)) => assert_eq!(
                message,
                "template: x; Use --debug flag to render out invalid YAML"
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            answer(response(None, None), 9),
            Err(RenderError::RendererDied(_))
        ));
    }
}
