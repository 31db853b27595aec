//! Child processes of a control plane: started tied to this process or detached, stopped by PID.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::Error;

/// How a child's life is bound to ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// The kernel kills the child (SIGKILL) when this process exits, however it exits
    /// (normal exit, panic, `kill -9`): tests can never leave orphans.
    TiedToThisProcess,
    /// The child runs in its own process group and outlives this process (`testenv up`);
    /// `testenv down` stops it by PID.
    Detached,
}

/// A running child whose output goes to a log file.
pub struct Proc {
    name: &'static str,
    child: Option<Child>,
    pid: u32,
    log: PathBuf,
}

impl Proc {
    /// Starts `command`, sending stdout and stderr to `log` (a new file).
    pub fn spawn(
        name: &'static str,
        command: Command,
        log: &Path,
        lifetime: Lifetime,
    ) -> Result<Self, Error> {
        let out =
            File::create(log).map_err(|e| Error::io(format!("create {}", log.display()), e))?;
        Self::spawn_to(name, command, (out, log), lifetime)
    }

    /// [`Proc::spawn`] appending to `log`: a process started again keeps its predecessor's
    /// lines.
    pub fn spawn_appending(
        name: &'static str,
        command: Command,
        log: &Path,
        lifetime: Lifetime,
    ) -> Result<Self, Error> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| Error::io(format!("open {}", log.display()), e))?;
        Self::spawn_to(name, command, (out, log), lifetime)
    }

    fn spawn_to(
        name: &'static str,
        mut command: Command,
        (out, log): (File, &Path),
        lifetime: Lifetime,
    ) -> Result<Self, Error> {
        let err = out.try_clone().map_err(|e| Error::io("dup log file", e))?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = match lifetime {
            Lifetime::Detached => {
                command.process_group(0);
                command.spawn()
            }
            Lifetime::TiedToThisProcess => spawn_tied(command),
        }
        .map_err(|e| Error::io(format!("start {name}"), e))?;
        Ok(Self {
            name,
            pid: child.id(),
            child: Some(child),
            log: log.to_owned(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The program's name, for messages.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Fails with the end of the log when the process has already exited.
    pub fn check_running(&mut self) -> Result<(), Error> {
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            return Err(Error::Exited {
                name: self.name,
                status: status.to_string(),
                log_tail: log_tail(&self.log),
            });
        }
        Ok(())
    }

    /// The last lines of the process's log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; reaps the child.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            stop_pid(self.pid, grace);
            let _ = child.wait();
        }
    }

    /// Takes the child out, the process still running: it counts as stopped from now on, and
    /// the caller stops and reaps it (outside any lock the `Proc` is behind).
    pub fn take_child(&mut self) -> Option<std::process::Child> {
        self.child.take()
    }

    /// Whether the process was stopped by [`Proc::stop`] or taken out ([`Proc::take_child`]).
    pub fn is_stopped(&self) -> bool {
        self.child.is_none()
    }

    /// Forgets the child without stopping it (it keeps running detached).
    pub fn leak(mut self) -> u32 {
        self.child.take();
        self.pid
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// SIGTERM `pid`, wait up to `grace` for it to go, then SIGKILL. Returns whether it was running.
pub fn stop_pid(pid: u32, grace: Duration) -> bool {
    terminate_pid(pid, grace).is_some()
}

/// SIGTERM, up to `grace` for the process to exit, then SIGKILL; `None` when it could not be
/// signalled (gone already), else whether SIGKILL was needed. Blocks up to `grace`.
pub fn terminate_pid(pid: u32, grace: Duration) -> Option<bool> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: kill(2) with a positive pid and a valid signal has no memory effects.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        return None;
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !pid_alive(pid) {
            return Some(false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    Some(true)
}

/// Sends `signal` (`libc::SIGSTOP`, `libc::SIGCONT`, …) to `pid`.
pub fn signal_pid(pid: u32, signal: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: kill(2) with a positive pid and a valid signal has no memory effects.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A process frozen with SIGSTOP; [`Paused::resume`] or dropping it sends SIGCONT, so that a
/// failing test does not leave it frozen.
#[derive(Debug)]
pub struct Paused {
    name: String,
    pid: u32,
    resumed: bool,
}

impl Paused {
    /// Freezes `pid` (named `name` in errors).
    pub fn pause(name: &str, pid: u32) -> Result<Self, Error> {
        signal_pid(pid, libc::SIGSTOP).map_err(|e| Error::io(format!("pause {name}"), e))?;
        Ok(Self {
            name: name.to_owned(),
            pid,
            resumed: false,
        })
    }

    /// Lets the process run on.
    pub fn resume(mut self) -> Result<(), Error> {
        self.resumed = true;
        signal_pid(self.pid, libc::SIGCONT)
            .map_err(|e| Error::io(format!("resume {}", self.name), e))
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if !self.resumed {
            let _ = signal_pid(self.pid, libc::SIGCONT);
        }
    }
}

/// Whether `pid` is a live (non-zombie) process.
fn pid_alive(pid: libc::pid_t) -> bool {
    // Our own children linger as zombies until reaped; /proc tells zombies apart.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Whether `pid` is alive and runs a program whose path ends with `program`
/// (guards `testenv down` against a PID reused by another process).
pub fn pid_runs(pid: u32, program: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|cmdline| {
            cmdline
                .split(|b| *b == 0)
                .next()
                .map(|argv0| argv0.ends_with(program.as_bytes()))
        })
        .unwrap_or(false)
        && pid_alive(pid as libc::pid_t)
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `command` so that it gets SIGKILL when this process exits.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, so every tied child is
/// forked by one spawner thread that lives as long as the process: a test thread that started the
/// shared control plane may end long before the other tests are done with it.
fn spawn_tied(command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let parent = std::process::id();
                    // SAFETY: the closure only calls async-signal-safe functions (prctl, getppid, _exit).
                    unsafe {
                        command.pre_exec(move || {
                            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                            // The parent may have died between fork and prctl.
                            if libc::getppid() as u32 != parent {
                                libc::_exit(1);
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("start the testenv spawner thread");
        tx
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .send((command, reply_tx))
        .map_err(|_| std::io::Error::other("testenv spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("testenv spawner thread is gone"))?
}
