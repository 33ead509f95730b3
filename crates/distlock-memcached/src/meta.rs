//! The few meta-protocol commands the engine needs (`ms`, `md`, `mg`), over one TCP
//! connection per request in flight, with a small pool.

use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

/// Idle connections kept for the next requests.
const IDLE_KEPT: usize = 32;

use distlock_core::engine::MutexExt;
use distlock_core::{ErrorKind, LockError};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// One reply: its two-letter code (`HD`, `NS`, `EX`, `NF`, `EN`, `VA`), the flags the engine
/// asks for (`c`: the CAS, `t`: the seconds left) and, for `VA`, the value.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) code: &'static str,
    /// The item's CAS (`c`), when asked for.
    pub(crate) cas: Option<u64>,
    /// The item's seconds left (`t`, `-1` for none), when asked for.
    pub(crate) ttl: Option<i64>,
    pub(crate) value: Option<Vec<u8>>,
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code)?;
        if let Some(c) = self.cas {
            write!(f, " c{c}")?;
        }
        if let Some(t) = self.ttl {
            write!(f, " t{t}")?;
        }
        Ok(())
    }
}

/// A word of a command line. The line is written straight into the connection's buffer, with no
/// `format!` and no allocation per request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    /// A word as it is (a command, an item key, a flag without a value).
    Word(&'a str),
    /// A number.
    Num(u64),
    /// A flag with a numeric value: `T30`, `C123`.
    Flag(char, u64),
}

fn write_line(out: &mut Vec<u8>, args: &[Arg<'_>]) {
    let mut digits = itoa::Buffer::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        match *a {
            Arg::Word(w) => out.extend_from_slice(w.as_bytes()),
            Arg::Num(n) => out.extend_from_slice(digits.format(n).as_bytes()),
            Arg::Flag(letter, n) => {
                let mut b = [0; 4];
                out.extend_from_slice(letter.encode_utf8(&mut b).as_bytes());
                out.extend_from_slice(digits.format(n).as_bytes());
            }
        }
    }
}

/// The first line of a request (no data), as text, for error messages.
fn request_text(out: &[u8]) -> String {
    let line = out.split(|&b| b == b'\r').next().unwrap_or_default();
    String::from_utf8_lossy(line).into_owned()
}

/// A connection's byte stream: TCP, or TLS over it.
enum Stream {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<distlock_tls::TlsStream<TcpStream>>),
}

impl tokio::io::AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// TLS to the server: the connector (files read once) and the settings (the name to check).
#[cfg(feature = "tls")]
pub(crate) struct Tls {
    pub(crate) connector: distlock_tls::TlsConnector,
    pub(crate) settings: distlock_tls::TlsSettings,
}

/// One connection, with what it reuses from request to request.
struct Conn {
    io: BufReader<Stream>,
    /// The reply deadline. One timer per connection, moved later before each request: that is
    /// an atomic store while the timer is registered, where a `timeout` per request would
    /// register and remove a timer in the runtime's wheel each time.
    deadline: Pin<Box<Sleep>>,
    /// The request being sent (`sent` bytes of it written so far), and the reply's first line
    /// (as much of it as has been read).
    out: Vec<u8>,
    sent: usize,
    head: Vec<u8>,
}

/// The most connections kept with a request whose reply was never read.
const MAX_ORPHANS: usize = 64;

/// Connections to one server.
pub(crate) struct Pool {
    host: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
    #[cfg(feature = "tls")]
    tls: Option<Tls>,
    /// Connections whose request was given up before its reply came (cancelled, or no answer
    /// in time), by the tag of the request. The server may still carry such a request out
    /// after any request sent later on another connection: [`Pool::settle`] reads its reply
    /// first, so that what comes next sees its effect.
    orphans: Mutex<Vec<(String, Conn)>>,
}

fn io_err(doing: &str, e: std::io::Error) -> LockError {
    // A certificate refused, ours or the server's (TLS 1.3 says ours at the first read).
    #[cfg(feature = "tls")]
    if let Some((kind, words)) = distlock_tls::classify(&e) {
        return LockError::new(kind, format!("{doing}: {words}"));
    }
    LockError::caused_by(ErrorKind::Connection, doing, e)
}

/// The largest value the engine ever reads back (a holder label); a bigger one is not ours.
const MAX_VALUE: usize = 64 * 1024;

