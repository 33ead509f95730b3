//! The direct connection: one plain connection to a server that a request uses when no other
//! request is on it, driven by the caller's own future.
//!
//! redis-rs's multiplexed connection sends every request through a channel to a driver task and its
//! reply back through another: two task hand-offs per round trip, which cost about a fifth of a
//! lock cycle on one CPU. A lock client mostly has one request in flight, so the backend keeps one
//! more connection, driven by the caller's own future: write the request, read the reply, nothing
//! in between. A request that finds the direct connection in use (another task is mid round trip)
//! goes to the multiplexed connection, as before; so does everything when the direct connection
//! cannot be opened or is reconnecting.
//!
//! It speaks TCP, a Unix socket, or TLS over TCP (`rediss://`, `valkeys://`, with the `tls`
//! feature) through `distlock-tls`, with the checks redis-rs's connection makes on the same
//! URL: the CA of `tls_ca` (else the system's roots), the host name, our certificate when
//! `tls_cert` and `tls_key` name one; `#insecure` checks no certificate and sends no SNI, as in
//! redis-rs (it still checks that the server signs the handshake with the key of the
//! certificate it shows, which redis-rs does not). The TLS configuration is built once per
//! connection target and kept for reconnections. A handshake that fails (a refused
//! certificate is `Auth`, see `distlock_tls::classify_text`) is a direct connection that
//! could not be opened: requests take the multiplexed connection, which reports the error
//! itself.
//!
//! A request owns the connection for its round trip. If its future is dropped half way (a timeout,
//! a cancelled acquire), the connection goes with it: a reply still on its way can never be read as
//! the answer to the next request. The next request that finds the direct connection gone
//! reconnects it in the background and meanwhile uses the multiplexed connection.
//!
//! The response timeout costs no timer per request (registering and cancelling one in tokio's wheel
//! costs about as much as a tenth of the round trip): the request notes its deadline, and a reaper
//! task that ticks while the direct connection is busy fails a request that is past it, within an
//! eighth of the timeout after it.
//!
//! What the two direct paths are worth (each can be switched off in a build with
//! `--cfg distlock_measure`): `bench/notes.md`, "The Redis engine's direct connections".
//!
//! The replies are RESP2 (the direct connection never sends `HELLO`); they are framed here and
//! built as redis-rs [`Value`]s, server errors through redis-rs's own parser, so the callers decode
//! them as they decode the multiplexed connection's.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use redis::{RedisError, Value};

mod endpoint;
mod resp;

pub(crate) use endpoint::Endpoint;
use endpoint::Stream;
use resp::frame;

/// One reply framed from the start of `buf` (for the fuzz targets: `crate::fuzzing`).
#[cfg(fuzzing)]
pub(crate) fn fuzz_frame(buf: &[u8]) -> Result<Option<(Value, usize)>, RedisError> {
    frame(buf, 0)
}

/// How long after a failed connection attempt the direct connection is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// One open direct connection and its buffers.
pub(crate) struct RespConnection {
    stream: Stream,
    out: Vec<u8>,
    input: Vec<u8>,
}

#[derive(Default)]
struct State {
    idle: Option<RespConnection>,
    /// A request has the connection.
    out: bool,
    /// A reconnect task runs.
    connecting: bool,
    /// No reconnect before this (after a failed attempt).
    retry_at: Option<Instant>,
}

struct DirectShared {
    target: Option<Endpoint>,
    state: Mutex<State>,
    connect_timeout: Duration,
    timer: Timer,
}

impl DirectShared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The response timeout of the request on the direct connection (there is at most one).
struct Timer {
    /// The request on the direct connection and its deadline, if one is on it.
    current: Mutex<Option<(u64, Instant)>>,
    /// Numbers requests.
    next_id: AtomicU64,
    /// The id of the last request the reaper found past its deadline.
    expired: AtomicU64,
    /// The waiting request's task.
    waker: AtomicWaker,
    /// The reaper task runs.
    reaping: AtomicBool,
}

/// Idle ticks after which the reaper ends (the next request starts it again).
const IDLE_TICKS: u32 = 8;

