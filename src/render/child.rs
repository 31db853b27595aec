//! The renderer backend: one long-lived `renderer` child (Helm's engine, `renderer/` at the repo
//! root) serving many renders at once over its pipes; killed when a render times out, restarted
//! (with backoff) when it dies. A death is blamed on a render only when that render was alone
//! on the child: the renders in flight at any other death run again, one at a time.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock, mpsc, oneshot};

use super::frame::{self, Hello, Request, Response};
use super::process::helm_message_ends;
use super::request::{RenderError, RenderLimits, RenderRequest};

/// The renderer child as its backend sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RendererState {
    /// The running child's process id (`None` between a death and the next render).
    pub pid: Option<u32>,
    /// Renders sent to it and not answered yet.
    pub in_flight: usize,
    /// Children started so far (the first included): `module_manager_render_child_starts_total`.
    pub starts: u64,
    /// Renders sent again because their child died under them:
    /// `module_manager_render_child_resends_total`.
    pub retries: u64,
}

/// What a [`ChildRenderer`] counts, as exported (the render metrics' `child_…` counters).
pub(super) struct ChildCounters {
    /// Children started (the first included).
    pub(super) starts: Counter,
    /// Renders sent again because their child died under them.
    pub(super) retries: Counter,
}

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
/// How much of one stderr line is looked at (a longer line is cut there).
const STDERR_LINE: usize = 512;
/// Most bytes of a failure's text the renderer sends (`maxMessage` in `renderer/main.go`).
const MAX_MESSAGE: usize = 64 << 10;
/// Most times one render is sent to a child: every death under it but one it is blamed for
/// sends it again.
const MAX_SENDS: u32 = 4;

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
    /// The death in words, for a message.
    fn describe(&self) -> String {
        match self {
            Self::Killed(why) => (*why).to_owned(),
            Self::Memory => "it ran out of memory".to_owned(),
            Self::Exited(what) => what.clone(),
        }
    }
}

/// A child's death as one render in flight on it saw it.
#[derive(Clone, Debug)]
struct Stopped {
    death: Death,
    /// The renders in flight on the child when it died, this one included.
    in_flight: usize,
}

/// How a render runs on the child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Beside the other renders (the usual way).
    Shared,
    /// With no other render on the child: it was in flight at a death it could not be blamed
    /// for alone.
    Alone,
}

/// What a render does after its child died under it.
#[derive(Debug)]
enum AfterDeath {
    /// Sent again, in this mode.
    Again(Mode),
    /// Fails with this error.
    Fail(RenderError),
}

/// What a render whose child died under it does next (`sends`: how often it was sent). A death
/// is the render's own only when it was alone on the child: it ran [`Mode::Alone`], or no other
/// render was in flight. Then running out of memory fails it (`MemoryLimit`), and so does any
/// other end of the child when it ran alone (`RendererDied`, transient: something outside, the
/// kernel's OOM killer, may have ended it). A child we killed (another render timed out) sends
/// it again as it ran; every other death sends it again alone. An innocent render is never
/// failed with `MemoryLimit`: after [`MAX_SENDS`] it fails with `RendererDied`.
fn after_death(stopped: &Stopped, mode: Mode, sends: u32, memory_limit: u64) -> AfterDeath {
    let alone = mode == Mode::Alone || stopped.in_flight <= 1;
    match &stopped.death {
        Death::Memory if alone => AfterDeath::Fail(RenderError::MemoryLimit(memory_limit)),
        Death::Exited(what) if mode == Mode::Alone => {
            AfterDeath::Fail(RenderError::RendererDied(what.clone()))
        }
        _ if sends >= MAX_SENDS => AfterDeath::Fail(RenderError::RendererDied(format!(
            "the renderer stopped {sends} times during this render, last: {}",
            stopped.death.describe()
        ))),
        Death::Killed(_) => AfterDeath::Again(mode),
        Death::Memory | Death::Exited(_) => AfterDeath::Again(Mode::Alone),
    }
}

/// A render's turn on the child: shared with other renders, or alone.
enum Turn {
    Shared { _guard: OwnedRwLockReadGuard<()> },
    Alone { _guard: OwnedRwLockWriteGuard<()> },
}