/// A connection with a request on it. Dropped before its reply was read, it becomes an orphan
/// under its tag (if it has one), else it is closed: a late reply must never be read as the
/// answer to the next request.
struct InFlight<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
    tag: Option<&'a str>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let (Some(conn), Some(tag)) = (self.conn.take(), self.tag) {
            let mut orphans = self.pool.orphans.locked();
            if orphans.len() >= MAX_ORPHANS {
                orphans.remove(0);
            }
            orphans.push((tag.to_owned(), conn));
        }
    }
}

impl Pool {
    pub(crate) fn new(
        host: String,
        connect_timeout: Duration,
        response_timeout: Duration,
        #[cfg(feature = "tls")] tls: Option<Tls>,
    ) -> Self {
        Pool {
            host,
            connect_timeout,
            response_timeout,
            idle: Mutex::new(Vec::new()),
            #[cfg(feature = "tls")]
            tls,
            orphans: Mutex::new(Vec::new()),
        }
    }

    async fn connect(&self) -> Result<Conn, LockError> {
        let doing = format!("connecting to memcached at {}", self.host);
        let open = async {
            let tcp = TcpStream::connect(&self.host)
                .await
                .map_err(|e| io_err(&doing, e))?;
            let _ = tcp.set_nodelay(true);
            #[cfg(feature = "tls")]
            if let Some(tls) = &self.tls {
                let host = self
                    .host
                    .rsplit_once(':')
                    .map_or(self.host.as_str(), |(h, _)| h);
                let stream = tls.settings.connect(&tls.connector, host, tcp).await?;
                return Ok(Stream::Tls(Box::new(stream)));
            }
            Ok::<_, LockError>(Stream::Plain(tcp))
        };
        let stream = tokio::time::timeout(self.connect_timeout, open)
            .await
            .map_err(|_| LockError::new(ErrorKind::Timeout, format!("{doing}: no answer")))??;
        Ok(Conn {
            io: BufReader::new(stream),
            deadline: Box::pin(tokio::time::sleep(self.response_timeout)),
            out: Vec::with_capacity(256),
            sent: 0,
            head: Vec::with_capacity(64),
        })
    }

