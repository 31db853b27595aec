//! The admin API's HTTP server: a connection limit, and one per source address (so one client
//! cannot take the slots the kubelet's probes need), a deadline to read a request's header and
//! one for the whole exchange, one request per connection; each request carries its
//! connection's source address ([`Source`], for the limits of `reviews.rs`).
//!
//! `axum::serve` has neither bound: a client that opens connections and sends a header one
//! byte at a time (slowloris) would hold them, and the task and memory of each, for ever.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::Request;
use axum::http::request::Parts;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::Service;

/// The source address of a request's connection (`None`: a request not served by [`serve`],
/// e.g. a router test's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Source(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Source {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Self>().copied().unwrap_or_default())
    }
}

/// Bounds of the admin server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Most connections open at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Most connections open at once from one source address; further ones are closed at once.
    /// Below `max_connections`, so that one client (a pod flooding the port) leaves slots for
    /// others — the kubelet's probes come from the node's address.
    pub max_per_source: usize,
    /// Longest a client may take to send a request's header; then the connection is closed.
    pub header_read_timeout: Duration,
    /// Longest one connection (its one request, read, answered and written) may last.
    pub request_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_per_source: 16,
            header_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves `router` on `listener` within `limits` until the listener fails.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let sources = Arc::new(Mutex::new(HashMap::new()));
    loop {
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors, a connection reset before accept: not the listener's end.
            Err(e) if is_transient(&e) => {
                tracing::debug!("admin API: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let Some(source) = SourceSlot::take(&sources, peer.ip(), limits.max_per_source) else {
            tracing::debug!(source = %peer.ip(), "admin API: too many connections from one source; closed");
            drop(stream);
            continue;
        };
        let (router, ip) = (router.clone(), peer.ip());
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(Source(Some(ip)));
            router.clone().call(request)
        });
        tokio::spawn(async move {
            let _source = source;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            if tokio::time::timeout(limits.request_timeout, connection)
                .await
                .is_err()
            {
                tracing::debug!("admin API: a connection outlived the request timeout; closed");
            }
            drop(slot);
        });
    }
}

/// Connections open per source address.
type Sources = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One connection counted against its source address, until dropped.
struct SourceSlot {
    sources: Sources,
    ip: IpAddr,
}