impl Timer {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(u64, Instant)>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Fails the direct connection's request once it is past its deadline; ends after `IDLE_TICKS`
/// ticks with no request on the direct connection.
async fn reap(inner: Weak<DirectShared>, tick: Duration) {
    /// Clears `reaping` however the task ends (its runtime may shut down).
    struct Reaping(Weak<DirectShared>);
    impl Drop for Reaping {
        fn drop(&mut self) {
            if let Some(inner) = self.0.upgrade() {
                inner.timer.reaping.store(false, Ordering::Release);
            }
        }
    }
    let _reaping = Reaping(inner.clone());
    let mut idle = 0;
    loop {
        tokio::time::sleep(tick).await;
        let Some(inner) = inner.upgrade() else { return };
        let timer = &inner.timer;
        let current = *timer.slot();
        match current {
            Some((id, deadline)) => {
                idle = 0;
                if Instant::now() >= deadline {
                    timer.expired.store(id, Ordering::Release);
                    timer.waker.wake();
                }
            }
            None => {
                idle += 1;
                if idle >= IDLE_TICKS {
                    return;
                }
            }
        }
    }
}

/// Whether a measuring build switched a direct path off: built with `--cfg distlock_measure` and
/// run with `DISTLOCK_NO_DIRECT` set to `commands`, `events` or `both`. Always false in any other
/// build, so no setting of a user's can change which path a request takes.
pub(crate) fn switched_off(path: &str) -> bool {
    #[cfg(distlock_measure)]
    {
        let off = std::env::var("DISTLOCK_NO_DIRECT").unwrap_or_default();
        off == "both" || off == path
    }
    #[cfg(not(distlock_measure))]
    {
        let _ = path;
        false
    }
}

/// The direct connection; clones share it.
#[derive(Clone)]
pub(crate) struct DirectConnection {
    inner: Arc<DirectShared>,
}

impl DirectConnection {
    /// A direct connection to `target`; without one (see [`Endpoint::of`]), disabled: every
    /// request takes the multiplexed connection.
    pub(crate) fn new(target: Option<Endpoint>, connect_timeout: Duration) -> DirectConnection {
        DirectConnection {
            inner: Arc::new(DirectShared {
                target: target.filter(|_| !switched_off("commands")),
                state: Mutex::new(State::default()),
                connect_timeout,
                timer: Timer {
                    current: Mutex::new(None),
                    next_id: AtomicU64::new(1),
                    expired: AtomicU64::new(0),
                    waker: AtomicWaker::new(),
                    reaping: AtomicBool::new(false),
                },
            }),
        }
    }

    /// Opens the connection now (at start-up). A failure is not an error: requests use the
    /// multiplexed connection until a reconnect succeeds.
    pub(crate) async fn open(&self) {
        let Some(target) = self.inner.target.clone() else {
            return;
        };
        self.inner.state().connecting = true;
        let result = connect(&target, self.inner.connect_timeout).await;
        settle(&self.inner, result);
    }

    /// The connection, if it is free; starts a reconnect if it is gone.
    pub(crate) fn checkout(&self) -> Option<Checkout> {
        let target = self.inner.target.as_ref()?;
        let mut st = self.inner.state();
        if let Some(direct) = st.idle.take() {
            st.out = true;
            return Some(Checkout {
                direct: Some(direct),
                inner: self.inner.clone(),
            });
        }
        if !st.out
            && !st.connecting
            && st.retry_at.is_none_or(|at| Instant::now() >= at)
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            st.connecting = true;
            let inner = self.inner.clone();
            let target = target.clone();
            handle.spawn(async move {
                let result = connect(&target, inner.connect_timeout).await;
                settle(&inner, result);
            });
        }
        None
    }
}

fn settle(inner: &DirectShared, result: Result<RespConnection, RedisError>) {
    let mut st = inner.state();
    st.connecting = false;
    match result {
        Ok(direct) => {
            st.retry_at = None;
            st.idle = Some(direct);
        }
        Err(e) => {
            tracing::debug!(target: "distlock", error = %e,
                "the direct Redis connection could not be opened; using the shared one");
            st.retry_at = Some(Instant::now() + RETRY);
        }
    }
}

/// Opens a direct connection: connect, then `AUTH` and `SELECT` as the target says, all within
/// `timeout`.
pub(crate) async fn connect(
    target: &Endpoint,
    timeout: Duration,
) -> Result<RespConnection, RedisError> {
    let opening = async {
        let stream = target.open().await?;
        let mut direct = RespConnection {
            stream,
            out: Vec::with_capacity(512),
            input: Vec::with_capacity(512),
        };
        let mut hello = Vec::new();
        if let Some(password) = &target.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &target.username {
                auth.arg(user);
            }
            auth.arg(password);
            hello.push(auth);
        }
        if target.db != 0 {
            let mut select = redis::cmd("SELECT");
            select.arg(target.db);
            hello.push(select);
        }
        if target.is_tls() {
            // TLS 1.3 ends our side of the handshake before the server has checked our
            // certificate: a refusal comes with the first reply, so take one now (a failed
            // open leaves requests on the multiplexed connection; a failed request fails).
            hello.push(redis::cmd("PING"));
        }
        if !hello.is_empty() {
            let replies = direct.round_trip(hello.iter()).await?;
            if let Some(Value::ServerError(e)) =
                replies.iter().find(|v| matches!(v, Value::ServerError(_)))
            {
                return Err(RedisError::from(e.clone()));
            }
        }
        Ok(direct)
    };
    match tokio::time::timeout(timeout, opening).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connecting").into()),
    }
}

