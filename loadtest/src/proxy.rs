//! The TCP proxy that turns a few API servers into many clusters: every simulated target gets an
//! endpoint of its own — a loopback address of 127.1.0.0/16 ([`target_address`]) with a port the
//! kernel picked — forwarded to the API server that holds the target's namespace. The proxy
//! works on TCP, below TLS: every connection to a target is its own TLS session with the API
//! server, as it would be with a real cluster. Per target it can add latency (half of the
//! round trip to each direction, and one more round trip before a new connection's first bytes
//! go upstream: the TCP handshake a real remote cluster costs, which the kernel here answers at
//! once) and blackhole it (connections are accepted, and everything
//! sent either way is swallowed: no answer, no reset, like a cluster behind a dropped route).
//! When the blackhole ends, every connection of the target still open is reset (RST both
//! ways): each lived through the partition, open before it or accepted during it, and lost
//! bytes there, as a real connection across a partition ends (a retransmission or keepalive
//! timeout on one side, a reset from the other when packets pass again). New connections after
//! it go through. It counts connections per target (opened ever, open now).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The loopback address of target `index` (up to 65,536 targets): 127.1.x.y.
pub fn target_address(index: usize) -> anyhow::Result<Ipv4Addr> {
    anyhow::ensure!(index < 1 << 16, "at most 65,536 targets (127.1.0.0/16)");
    Ok(Ipv4Addr::new(127, 1, (index >> 8) as u8, index as u8))
}

/// One target's endpoint and its counters.
struct Endpoint {
    upstream: SocketAddr,
    blackholed: AtomicBool,
    /// Bumped when a blackhole ends: every connection open then is reset.
    heals: watch::Sender<u64>,
    /// The delay of each direction, microseconds (half the round trip).
    one_way_micros: AtomicU64,
    opened: AtomicU64,
    open: AtomicU64,
}

/// The running proxy; dropping it stops accepting (connections already open end with their
/// peers).
pub struct Proxy {
    endpoints: Arc<Vec<Endpoint>>,
    listeners: Vec<tokio::task::JoinHandle<()>>,
    /// Where each target listens.
    pub addresses: Vec<SocketAddr>,
}

impl Endpoint {
    fn one_way(&self) -> Duration {
        Duration::from_micros(self.one_way_micros.load(Ordering::SeqCst))
    }
}

/// Bytes read at a time from either side.
const CHUNK: usize = 64 * 1024;
/// Chunks in flight per direction while latency delays them (back-pressure beyond).
const IN_FLIGHT_CHUNKS: usize = 256;

impl Proxy {
    /// Listens for every target (`upstreams[i]`: the API server of target `i`), each direction
    /// of every connection delayed by `round_trip / 2`.
    pub async fn start(upstreams: &[SocketAddr], round_trip: Duration) -> anyhow::Result<Self> {
        let endpoints: Arc<Vec<Endpoint>> = Arc::new(
            upstreams
                .iter()
                .map(|&upstream| Endpoint {
                    upstream,
                    blackholed: AtomicBool::new(false),
                    heals: watch::Sender::new(0),
                    one_way_micros: AtomicU64::new((round_trip / 2).as_micros() as u64),
                    opened: AtomicU64::new(0),
                    open: AtomicU64::new(0),
                })
                .collect(),
        );
        let mut addresses = Vec::with_capacity(upstreams.len());
        let mut listeners = Vec::with_capacity(upstreams.len());
        for index in 0..upstreams.len() {
            let address = SocketAddr::from((target_address(index)?, 0));
            let listener = TcpListener::bind(address)
                .await
                .with_context(|| format!("listen on {address} for target {index}"))?;
            addresses.push(listener.local_addr()?);
            let endpoints = endpoints.clone();
            listeners.push(tokio::spawn(async move {
                accept(listener, endpoints, index).await;
            }));
        }
        Ok(Self {
            endpoints,
            listeners,
            addresses,
        })
    }