impl SourceSlot {
    /// Counts a connection from `ip`, unless `ip` has `max` open already.
    fn take(sources: &Sources, ip: IpAddr, max: usize) -> Option<Self> {
        let mut open = sources.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= max.max(1) {
            return None;
        }
        *count += 1;
        Some(Self {
            sources: sources.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Accept errors that concern one connection or a passing shortage, not the listener.
fn is_transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::Interrupted
    ) || matches!(error.raw_os_error(), Some(23 | 24)) // ENFILE, EMFILE
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;
    use axum::routing::get;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(limits: ServeLimits) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let router = Router::new().route("/livez", get(|| async { "\"ok\"" }));
        tokio::spawn(serve(listener, router, limits));
        format!("http://{address}")
    }

    /// A connection that sends the start of a request header, then a byte every 100 ms, never
    /// finishing it; it ends when the server closes it.
    fn slowloris(url: &str) -> tokio::task::JoinHandle<()> {
        let address = url.trim_start_matches("http://").to_owned();
        tokio::spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
            let _ = stream
                .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
                .await;
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if stream.write_all(b"X").await.is_err() {
                    return;
                }
                let mut buffer = [0u8; 64];
                let closed =
                    tokio::time::timeout(Duration::from_millis(1), stream.read(&mut buffer)).await;
                if matches!(closed, Ok(Ok(0) | Err(_))) {
                    return;
                }
            }
        })
    }

    async fn livez(url: &str) -> anyhow::Result<String> {
        crate::cli::fetch::<String>(url, Method::GET, "/livez", None).await
    }

    /// Limits on connections only: header and request deadlines ten minutes away.
    fn connection_limits(max_connections: usize, max_per_source: usize) -> ServeLimits {
        ServeLimits {
            max_connections,
            max_per_source,
            header_read_timeout: Duration::from_secs(600),
            request_timeout: Duration::from_secs(600),
        }
    }

    /// A connection to the server at `url` that sends nothing.
    async fn idle_connection(url: &str) -> tokio::net::TcpStream {
        let address = url.trim_start_matches("http://");
        tokio::net::TcpStream::connect(address).await.unwrap()
    }

    /// Waits (120 s) until `GET /livez` is answered.
    async fn served_again(url: &str) {
        let started = Instant::now();
        while livez(url).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(120), "never served");
        }
    }

    /// Sends `request` on a new connection to `address` (a failed write is fine: the server may
    /// close first) and reads until the server closes (120 s): the read's result and the answer.
    async fn exchange(address: &str, request: &[u8]) -> (std::io::Result<usize>, Vec<u8>) {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let _ = stream.write_all(request).await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(120), stream.read_to_end(&mut answer))
            .await
            .expect("the server answered or closed");
        (read, answer)
    }

    /// Trickling connections that take every slot are closed at the header deadline, and the
    /// next caller is served. Without the header deadline they would hold the slots for ever
    /// (and this test would time out).
    #[tokio::test]
    async fn a_slowloris_connection_is_cut_and_others_are_served() {
        let url = start(ServeLimits {
            header_read_timeout: Duration::from_secs(1),
            ..connection_limits(2, 2)
        })
        .await;
        assert_eq!(livez(&url).await.unwrap(), "ok");
        let slow = [slowloris(&url), slowloris(&url)];
        let started = Instant::now();
        loop {
            if let Ok(answer) = livez(&url).await {
                assert_eq!(answer, "ok");
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "never served while slow connections were open"
            );
        }
        for connection in slow {
            tokio::time::timeout(Duration::from_secs(120), connection)
                .await
                .expect("the server closed the trickling connection")
                .unwrap();
        }
    }

    /// At the connection limit, a further caller waits (here: its client gives up) until a
    /// connection closes; then it is served.
    #[tokio::test]
    async fn connections_beyond_the_limit_wait_for_a_slot() {
        let url = start(connection_limits(1, 1)).await;
        let idle = idle_connection(&url).await;
        // The idle connection holds the only slot for ten minutes: the client's 10 s timeout
        // comes first.
        let refused = livez(&url).await.unwrap_err();
        assert!(
            format!("{refused:#}").contains("no answer within"),
            "{refused:#}"
        );
        drop(idle);
        served_again(&url).await;
    }

    /// One source at its limit gets further connections closed at once (no answer), while the
    /// server has slots left; once it closes one, it is served again.
    #[tokio::test]
    async fn one_source_cannot_take_every_slot() {
        let url = start(connection_limits(8, 1)).await;
        let address = url.trim_start_matches("http://").to_owned();
        let idle = idle_connection(&url).await;
        // Wait until the idle connection is accepted and counted: then a second is closed.
        let started = Instant::now();
        loop {
            let (read, answer) =
                exchange(&address, b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n").await;
            if read.is_err() || answer.is_empty() {
                break; // closed without an answer
            }
            // Answered: the idle connection was not counted yet.
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "a second connection from the same source was always served"
            );
        }
        drop(idle);
        served_again(&url).await;
    }

    /// A request line or header far over hyper's buffer (about 400 KiB) is answered with an
    /// error status or closed, never read whole; the next caller is served.
    #[tokio::test]
    async fn oversized_request_lines_and_headers_are_refused_and_others_are_served() {
        let url = start(ServeLimits::default()).await;
        let address = url.trim_start_matches("http://").to_owned();
        let huge = "a".repeat(4 << 20);
        for request in [
            format!("GET /livez?{huge} HTTP/1.1\r\nHost: x\r\n\r\n"),
            format!("GET /livez HTTP/1.1\r\nHost: x\r\nX-Pad: {huge}\r\n\r\n"),
            format!(
                "GET /livez HTTP/1.1\r\nHost: x\r\n{}\r\n",
                "X-Many: a\r\n".repeat(10_000)
            ),
        ] {
            // The server may close before it has read everything: a failed write is an answer.
            let (_, answer) = exchange(&address, request.as_bytes()).await;
            let head = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
            assert!(
                head.is_empty() || head.starts_with("HTTP/1.1 4"),
                "{}: {head}",
                &request[..40]
            );
        }
        assert_eq!(livez(&url).await.unwrap(), "ok");
    }
}
