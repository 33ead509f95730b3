//! A small TCP proxy that delays, black-holes or loses replies, for fault-injection tests.
//!
//! `tc netem` does not exist on these machines, so network faults between one client and its
//! server come from here: the client connects to the proxy's loopback port, and the test
//! switches the proxy's [`LinkMode`] while it runs. The byte stream of a connection is never
//! corrupted (TCP does not drop bytes inside a stream); a fault that loses bytes ends the
//! connection, as a real network does once the peers notice.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does with the traffic of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkMode {
    /// Forwards both ways.
    Pass,
    /// Forwards requests at once and every reply `Duration` after it arrived (order is kept).
    DelayReplies(Duration),
    /// A partition: nothing goes through either way. When the link leaves this mode, every
    /// connection is reset (their streams lost bytes).
    Blackhole,
    /// Requests reach the server, but the first reply of a connection is thrown away and the
    /// connection reset: the client cannot know whether its request took effect.
    LoseReplies,
}

#[derive(Debug)]
struct ProxyState {
    mode: Mutex<LinkMode>,
    /// Bumped to reset every open connection.
    resets: watch::Sender<u64>,
    /// Connections being relayed now.
    open: std::sync::atomic::AtomicUsize,
}

impl ProxyState {
    fn mode(&self) -> LinkMode {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A proxy in front of one upstream address, on a free loopback port. Stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<ProxyState>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on the current tokio runtime.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into(), upstream).await
    }

    /// Starts a proxy to `upstream` listening on `ip` (a free port), for clients in another
    /// network namespace that reach this host at `ip`.
    pub async fn start_on(ip: std::net::IpAddr, upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(ProxyState {
            mode: Mutex::new(LinkMode::Pass),
            resets: watch::channel(0).0,
            open: std::sync::atomic::AtomicUsize::new(0),
        });
        let task = tokio::spawn(accept(listener, upstream, shared.clone()));
        Ok(FaultProxy { addr, shared, task })
    }

    /// The proxy's port, to give the client instead of the server's.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The current mode.
    pub fn mode(&self) -> LinkMode {
        self.shared.mode()
    }

    /// Switches the mode. Leaving [`LinkMode::Blackhole`] resets every connection.
    pub fn set(&self, mode: LinkMode) {
        let before = {
            let mut m = self
                .shared
                .mode
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            std::mem::replace(&mut *m, mode)
        };
        if before == LinkMode::Blackhole && mode != LinkMode::Blackhole {
            self.reset();
        }
    }

    /// How many client connections it relays now (a client that leaks connections shows here).
    pub fn connections(&self) -> usize {
        self.shared.open.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Closes every open connection now (the clients see a reset and reconnect).
    pub fn reset(&self) {
        self.shared.resets.send_modify(|n| *n += 1);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.reset();
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, shared: Arc<ProxyState>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors or the like: wait a little rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            // A client that connects during a partition never reaches the server.
            if shared.mode() == LinkMode::Blackhole {
                let mut resets = shared.resets.subscribe();
                let _ = resets.changed().await;
                return;
            }
            if let Ok(server) = TcpStream::connect(upstream).await {
                relay(client, server, shared).await;
            }
        });
    }
}

/// Counts a relayed connection until it ends.
struct OpenGuard(Arc<ProxyState>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Carries one connection until either side closes it, a reset, or a lost reply.
async fn relay(client: TcpStream, server: TcpStream, shared: Arc<ProxyState>) {
    shared
        .open
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let _open = OpenGuard(shared.clone());
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut resets = shared.resets.subscribe();
    let (mut c_read, mut c_write) = client.into_split();
    let (mut s_read, mut s_write) = server.into_split();
    let requests = {
        let shared = shared.clone();
        async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match c_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if shared.mode() == LinkMode::Blackhole {
                    continue;
                }
                if s_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    // Replies go through a queue, so a delay holds each one for its own time and keeps order.
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let replies_in = {
        let shared = shared.clone();
        async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match s_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let due = match shared.mode() {
                    LinkMode::Pass => Instant::now(),
                    LinkMode::DelayReplies(d) => Instant::now() + d,
                    LinkMode::Blackhole => continue,
                    // The reply is lost, and with it the connection.
                    LinkMode::LoseReplies => return,
                };
                if tx.send((due, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
        }
    };
    let replies_out = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if c_write.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    // Ends when any part ends; dropping the halves closes both sockets.
    tokio::select! {
        () = requests => {}
        () = async { replies_in.await; std::future::pending::<()>().await } => {}
        () = replies_out => {}
        _ = resets.changed() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(c: &mut TcpStream) -> std::io::Result<usize> {
        c.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).await
    }

    #[tokio::test]
    async fn passes_delays_loses_and_cuts_replies() {
        let p = FaultProxy::start(echo().await).await.unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], p.port()));
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert_eq!(round_trip(&mut c).await.unwrap(), 4);

        p.set(LinkMode::DelayReplies(Duration::from_millis(150)));
        let t = Instant::now();
        round_trip(&mut c).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );

        p.set(LinkMode::LoseReplies);
        assert!(
            round_trip(&mut c).await.is_err(),
            "a lost reply ends the connection"
        );

        p.set(LinkMode::Blackhole);
        let mut c = TcpStream::connect(addr).await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(200), round_trip(&mut c)).await;
        assert!(silent.is_err(), "nothing comes back through a black hole");
        p.set(LinkMode::Pass);
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert_eq!(round_trip(&mut c).await.unwrap(), 4);
    }
}