    /// Blackholes target `index`: its open connections and new ones swallow everything from
    /// then on. Ending it resets every connection of the target still open (each lost bytes).
    pub fn blackhole(&self, index: usize, on: bool) {
        if let Some(endpoint) = self.endpoints.get(index) {
            let was = endpoint.blackholed.swap(on, Ordering::SeqCst);
            if was && !on {
                // After the flag: a connection that subscribes later sees it off.
                endpoint.heals.send_modify(|n| *n += 1);
            }
        }
    }

    /// Sets target `index`'s added round trip from now on (chunks already delayed keep
    /// their schedule).
    pub fn set_round_trip(&self, index: usize, round_trip: Duration) {
        if let Some(endpoint) = self.endpoints.get(index) {
            let micros = (round_trip / 2).as_micros() as u64;
            endpoint.one_way_micros.store(micros, Ordering::SeqCst);
        }
    }

    /// Connections opened to each target so far.
    pub fn opened(&self) -> Vec<u64> {
        self.endpoints
            .iter()
            .map(|e| e.opened.load(Ordering::Relaxed))
            .collect()
    }

    /// Connections open to each target now.
    pub fn open(&self) -> Vec<u64> {
        self.endpoints
            .iter()
            .map(|e| e.open.load(Ordering::Relaxed))
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for listener in &self.listeners {
            listener.abort();
        }
    }
}

async fn accept(listener: TcpListener, endpoints: Arc<Vec<Endpoint>>, index: usize) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors or the like: try again shortly rather than spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let endpoint = &endpoints[index];
            endpoint.opened.fetch_add(1, Ordering::Relaxed);
            endpoint.open.fetch_add(1, Ordering::Relaxed);
            let handshake = Instant::now() + endpoint.one_way() * 2;
            // Before the first look at the flag: a heal after it reaches this connection.
            let mut heals = endpoint.heals.subscribe();
            let mut client = client;
            let _ = client.set_nodelay(true);
            let mut upstream = if endpoint.blackholed.load(Ordering::SeqCst) {
                None
            } else {
                TcpStream::connect(endpoint.upstream).await.ok()
            };
            let healed = tokio::select! {
                () = forward(&mut client, upstream.as_mut(), endpoint, handshake) => false,
                _ = heals.changed() => true,
            };
            if healed {
                // It lived through a partition: reset (RST) both sides rather than close.
                let _ = client.set_zero_linger();
                if let Some(upstream) = &upstream {
                    let _ = upstream.set_zero_linger();
                }
            }
            drop((client, upstream));
            endpoint.open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Forwards one connection until both directions ended; nothing goes upstream before
/// `handshake` (its TCP handshake's round trip after the accept). Without an upstream
/// (blackholed at the accept, or the API server is gone) swallows until the peer leaves.
async fn forward(
    client: &mut TcpStream,
    upstream: Option<&mut TcpStream>,
    endpoint: &Endpoint,
    handshake: Instant,
) {
    let Some(upstream) = upstream else {
        let mut buffer = vec![0; CHUNK];
        while matches!(client.read(&mut buffer).await, Ok(n) if n > 0) {}
        return;
    };
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.split();
    let (upstream_read, upstream_write) = upstream.split();
    tokio::join!(
        pipe(client_read, upstream_write, handshake, endpoint),
        pipe(upstream_read, client_write, Instant::now(), endpoint),
    );
}