/// The direct connection's connection, lent to one request.
pub(crate) struct Checkout {
    /// `None` while a round trip is under way: dropped then, the connection goes with it.
    direct: Option<RespConnection>,
    inner: Arc<DirectShared>,
}

impl Checkout {
    /// Sends `cmds` as one write and reads one reply each (server errors in their place), or
    /// fails after `timeout`. On any failure the connection is closed.
    ///
    /// Not an `async fn`: its future holds the checkout once, where an `async fn` taking it by
    /// value keeps a second copy (every request's future, boxed by the engine, holds this one).
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would hold the checkout twice"
    )]
    pub(crate) fn round_trip<'a, I>(
        mut self,
        cmds: I,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<Value>, RedisError>> + Send + 'a
    where
        I: IntoIterator<Item = &'a redis::Cmd> + Send + 'a,
    {
        async move {
            let Some(mut direct) = self.direct.take() else {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "the direct connection is closed",
                )
                .into());
            };
            let timer = &self.inner.timer;
            let id = timer.next_id.fetch_add(1, Ordering::Relaxed);
            *timer.slot() = Some((id, Instant::now() + timeout));
            if !timer.reaping.swap(true, Ordering::AcqRel) {
                let tick =
                    (timeout / 8).clamp(Duration::from_millis(1), Duration::from_millis(250));
                tokio::spawn(reap(Arc::downgrade(&self.inner), tick));
            }
            let result = {
                let mut trip = pin!(direct.round_trip(cmds));
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(r) = trip.as_mut().poll(cx) {
                        return Poll::Ready(Some(r));
                    }
                    timer.waker.register(cx.waker());
                    if timer.expired.load(Ordering::Acquire) == id {
                        return Poll::Ready(None);
                    }
                    Poll::Pending
                })
                .await
            };
            *timer.slot() = None;
            match result {
                Some(Ok(replies)) => {
                    // Back to the idle slot, by the checkout's drop.
                    self.give_back(direct);
                    Ok(replies)
                }
                Some(Err(e)) => Err(e),
                None => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no reply within the response timeout",
                )
                .into()),
            }
        }
    }
}

impl Checkout {
    /// Ends the checkout with its connection, which goes back to the idle slot.
    fn give_back(mut self, direct: RespConnection) {
        self.direct = Some(direct);
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let mut st = self.inner.state();
        st.out = false;
        st.idle = self.direct.take();
    }
}