    /// Sends one command (the words of its line, and `data` for `ms`) and reads its reply. A
    /// connection that fails or times out is dropped (a late reply must not be read as the
    /// answer to the next command).
    pub(crate) async fn call(
        &self,
        args: &[Arg<'_>],
        data: Option<&[u8]>,
    ) -> Result<Reply, LockError> {
        self.call_tagged(args, data, None).await
    }

    /// As [`call`](Self::call); a request given up before its reply (its future dropped, or
    /// no answer in time) leaves its connection to [`settle`](Self::settle) under `tag`.
    pub(crate) async fn call_tagged(
        &self,
        args: &[Arg<'_>],
        data: Option<&[u8]>,
        tag: Option<&str>,
    ) -> Result<Reply, LockError> {
        let pooled = self.idle.locked().pop();
        let conn = match pooled {
            Some(c) => c,
            None => self.connect().await?,
        };
        let mut flight = InFlight {
            pool: self,
            conn: Some(conn),
            tag,
        };
        let conn = flight.conn.as_mut().expect("set above");
        conn.out.clear();
        write_line(&mut conn.out, args);
        conn.out.extend_from_slice(b"\r\n");
        if let Some(d) = data {
            conn.out.extend_from_slice(d);
            conn.out.extend_from_slice(b"\r\n");
        }
        conn.sent = 0;
        conn.head.clear();
        self.finish(flight).await
    }

    /// Reads the replies of the requests tagged `tag` that were given up, oldest first: once
    /// it returns, the server has carried them out, and what is sent next sees their effect.
    /// Their replies, in that order.
    ///
    /// # Errors
    /// As [`call`](Self::call) (the request stays to settle on a timeout).
    pub(crate) async fn settle(&self, tag: &str) -> Result<Vec<Reply>, LockError> {
        let mut replies = Vec::new();
        loop {
            let conn = {
                let mut orphans = self.orphans.locked();
                match orphans.iter().position(|(t, _)| t == tag) {
                    Some(i) => orphans.remove(i).1,
                    None => return Ok(replies),
                }
            };
            let flight = InFlight {
                pool: self,
                conn: Some(conn),
                tag: Some(tag),
            };
            replies.push(self.finish(flight).await?);
        }
    }

    /// Sends what is left of the request on `flight` and reads its reply.
    async fn finish(&self, mut flight: InFlight<'_>) -> Result<Reply, LockError> {
        let conn = flight.conn.as_mut().expect("a connection in flight");
        conn.deadline
            .as_mut()
            .reset(Instant::now() + self.response_timeout);
        let result = {
            let Conn {
                io,
                deadline,
                out,
                sent,
                head,
            } = conn;
            tokio::select! {
                biased;
                r = exchange(io, out, sent, head) => r,
                () = deadline.as_mut() => {
                    // Dropping `flight` keeps the connection for `settle` if it is tagged.
                    return Err(LockError::new(
                        ErrorKind::Timeout,
                        format!("memcached at {}: no answer to {:?}", self.host, request_text(out)),
                    ));
                }
            }
        };
        let conn = flight.conn.take().expect("a connection in flight");
        let reply = result?; // On an error the connection is closed here.
        let mut idle = self.idle.locked();
        // Room for every renewal the watchdog has in flight at once (16, see the core's
        // driver) and some requests beside: a connection is reused, not opened per request.
        if idle.len() < IDLE_KEPT {
            idle.push(conn);
        }
        Ok(reply)
    }
}

/// Writes what is left of `out` and reads the reply, into `head` after what it already holds.
async fn exchange(
    conn: &mut BufReader<Stream>,
    out: &[u8],
    sent: &mut usize,
    head: &mut Vec<u8>,
) -> Result<Reply, LockError> {
    const DOING: &str = "talking to memcached";
    while *sent < out.len() {
        let n = conn
            .get_mut()
            .write(&out[*sent..])
            .await
            .map_err(|e| io_err(DOING, e))?;
        if n == 0 {
            return Err(LockError::new(
                ErrorKind::Connection,
                format!("{DOING}: the server closed the connection"),
            ));
        }
        *sent += n;
    }
    let n = conn
        .read_until(b'\n', head)
        .await
        .map_err(|e| io_err(DOING, e))?;
    if n == 0 || head.last() != Some(&b'\n') {
        return Err(LockError::new(
            ErrorKind::Connection,
            format!("{DOING}: the server closed the connection"),
        ));
    }
    let text = head.trim_ascii_end();
    let mut words = text.split(|&b| b == b' ');
    let code = match words.next().unwrap_or_default() {
        b"HD" => "HD",
        b"NS" => "NS",
        b"EX" => "EX",
        b"NF" => "NF",
        b"EN" => "EN",
        b"VA" => "VA",
        b"CLIENT_ERROR" | b"SERVER_ERROR" | b"ERROR" => {
            return Err(LockError::new(
                ErrorKind::Protocol,
                format!(
                    "memcached refused {:?}: {}",
                    request_text(out),
                    String::from_utf8_lossy(text)
                ),
            ));
        }
        _ => {
            return Err(LockError::new(
                ErrorKind::Protocol,
                format!(
                    "memcached answered {:?} to {:?} (not a meta-protocol server?)",
                    String::from_utf8_lossy(text),
                    request_text(out)
                ),
            ));
        }
    };
    let bad = |what: &str| {
        LockError::new(
            ErrorKind::Protocol,
            format!(
                "memcached answered {:?}: {what}",
                String::from_utf8_lossy(text)
            ),
        )
    };
    let size = if code == "VA" {
        let size = words
            .next()
            .and_then(number::<usize>)
            .filter(|&s| s <= MAX_VALUE)
            .ok_or_else(|| bad("a bad value size"))?;
        Some(size)
    } else {
        None
    };
    let (mut cas, mut ttl) = (None, None);
    for w in words {
        match w.split_first() {
            Some((b'c', n)) => cas = Some(number(n).ok_or_else(|| bad("a bad CAS"))?),
            Some((b't', n)) => ttl = Some(number(n).ok_or_else(|| bad("a bad TTL"))?),
            _ => {}
        }
    }
    let value = match size {
        Some(size) => {
            let mut buf = vec![0u8; size + 2];
            conn.read_exact(&mut buf)
                .await
                .map_err(|e| io_err(DOING, e))?;
            buf.truncate(size);
            Some(buf)
        }
        None => None,
    };
    Ok(Reply {
        code,
        cas,
        ttl,
        value,
    })
}

/// A decimal number in a reply (`-1` for a TTL that never runs out).
fn number<T: std::str::FromStr>(digits: &[u8]) -> Option<T> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}
