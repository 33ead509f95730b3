//! The members of an etcd cluster, each on its own connection, and which one requests go to.
//!
//! Requests go to the current member and move on to the next when it stops answering: a paused
//! or partitioned member (whose TCP connection stays up) costs one response timeout, not one in
//! three requests as a balancer spreading them would.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use distlock_core::engine::{ErrorKind, LockError};
use tokio::sync::OnceCell;
use tonic::Status;

use crate::config::EtcdConfig;
use crate::error::{member_failed, never_sent};
use crate::wire::Conn;

/// One member of the cluster and its connection, opened on first use (a member down when we
/// start is tried again when its turn comes).
struct Member {
    endpoint: tonic::transport::Endpoint,
    /// The connection, logged in (when the URL has credentials) on first use.
    conn: OnceCell<Conn>,
}

/// Whether a request may be sent again after it timed out or its member failed while it was in
/// flight (it may have taken effect).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// A read, a keep-alive, a watch: sending it twice changes nothing.
    Always,
    /// A write: sent again only when it never reached a member.
    IfNeverSent,
}

/// The members, and the one requests go to now.
pub(crate) struct Members {
    list: Vec<Member>,
    current: AtomicUsize,
    connect_timeout: Duration,
    response_timeout: Duration,
    user: Option<(String, String)>,
    tls: Option<crate::wire::Tls>,
}

impl Members {
    /// The members a configuration names; nothing is connected yet.
    pub(crate) fn new(config: &EtcdConfig) -> Result<Members, LockError> {
        let mut list = Vec::with_capacity(config.endpoints.len());
        for e in &config.endpoints {
            let endpoint = tonic::transport::Endpoint::from_shared(e.clone()).map_err(|err| {
                LockError::new(
                    ErrorKind::Config,
                    format!("{e:?} is not an etcd member address: {err}"),
                )
            })?;
            list.push(Member {
                endpoint,
                conn: OnceCell::new(),
            });
        }
        Ok(Members {
            list,
            current: AtomicUsize::new(0),
            connect_timeout: config.connect_timeout,
            response_timeout: config.response_timeout,
            user: config.user.clone(),
            #[cfg(feature = "tls")]
            tls: match &config.tls {
                Some(settings) => Some(crate::wire::Tls {
                    connector: settings.connector()?,
                    settings: std::sync::Arc::new(settings.clone()),
                }),
                None => None,
            },
            #[cfg(not(feature = "tls"))]
            tls: None,
        })
    }

    /// A write, sent again only when it never reached a member.
    pub(crate) async fn write<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        self.send_on(Resend::IfNeverSent, f).await.1
    }

    /// Sends a request that may be sent twice; see `send_on`.
    pub(crate) async fn retry<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        self.send_on(Resend::Always, f).await.1
    }

    /// Opens (once) member `i`'s connection, and logs in when the URL has credentials. The
    /// connection is lazy: a dead member fails the first request, and a failed login is tried
    /// again by the next request.
    async fn member(&self, i: usize) -> Result<&Conn, Status> {
        let m = &self.list[i];
        m.conn
            // Boxed, like the requests: connecting is rare, and its future is large.
            .get_or_try_init(|| {
                Box::pin(async {
                    // A plain channel per member, not a balanced one: with a single member, a
                    // balancer holds requests while the member's connection is down, where
                    // this fails them at once (a refused connection), so the next member gets
                    // them. `require_leader`: a member that has no leader (an election, the
                    // minority side of a partition) refuses at once instead of holding the
                    // request until it times out, and the request goes to the next member.
                    let conn = Conn::lazy(
                        m.endpoint.clone(),
                        self.connect_timeout,
                        true,
                        self.user.clone(),
                        self.tls.as_ref(),
                    );
                    conn.authenticate().await?;
                    Ok(conn)
                })
            })
            .await
    }

    /// Member `i` failed a request: later ones go to the next member (unless another request
    /// moved on already).
    pub(crate) fn move_on(&self, i: usize) {
        let next = (i + 1) % self.list.len();
        let _ = self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Sends `f` to the current member, bounded by the response timeout (kept here rather than
    /// by the channel: gRPC's per-request timeout also sends a `grpc-timeout` header, which
    /// makes the member arm a deadline for every request, some µs each). A member that refuses
    /// the connection, times out or says it is unavailable is left for the next one; the
    /// request goes there too when it never reached a member, or when `resend` allows. Returns
    /// the member that answered last.
    pub(crate) async fn send_on<T, F, Fut>(
        &self,
        resend: Resend,
        f: F,
    ) -> (usize, Result<T, Status>)
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let n = self.list.len();
        // Every member twice (an election can make each refuse once).
        let tries = 2 * n;
        let mut tried = 0;
        loop {
            let i = self.current.load(Ordering::Relaxed) % n;
            tried += 1;
            let limit = self.response_timeout;
            let reply = match tokio::time::timeout(limit, async {
                let conn = self.member(i).await?.clone();
                // Boxed: a gRPC request future is kilobytes, and every caller's state machine
                // would otherwise carry (and move) it.
                Box::pin(f(conn)).await
            })
            .await
            {
                Ok(reply) => reply,
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "no answer within {limit:?}"
                ))),
            };
            let again = match &reply {
                Err(e) if never_sent(e) => true,
                Err(e) if member_failed(e) => resend == Resend::Always,
                _ => return (i, reply),
            };
            self.move_on(i);
            if !again || tried >= tries {
                return (i, reply);
            }
            if reply.as_ref().err().is_some_and(never_sent) {
                // Not a tight loop when every member refuses.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}
