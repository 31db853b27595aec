//! The `helm` CLI backend: one `helm template` process per render (the reference the renderer
//! backend is tested against, and still selectable with `--render-backend helm`).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use super::process::helm_message_ends;
use super::request::{FIXED_FLAGS, RenderError, RenderLimits, RenderRequest};

/// Runs the pinned helm binary once per render.
pub(super) struct Cli {
    helm: PathBuf,
    home: PathBuf,
}

impl Cli {
    /// Checks the binary (`helm version --short`); returns the backend and helm's version.
    pub(super) async fn start(helm: PathBuf, home: PathBuf) -> Result<(Self, String), RenderError> {
        let output = isolated(Command::new(&helm), &home)
            .args(["version", "--short"])
            .output()
            .await
            .map_err(|e| RenderError::Spawn("helm", e))?;
        let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if !output.status.success() || !version.starts_with('v') {
            return Err(RenderError::Version(format!(
                "{version} {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok((Self { helm, home }, version))
    }

    /// `helm template` of one request, bounded by `limits`: the manifest as helm printed it.
    pub(super) async fn render(
        &self,
        request: &RenderRequest,
        limits: &RenderLimits,
    ) -> Result<String, RenderError> {
        let mut command = self.template_command(request);
        // The same bounds as the renderer child's: a soft heap goal, a hard address space.
        command.env("GOMEMLIMIT", limits.memory_limit.to_string());
        super::process::address_space_limit(&mut command, limits.memory_limit);
        let child = command.spawn().map_err(|e| RenderError::Spawn("helm", e))?;
        let values = Value::Object(request.values.clone()).to_string();
        let run = exchange(child, values, limits.max_output);
        let (status, out, err) = match tokio::time::timeout(limits.timeout, run).await {
            Err(_) => return Err(RenderError::Timeout(limits.timeout)),
            Ok(result) => result?,
        };
        if !status.success() {
            return Err(if out_of_memory(&err.head) || out_of_memory(&err.tail) {
                RenderError::MemoryLimit(limits.memory_limit)
            } else {
                RenderError::Helm(helm_message_ends(&err.head, err.omitted, &err.tail))
            });
        }
        String::from_utf8(out).map_err(|_| RenderError::Helm("output is not UTF-8".into()))
    }

    /// `helm template` of a request, its values to come on stdin, every pipe captured.
    fn template_command(&self, request: &RenderRequest) -> Command {
        let mut command = isolated(Command::new(&self.helm), &self.home);
        command
            .arg("template")
            .args([
                "--namespace",
                &request.namespace,
                "--kube-version",
                &request.kube_version,
            ])
            .args(FIXED_FLAGS);
        for api_version in request.api_versions.iter() {
            command.args(["--api-versions", api_version]);
        }
        if request.is_upgrade {
            command.arg("--is-upgrade");
        }
        // `--` ends the flags: a release name like `-f/etc/passwd` or `--output-dir=/x` is an
        // argument (which helm then rejects as a name), never a flag.
        command
            .arg("--")
            .arg(&request.release)
            .arg(&request.chart.path);
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }
}

/// Whether helm's stderr is the Go runtime's report of an allocation the address-space limit
/// refused (`fatal error: runtime: out of memory`, or `cannot allocate memory`).
fn out_of_memory(stderr: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stderr);
    text.contains("runtime: out of memory") || text.contains("cannot allocate memory")
}

/// Writes `values` to a helm child and reads its output (at most `max_output` bytes) and the
/// ends of its stderr, then waits for it: its exit status, stdout and stderr.
async fn exchange(
    mut child: Child,
    values: String,
    max_output: usize,
) -> Result<(ExitStatus, Vec<u8>, Ends), RenderError> {
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let mut out = Vec::new();
    let mut err = Ends::default();
    // Values are JSON, which is YAML. Writing and both reads run together, so neither a
    // large input nor a large output can deadlock on a full pipe; an oversized output
    // ends the wait at once (the child is killed on drop).
    let write = async move {
        let _ = stdin.write_all(values.as_bytes()).await;
        Ok(())
    };
    let read_out = async {
        let mut limited = (&mut stdout).take(max_output as u64 + 1);
        limited
            .read_to_end(&mut out)
            .await
            .map_err(|e| RenderError::Spawn("helm", e))?;
        if out.len() > max_output {
            return Err(RenderError::OutputTooLarge(max_output));
        }
        Ok(())
    };
    let read_err = async {
        // Keep its first and last 32 KiB (the error comes first, its innermost cause last);
        // read all of it, so a chatty helm cannot block on a full stderr pipe (which would
        // look like a timeout).
        let mut buffer = [0u8; 8192];
        while let Ok(n) = stderr.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            err.push(&buffer[..n], STDERR_END);
        }
        Ok(())
    };
    tokio::try_join!(write, read_out, read_err)?;
    let status = child
        .wait()
        .await
        .map_err(|e| RenderError::Spawn("helm", e))?;
    Ok((status, out, err))
}

/// How much of each end of helm's stderr is kept.
const STDERR_END: usize = 32 * 1024;

/// The ends of a stream read in chunks: its first bytes, how many were dropped after them,
/// and its last bytes.
#[derive(Debug, Default, PartialEq)]
struct Ends {
    head: Vec<u8>,
    omitted: usize,
    tail: Vec<u8>,
}

impl Ends {
    /// Takes the next chunk, keeping at most `keep` bytes at each end.
    fn push(&mut self, mut chunk: &[u8], keep: usize) {
        let room = keep.saturating_sub(self.head.len()).min(chunk.len());
        self.head.extend_from_slice(&chunk[..room]);
        chunk = &chunk[room..];
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > keep {
            let drop = self.tail.len() - keep;
            self.tail.drain(..drop);
            self.omitted += drop;
        }
    }
}

/// A helm command with a private home, no inherited environment, and no way out to the network
/// (a chart that needs to fetch dependencies fails instead of reaching out).
fn isolated(mut command: Command, home: &Path) -> Command {
    super::process::private_home(&mut command, home)
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("NO_PROXY", "");
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_stream_keeps_both_ends_and_counts_the_middle() {
        let stream: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut ends = Ends::default();
        for chunk in stream.chunks(8192) {
            ends.push(chunk, 1000);
        }
        assert_eq!(ends.head, stream[..1000]);
        assert_eq!(ends.tail, stream[stream.len() - 1000..]);
        assert_eq!(ends.omitted, 98_000);
    }

    #[test]
    fn a_short_stream_is_kept_whole() {
        let mut ends = Ends::default();
        ends.push(b"Error: a", 8);
        ends.push(b"bc", 8);
        assert_eq!(
            ends,
            Ends {
                head: b"Error: a".to_vec(),
                omitted: 0,
                tail: b"bc".to_vec()
            }
        );
    }

    #[test]
    fn the_go_runtimes_out_of_memory_report_is_recognised() {
        assert!(out_of_memory(
            b"fatal error: runtime: out of memory\n\ngoroutine 1 [running]:\n"
        ));
        assert!(out_of_memory(b"runtime: mmap: cannot allocate memory\n"));
        assert!(!out_of_memory(b"Error: template: x: out of range\n"));
    }
}