/// One direction: what is read is written the endpoint's one-way delay after it was read (or
/// after `not_before`, if later), in order; while the endpoint is blackholed it is dropped
/// instead. At the reader's end the writer is shut down (a half close).
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    not_before: Instant,
    endpoint: &Endpoint,
) {
    let blackholed = &endpoint.blackholed;
    let (send, mut receive) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT_CHUNKS);
    let read = async move {
        let mut buffer = vec![0; CHUNK];
        loop {
            let n = match from.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if blackholed.load(Ordering::SeqCst) {
                continue;
            }
            let due = Instant::now().max(not_before) + endpoint.one_way();
            if send.send((due, buffer[..n].to_vec())).await.is_err() {
                break;
            }
        }
    };
    let write = async move {
        while let Some((due, bytes)) = receive.recv().await {
            tokio::time::sleep_until(due).await;
            if blackholed.load(Ordering::SeqCst) {
                continue;
            }
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_get_addresses_of_their_own_in_127_1() {
        assert_eq!(target_address(0).unwrap(), Ipv4Addr::new(127, 1, 0, 0));
        assert_eq!(target_address(257).unwrap(), Ipv4Addr::new(127, 1, 1, 1));
        assert_eq!(
            target_address(65_535).unwrap(),
            Ipv4Addr::new(127, 1, 255, 255)
        );
        assert!(target_address(65_536).is_err());
    }

    /// An echo server behind the proxy: bytes come back through it, a blackholed target
    /// answers nothing, connections that lived through a blackhole are reset at its end, and
    /// connections are counted per target.
    #[tokio::test]
    async fn forwards_counts_and_blackholes() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let proxy = Proxy::start(&[upstream, upstream], Duration::ZERO)
            .await
            .unwrap();
        assert_ne!(proxy.addresses[0].ip(), proxy.addresses[1].ip());

        let mut first = TcpStream::connect(proxy.addresses[0]).await.unwrap();
        first.write_all(b"ping").await.unwrap();
        let mut answer = [0; 4];
        first.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"ping");
        assert_eq!(proxy.opened(), vec![1, 0]);
        assert_eq!(proxy.open(), vec![1, 0]);

        proxy.blackhole(1, true);
        let mut second = TcpStream::connect(proxy.addresses[1]).await.unwrap();
        second.write_all(b"ping").await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(300), second.read(&mut answer));
        assert!(silent.await.is_err(), "a blackholed target answered");
        assert_eq!(proxy.opened(), vec![1, 1]);

        // Blackholing an open connection silences it too.
        proxy.blackhole(0, true);
        first.write_all(b"pong").await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(300), first.read(&mut answer));
        assert!(
            silent.await.is_err(),
            "a connection blackholed while open answered"
        );

        // The end of the blackhole resets both: the one open before it (its "pong" was
        // swallowed) and the one accepted during it; neither hangs.
        proxy.blackhole(0, false);
        proxy.blackhole(1, false);
        for (which, stream) in [
            ("open before", &mut first),
            ("accepted during", &mut second),
        ] {
            let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut answer));
            match read.await {
                Ok(Err(e)) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{which}"),
                other => panic!("the connection {which} the partition was not reset: {other:?}"),
            }
        }
        // New connections go through again.
        let mut third = TcpStream::connect(proxy.addresses[0]).await.unwrap();
        third.write_all(b"ping").await.unwrap();
        third.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"ping");
    }

    /// With a round trip set, a request's answer comes two round trips after the connect: one
    /// for the TCP handshake (which the kernel answers at once here, so the proxy holds the
    /// first bytes for it), one for the request itself. Paused time: the figure is the proxy's
    /// schedule, not the machine's speed.
    #[tokio::test(start_paused = true)]
    async fn a_new_connection_pays_its_handshake_round_trip() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = echo.accept().await.unwrap();
            let (mut r, mut w) = stream.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
        });
        let round_trip = Duration::from_millis(100);
        let proxy = Proxy::start(&[upstream], round_trip).await.unwrap();
        let started = Instant::now();
        let mut stream = TcpStream::connect(proxy.addresses[0]).await.unwrap();
        let mut answer = [0; 4];
        stream.write_all(b"ping").await.unwrap();
        stream.read_exact(&mut answer).await.unwrap();
        let first = started.elapsed();
        assert!(first >= round_trip * 2, "first answer after {first:?}");
        // Later requests on the open connection pay one round trip.
        let again = Instant::now();
        stream.write_all(b"pong").await.unwrap();
        stream.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"pong");
        let second = again.elapsed();
        assert!(
            second >= round_trip && second < round_trip * 2,
            "second answer after {second:?}"
        );
    }
}