/// What a render waits on: the child's answer or its death.
type Reply = oneshot::Sender<Result<Response, Stopped>>;

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
    /// Set when we stop it: no render is sent to it any more.
    stopping: AtomicBool,
}

impl Live {
    fn is_open(&self) -> bool {
        !self.stopping.load(Ordering::Relaxed) && !lock(&self.pending).closed
    }

    /// Stops the child: its renders in flight get `why`, the next render starts a new child.
    fn stop(&self, why: &'static str) {
        self.stopping.store(true, Ordering::Relaxed);
        let _ = self.kill.send(Death::Killed(why));
    }

    /// Sends one request frame and waits for its answer or the child's death.
    async fn call(&self, id: u64, request: &[u8]) -> Result<Response, Stopped> {
        let (reply, answer) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if pending.closed {
                let death = Death::Killed("the renderer stopped before the render was sent");
                return Err(Stopped {
                    death,
                    in_flight: 0,
                });
            }
            pending.waiting.insert(id, reply);
        }
        // Until its write starts the render is not on the child: given up on meanwhile, it
        // leaves nothing waiting there.
        let unsent = Unsent {
            pending: &self.pending,
            id: Some(id),
        };
        let mut stdin = self.stdin.lock().await;
        unsent.sent();
        // A write cut off (its render was given up on mid-write) leaves half a frame on the
        // pipe, and the next request would be read as its rest: the child must go.
        let mut cut_off = CutOff {
            live: self,
            armed: true,
        };
        // A failed write means the child is going; its supervisor answers with the reason.
        if stdin.write_all(request).await.is_ok() {
            let _ = stdin.flush().await;
        }
        cut_off.armed = false;
        drop(stdin);
        answer.await.unwrap_or_else(|_| {
            let death = Death::Killed("the renderer's supervisor stopped");
            Err(Stopped {
                death,
                in_flight: 0,
            })
        })
    }
}

/// Takes a render's id out of the child's waiting renders when dropped before its write began.
struct Unsent<'a> {
    pending: &'a Mutex<Pending>,
    id: Option<u64>,
}

impl Unsent<'_> {
    /// The write begins: the render is the child's now.
    fn sent(mut self) {
        self.id = None;
    }
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            lock(self.pending).waiting.remove(&id);
        }
    }
}

/// The log target of the child's own lifecycle (not one render's).
const PROCESS_TARGET: &str = "module_manager::process::renderer";
/// Why a child ends when its backend is dropped (the replica shuts down).
const DROPPED: &str = "the renderer backend was dropped";

/// Stops the child when dropped armed: a request frame was cut off mid-write.
struct CutOff<'a> {
    live: &'a Live,
    armed: bool,
}

impl Drop for CutOff<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.live.stop("a request to it was cut off mid-write");
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
    /// Held shared by each render on the child, exclusively by a render that must run alone.
    /// Fair: a render waiting to run alone goes before the renders that come after it.
    turns: Arc<RwLock<()>>,
    next_id: AtomicU64,
    /// Unexpected deaths (and failed starts) since the last answer: the restart backoff.
    deaths_in_a_row: Arc<AtomicU32>,
    counters: ChildCounters,
}

impl ChildRenderer {
    /// Starts the child (it must answer its hello); returns the backend and the helm version.
    /// Its starts and resends are counted in `counters`.
    pub(super) async fn start(
        binary: PathBuf,
        home: PathBuf,
        limits: RenderLimits,
        counters: ChildCounters,
    ) -> Result<(Self, String), RenderError> {
        let deaths_in_a_row = Arc::new(AtomicU32::new(0));
        let (live, version) = spawn(&binary, &home, &limits, &deaths_in_a_row).await?;
        counters.starts.inc();
        let backend = Self {
            binary,
            home,
            limits,
            current: tokio::sync::Mutex::new(Some(live)),
            turns: Arc::new(RwLock::new(())),
            next_id: AtomicU64::new(1),
            deaths_in_a_row,
            counters,
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
            starts: self.counters.starts.get(),
            retries: self.counters.retries.get(),
        }
    }