impl RespConnection {
    /// Writes `cmds` as one write, without waiting for replies (pub/sub).
    pub(crate) async fn send<'a>(
        &mut self,
        cmds: impl IntoIterator<Item = &'a redis::Cmd>,
    ) -> io::Result<()> {
        self.out.clear();
        for cmd in cmds {
            cmd.write_packed_command(&mut self.out);
        }
        self.stream.write_all(&self.out).await
    }

    /// The next reply or push the server sends (pub/sub).
    ///
    /// # Cancel safety
    /// Cancel-safe: bytes read before a cancellation stay in the buffer for the next call.
    pub(crate) async fn next_frame(&mut self) -> Result<Value, RedisError> {
        loop {
            if let Some((value, used)) = frame(&self.input, 0)? {
                self.input.drain(..used);
                return Ok(value);
            }
            self.fill().await?;
        }
    }

    /// Reads what the server sent into the input buffer; a closed connection is an error.
    async fn fill(&mut self) -> Result<(), RedisError> {
        if self.input.capacity() - self.input.len() < 256 {
            self.input.reserve(4096);
        }
        if self.stream.read_buf(&mut self.input).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )
            .into());
        }
        Ok(())
    }

    async fn round_trip<'a>(
        &mut self,
        cmds: impl IntoIterator<Item = &'a redis::Cmd>,
    ) -> Result<Vec<Value>, RedisError> {
        self.out.clear();
        let mut n = 0;
        for cmd in cmds {
            cmd.write_packed_command(&mut self.out);
            n += 1;
        }
        self.stream.write_all(&self.out).await?;
        let mut replies = Vec::with_capacity(n);
        let mut start = 0;
        while replies.len() < n {
            match frame(&self.input[start..], 0)? {
                Some((value, used)) => {
                    replies.push(value);
                    start += used;
                }
                None => self.fill().await?,
            }
        }
        if start < self.input.len() {
            // More than we asked for: not a conversation we can continue.
            return Err(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "the server sent more replies than requests",
            )));
        }
        self.input.clear();
        Ok(replies)
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    mod tls {
        use super::super::*;
        use crate::config::RedisConfig;
        use distlock_core::ErrorKind;
        use distlock_testkit::{Pki, RedisServer};

        fn endpoint(url: &str) -> Endpoint {
            let config = RedisConfig::from_url(url).unwrap();
            let info = redis::Client::open(config.url.as_str()).unwrap();
            Endpoint::of(info.get_connection_info(), &config).expect("a direct target")
        }

        /// Opens a direct connection to `url`, and the kind and words of its failure.
        async fn refusal(url: &str) -> (ErrorKind, String) {
            let Err(e) = connect(&endpoint(url), Duration::from_secs(5)).await else {
                panic!("{url}: the direct connection opened");
            };
            let e = crate::error::map_err(e, "opening");
            (e.kind(), e.to_string())
        }

        #[tokio::test]
        async fn the_direct_connection_checks_certificates_as_redis_rs_does() {
            let pki = Pki::generate();
            let Some(server) = RedisServer::start_tls(&pki, true, &[]) else {
                return;
            };
            let base = format!("rediss://127.0.0.1:{}/", server.tls_port());
            let (ca, other) = (pki.ca.display(), pki.other_ca.display());
            let ours = format!(
                "tls_cert={}&tls_key={}",
                pki.client.cert.display(),
                pki.client.key.display()
            );
            // Our certificate, to a server that demands one from its CA; the name checked.
            let mut direct = connect(
                &endpoint(&format!("{base}?tls_ca={ca}&{ours}")),
                Duration::from_secs(5),
            )
            .await
            .expect("TLS with a client certificate");
            let cmd = redis::cmd("PING");
            let replies = direct.round_trip(std::iter::once(&cmd)).await.unwrap();
            assert_eq!(replies, [Value::SimpleString("PONG".into())]);
            // `#insecure`: no check of the server's certificate, ours still shown.
            connect(
                &endpoint(&format!("{base}?tls_ca={other}&{ours}#insecure")),
                Duration::from_secs(5),
            )
            .await
            .expect("#insecure");
            // A server certificate from a CA we do not trust.
            let (kind, words) = refusal(&format!("{base}?tls_ca={other}&{ours}")).await;
            assert_eq!(kind, ErrorKind::Auth, "{words}");
            assert!(
                words.contains("the server's certificate was refused"),
                "{words}"
            );
            // No client certificate, or one from another CA: the server refuses.
            let stranger = format!(
                "tls_cert={}&tls_key={}",
                pki.stranger.cert.display(),
                pki.stranger.key.display()
            );
            for url in [
                format!("{base}?tls_ca={ca}"),
                format!("{base}?tls_ca={ca}&{stranger}"),
            ] {
                let (kind, words) = refusal(&url).await;
                assert_eq!(kind, ErrorKind::Auth, "{url}: {words}");
                assert!(words.contains("refused our client certificate"), "{words}");
            }
        }

        #[tokio::test]
        async fn a_refused_handshake_leaves_requests_on_the_multiplexed_connection() {
            let pki = Pki::generate();
            let Some(server) = RedisServer::start_tls(&pki, false, &[]) else {
                return;
            };
            let url = format!(
                "rediss://127.0.0.1:{}/?tls_ca={}",
                server.tls_port(),
                pki.other_ca.display()
            );
            let direct = DirectConnection::new(Some(endpoint(&url)), Duration::from_secs(5));
            direct.open().await;
            assert!(direct.checkout().is_none(), "no direct connection to lend");
            let good = format!(
                "rediss://127.0.0.1:{}/?tls_ca={}",
                server.tls_port(),
                pki.ca.display()
            );
            let direct = DirectConnection::new(Some(endpoint(&good)), Duration::from_secs(5));
            direct.open().await;
            assert!(direct.checkout().is_some(), "the direct connection is lent");
        }
    }
}