    /// Renders on the running child (starting one if needed). A render past the timeout kills
    /// the child, because Go cannot stop a template that is executing. A render whose child
    /// dies under it is sent again as [`after_death`] decides: a death is blamed on it only
    /// when it was alone on the child.
    pub(super) async fn render(&self, request: &RenderRequest) -> Result<String, RenderError> {
        let values = Value::Object(request.values.clone()).to_string();
        let mut mode = Mode::Shared;
        let mut sends = 0;
        loop {
            sends += 1;
            let stopped = match self.send(request, &values, mode).await? {
                Ok(response) => return answer(response, self.limits.max_output),
                Err(stopped) => stopped,
            };
            match after_death(&stopped, mode, sends, self.limits.memory_limit) {
                AfterDeath::Fail(error) => return Err(error),
                AfterDeath::Again(next) => {
                    tracing::info!(death = ?stopped.death, in_flight = stopped.in_flight, alone = next == Mode::Alone, release = %request.release, "renderer stopped during a render; sending it again");
                    self.counters.retries.inc();
                    mode = next;
                }
            }
        }
    }

    /// Sends the render once, in its turn, and waits for the answer, the child's death or the
    /// timeout.
    async fn send(
        &self,
        request: &RenderRequest,
        values: &str,
        mode: Mode,
    ) -> Result<Result<Response, Stopped>, RenderError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = frame::encode(&Request {
            id,
            chart: &request.chart.path.to_string_lossy(),
            release: &request.release,
            namespace: &request.namespace,
            values,
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
        let turn = self.turn(mode).await;
        let live = self.live().await?;
        let mut watchdog = Watchdog {
            live: live.clone(),
            id,
            deadline: tokio::time::Instant::now() + self.limits.timeout,
            turn: Some(turn),
        };
        let answered = tokio::time::timeout(self.limits.timeout, live.call(id, &frame)).await;
        if answered.is_err() {
            // Before the turn ends: a render waiting to run alone must not get this child.
            live.stop("another render on it timed out");
        }
        watchdog.turn = None;
        match answered {
            Err(_) => Err(RenderError::Timeout(self.limits.timeout)),
            Ok(Ok(response)) => {
                self.deaths_in_a_row.store(0, Ordering::Relaxed);
                Ok(Ok(response))
            }
            Ok(Err(stopped)) => Ok(Err(stopped)),
        }
    }

    /// Waits for the render's turn on the child: beside others, or alone once every render
    /// on it has ended.
    async fn turn(&self, mode: Mode) -> Turn {
        match mode {
            Mode::Shared => Turn::Shared {
                _guard: self.turns.clone().read_owned().await,
            },
            Mode::Alone => Turn::Alone {
                _guard: self.turns.clone().write_owned().await,
            },
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
        self.counters.starts.inc();
        tracing::info!(pid = ?live.pid, "renderer started");
        *current = Some(live.clone());
        Ok(live)
    }
}

/// Keeps a render's turn while the child still runs it after its caller gave up on it (its
/// pass was cancelled, e.g. the shard was lost), and stops the child if it still runs it at its
/// deadline: Go cannot stop the template, and with its caller gone nothing else would notice
/// that it hangs. So a render that must run alone never shares the child with it.
struct Watchdog {
    live: Arc<Live>,
    id: u64,
    deadline: tokio::time::Instant,
    /// Taken once the caller has its answer or its timeout (the timeout kills by itself).
    turn: Option<Turn>,
}

/// How often a watchdog looks whether the render it watches was answered.
const WATCHDOG_POLL: Duration = Duration::from_millis(50);

impl Drop for Watchdog {
    fn drop(&mut self) {
        let Some(turn) = self.turn.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (live, id, deadline) = (self.live.clone(), self.id, self.deadline);
        runtime.spawn(async move {
            let running = || lock(&live.pending).waiting.contains_key(&id);
            while running() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(WATCHDOG_POLL.min(deadline - tokio::time::Instant::now())).await;
            }
            if running() {
                live.stop("a render given up on ran past its timeout");
            }
            drop(turn);
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
        // The same text helm prints after `Error: `, cut as the CLI backend cuts stderr (the
        // renderer sends the ends of a text longer than its own cap).
        (_, Some(failure)) => Err(RenderError::Helm(helm_message_ends(
            format!("Error: {}", failure.message).as_bytes(),
            failure.omitted,
            failure.tail.as_bytes(),
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
    super::process::private_home(&mut command, home)
        .arg("--memory-limit")
        .arg(limits.memory_limit.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    super::process::address_space_limit(&mut command, limits.memory_limit);
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
            let said = last_words(stderr).await;
            let status = child
                .wait()
                .await
                .map_err(|e| RenderError::Spawn("the renderer", e))?;
            return Err(RenderError::Version(format!(
                "the renderer exited before its hello ({status}): {}",
                said.summary()
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
        stopping: AtomicBool::new(false),
    });
    // JSON escapes a control character into 6 bytes; a response holds the output or a failure.
    let max_body = limits.max_output.max(MAX_MESSAGE + 64);
    let supervisor = Supervisor {
        pending,
        max_frame: max_body.saturating_mul(6) + 64 * 1024,
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
        let stderr = tokio::spawn(last_words(stderr));
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
        let in_flight = waiting.len();
        // The child serves every pass: its end is the process's news, not one pass's (its own
        // log target, outside the pipeline's; tests/logs.rs holds pipeline lines to a pass).
        if matches!(death, Death::Killed(DROPPED)) {
            tracing::info!(target: PROCESS_TARGET, in_flight = waiting.len(), "renderer stopped: the backend was dropped");
        } else {
            tracing::warn!(target: PROCESS_TARGET, ?death, in_flight = waiting.len(), "renderer stopped");
        }
        for (_, reply) in waiting {
            let death = death.clone();
            let _ = reply.send(Err(Stopped { death, in_flight }));
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
fn classify(cause: Death, status: Option<ExitStatus>, said: &LastWords) -> Death {
    if matches!(cause, Death::Killed(_)) {
        return cause;
    }
    // Go's runtime says "out of memory" when the address-space limit refuses it memory.
    if status.and_then(|s| s.code()) == Some(EXIT_MEMORY) || said.out_of_memory {
        return Death::Memory;
    }
    let status = status.map_or_else(|| "status unknown".to_owned(), |s| s.to_string());
    let mut what = format!("the renderer exited ({status})");
    let first = match &cause {
        Death::Exited(what) => what.as_str(),
        _ => "",
    };
    for part in [first, said.summary().as_str()] {
        if !part.is_empty() {
            what.push_str(": ");
            what.push_str(part);
        }
    }
    Death::Exited(what)
}

/// What the child wrote to stderr, kept to explain its end. Read line by line as it streams, so
/// that a line that matters is found wherever it is: the Go runtime prints its out-of-memory
/// line first, then kilobytes of goroutine traces.
#[derive(Debug, Default)]
struct LastWords {
    /// The Go runtime said it ran out of memory (the address-space limit refused it memory).
    out_of_memory: bool,
    /// The first line saying why the child stops: `fatal error: …`, `panic: …`, `renderer: …`.
    first_fatal: Option<String>,
    /// The last bytes written (at least [`STDERR_TAIL`] once that many were written).
    tail: Vec<u8>,
    /// The line being read, at most [`STDERR_LINE`] bytes of it.
    line: Vec<u8>,
}

impl LastWords {
    /// Takes the next bytes the child wrote.
    fn read(&mut self, bytes: &[u8]) {
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > 2 * STDERR_TAIL {
            self.tail.drain(..self.tail.len() - STDERR_TAIL);
        }
        for &byte in bytes {
            if byte == b'\n' {
                self.end_line();
            } else if self.line.len() < STDERR_LINE {
                self.line.push(byte);
            }
        }
    }

    /// Looks at the line read so far, which has ended.
    fn end_line(&mut self) {
        let line = String::from_utf8_lossy(&self.line);
        let line = line.trim();
        let fatal = ["fatal error:", "panic:", "renderer:"]
            .iter()
            .any(|prefix| line.starts_with(prefix));
        if (fatal || line.starts_with("runtime:")) && line.contains("out of memory") {
            self.out_of_memory = true;
        }
        if fatal && self.first_fatal.is_none() {
            self.first_fatal = Some(line.to_owned());
        }
        self.line.clear();
    }

    /// What explains the end: the first fatal line, else the last [`STDERR_TAIL`] bytes.
    fn summary(&self) -> String {
        if let Some(fatal) = &self.first_fatal {
            return fatal.clone();
        }
        let start = self.tail.len().saturating_sub(STDERR_TAIL);
        String::from_utf8_lossy(&self.tail[start..])
            .trim()
            .to_owned()
    }
}

/// Reads all the child writes to stderr (so it never blocks on a full pipe) into its
/// [`LastWords`].
async fn last_words(mut stderr: ChildStderr) -> LastWords {
    let mut said = LastWords::default();
    let mut buffer = [0u8; 8192];
    while let Ok(n) = stderr.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        said.read(&buffer[..n]);
    }
    said.end_line();
    said
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::events::MESSAGE_LIMIT;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(4), Duration::from_millis(800));
        assert_eq!(backoff(10), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    /// Last words of a child that wrote `text`, read in chunks of `chunk` bytes.
    fn said(text: &str, chunk: usize) -> LastWords {
        let mut words = LastWords::default();
        for piece in text.as_bytes().chunks(chunk) {
            words.read(piece);
        }
        words.end_line();
        words
    }

    #[test]
    fn deaths_are_told_apart() {
        let exited = |code: i32| Some(ExitStatus::from_raw(code << 8));
        let nothing = LastWords::default();
        assert!(matches!(
            classify(Death::Exited(String::new()), exited(3), &nothing),
            Death::Memory
        ));
        assert!(matches!(
            classify(
                Death::Exited(String::new()),
                exited(2),
                &said("fatal error: runtime: out of memory\n", 7)
            ),
            Death::Memory
        ));
        assert!(matches!(
            classify(Death::Killed("timeout"), exited(3), &nothing),
            Death::Killed("timeout")
        ));
        match classify(
            Death::Exited("protocol: x".into()),
            exited(2),
            &said("renderer: boom\n", 100),
        ) {
            Death::Exited(what) => assert_eq!(
                what,
                "the renderer exited (exit status: 2): protocol: x: renderer: boom"
            ),
            other => panic!("{other:?}"),
        }
    }

    /// The runtime's out-of-memory line comes first, then a goroutine dump far longer than the
    /// tail kept: the death is still a memory death, and a crash is told by its first line.
    #[test]
    fn the_out_of_memory_line_is_found_before_a_long_goroutine_dump() {
        let dump = "goroutine 7 [running]:\ntext/template.(*state).walk(0xc000123456)\n\t/go/src/text/template/exec.go:264 +0x1a5\n".repeat(200);
        for first in [
            "runtime: out of memory: cannot allocate 10000007168-byte block (3997696 in use)\nfatal error: out of memory\n",
            "fatal error: runtime: out of memory\n",
        ] {
            let text = format!("{first}\nruntime stack:\n{dump}");
            assert!(text.len() > 4 * STDERR_TAIL);
            for chunk in [1, 5, 8192] {
                let words = said(&text, chunk);
                assert!(words.out_of_memory, "{first} in chunks of {chunk}");
                let death = classify(
                    Death::Exited(String::new()),
                    Some(ExitStatus::from_raw(2 << 8)),
                    &words,
                );
                assert!(matches!(death, Death::Memory), "{death:?}");
            }
        }
        let crash = said(&format!("panic: boom\n\n{dump}"), 100);
        assert!(!crash.out_of_memory);
        assert_eq!(crash.summary(), "panic: boom");
        // A line that only mentions memory is not the runtime's.
        assert!(!said("a template printed: out of memory\n", 100).out_of_memory);
        // Without a fatal line, the tail tells.
        let plain = said(&"x".repeat(3 * STDERR_TAIL), 1000);
        assert_eq!(plain.summary().len(), STDERR_TAIL);
    }

    /// Deaths are blamed on a render only when it was alone on the child; innocents are sent
    /// again (alone after a death nobody could be blamed for) and never fail `MemoryLimit`.
    #[test]
    fn a_death_is_blamed_only_on_a_render_that_was_alone() {
        let stopped = |death: Death, in_flight| Stopped { death, in_flight };
        let exited = || Death::Exited("the renderer exited (signal: 9)".into());
        let again = |next: AfterDeath| match next {
            AfterDeath::Again(mode) => Some(mode),
            AfterDeath::Fail(_) => None,
        };
        let after = |s: &Stopped, mode, sends| after_death(s, mode, sends, 64);
        // Several in flight: nobody is blamed, each runs again alone.
        let crowded = stopped(Death::Memory, 4);
        assert_eq!(again(after(&crowded, Mode::Shared, 1)), Some(Mode::Alone));
        assert_eq!(
            again(after(&stopped(exited(), 4), Mode::Shared, 1)),
            Some(Mode::Alone)
        );
        // Alone (ran alone, or nothing else was in flight): out of memory is its own.
        for (s, mode) in [
            (&crowded, Mode::Alone),
            (&stopped(Death::Memory, 1), Mode::Shared),
        ] {
            assert!(matches!(
                after(s, mode, 1),
                AfterDeath::Fail(RenderError::MemoryLimit(64))
            ));
        }
        // Another end while it ran alone: transient, it may be the kernel's doing.
        assert!(matches!(
            after(&stopped(exited(), 1), Mode::Alone, 2),
            AfterDeath::Fail(RenderError::RendererDied(m)) if m.contains("signal: 9")
        ));
        // ... but first it is sent again alone, the one render in flight or not.
        assert_eq!(
            again(after(&stopped(exited(), 1), Mode::Shared, 1)),
            Some(Mode::Alone)
        );
        // Killed for another render's timeout: again as it ran.
        let killed = stopped(Death::Killed("another render on it timed out"), 3);
        assert_eq!(again(after(&killed, Mode::Shared, 1)), Some(Mode::Shared));
        assert_eq!(again(after(&killed, Mode::Alone, 2)), Some(Mode::Alone));
        // Too many deaths under one render: transient, never blamed.
        for s in [&killed, &crowded] {
            assert!(matches!(
                after(s, Mode::Shared, MAX_SENDS),
                AfterDeath::Fail(RenderError::RendererDied(_))
            ));
        }
    }

    /// A render given up on while it waits for the child's stdin (another request is being
    /// written) leaves nothing waiting on the child: its watchdog would otherwise stop the
    /// child at its deadline though it never ran.
    #[tokio::test]
    async fn a_render_given_up_before_its_write_leaves_nothing_waiting() {
        // A child that never reads: its stdin pipe fills, and a large write blocks holding the lock.
        let mut child = Command::new("sleep")
            .arg("600")
            .stdin(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (kill, _killed) = mpsc::unbounded_channel();
        let live = Live {
            pid: child.id(),
            stdin: tokio::sync::Mutex::new(child.stdin.take().unwrap()),
            pending: Arc::default(),
            kill,
            stopping: AtomicBool::new(false),
        };
        let big = vec![0u8; 1 << 20];
        let writing = tokio::time::timeout(Duration::from_millis(300), live.call(1, &big));
        let queued = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            tokio::time::timeout(Duration::from_millis(100), live.call(2, b"x")).await
        };
        let (writing, queued) = tokio::join!(writing, queued);
        assert!(writing.is_err() && queued.is_err(), "both gave up");
        let waiting: Vec<u64> = lock(&live.pending).waiting.keys().copied().collect();
        assert_eq!(
            waiting,
            [1],
            "only the render cut off mid-write is on the child"
        );
    }

    #[test]
    fn answers_become_results() {
        let response = |manifest: Option<&str>, kind: Option<&str>| Response {
            id: 1,
            manifest: manifest.map(Into::into),
            error: kind.map(|kind| frame::Failure {
                kind: kind.into(),
                message: "template: x\n\nUse --debug flag to render out invalid YAML".into(),
                omitted: 0,
                tail: String::new(),
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
        // A text the renderer cut: both ends kept, the gap counted from the whole text.
        let cut = Response {
            id: 1,
            manifest: None,
            error: Some(frame::Failure {
                kind: "helm".into(),
                message: format!(
                    "execution error at (c/templates/x.yaml:1:3): {}",
                    "x".repeat(32_000)
                ),
                omitted: 17_000_000,
                tail: format!("{}the end", "y".repeat(32_000)),
            }),
        };
        match answer(cut, 9) {
            Err(RenderError::Helm(message)) => {
                assert!(message.len() <= MESSAGE_LIMIT, "{}", message.len());
                assert!(message.starts_with("execution error at (c/templates/x.yaml:1:3): x"));
                assert!(message.ends_with("ythe end"), "{message}");
                let count = message
                    .split_once(" … [")
                    .and_then(|(_, rest)| rest.split_once(" bytes omitted]"));
                let count: usize = count.unwrap().0.parse().unwrap();
                assert!((17_000_000..17_070_000).contains(&count), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
