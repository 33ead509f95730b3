//! The few meta-protocol commands the engine needs (`ms`, `md`, `mg`), over one TCP
//! connection per request in flight, with a small pool.

use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

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

/// The command line as text, for error messages.
fn line_text(args: &[Arg<'_>]) -> String {
    let mut out = Vec::new();
    write_line(&mut out, args);
    String::from_utf8_lossy(&out).into_owned()
}

/// One connection, with what it reuses from request to request.
struct Conn {
    io: BufReader<TcpStream>,
    /// The reply deadline. One timer per connection, moved later before each request: that is
    /// an atomic store while the timer is registered, where a `timeout` per request would
    /// register and remove a timer in the runtime's wheel each time.
    deadline: Pin<Box<Sleep>>,
    /// The request being sent, and the reply's first line.
    out: Vec<u8>,
    head: Vec<u8>,
}

/// Connections to one server.
pub(crate) struct Pool {
    host: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
}

fn io_err(doing: &str, e: std::io::Error) -> LockError {
    LockError::caused_by(ErrorKind::Connection, doing, e)
}

/// The largest value the engine ever reads back (a holder label); a bigger one is not ours.
const MAX_VALUE: usize = 64 * 1024;

impl Pool {
    pub(crate) fn new(host: String, connect_timeout: Duration, response_timeout: Duration) -> Self {
        Pool {
            host,
            connect_timeout,
            response_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    async fn connect(&self) -> Result<Conn, LockError> {
        let doing = format!("connecting to memcached at {}", self.host);
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.host))
            .await
            .map_err(|_| LockError::new(ErrorKind::Timeout, format!("{doing}: no answer")))?
            .map_err(|e| io_err(&doing, e))?;
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            io: BufReader::new(stream),
            deadline: Box::pin(tokio::time::sleep(self.response_timeout)),
            out: Vec::with_capacity(256),
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
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.connect().await?,
        };
        conn.deadline
            .as_mut()
            .reset(Instant::now() + self.response_timeout);
        let reply = {
            let Conn {
                io,
                deadline,
                out,
                head,
            } = &mut conn;
            tokio::select! {
                biased;
                r = exchange(io, out, head, args, data) => r?,
                () = deadline.as_mut() => {
                    return Err(LockError::new(
                        ErrorKind::Timeout,
                        format!("memcached at {}: no answer to {:?}", self.host, line_text(args)),
                    ));
                }
            }
        };
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < 8 {
            idle.push(conn);
        }
        Ok(reply)
    }
}

async fn exchange(
    conn: &mut BufReader<TcpStream>,
    out: &mut Vec<u8>,
    head: &mut Vec<u8>,
    args: &[Arg<'_>],
    data: Option<&[u8]>,
) -> Result<Reply, LockError> {
    const DOING: &str = "talking to memcached";
    out.clear();
    write_line(out, args);
    out.extend_from_slice(b"\r\n");
    if let Some(d) = data {
        out.extend_from_slice(d);
        out.extend_from_slice(b"\r\n");
    }
    conn.get_mut()
        .write_all(out)
        .await
        .map_err(|e| io_err(DOING, e))?;
    head.clear();
    let n = conn
        .read_until(b'\n', head)
        .await
        .map_err(|e| io_err(DOING, e))?;
    if n == 0 {
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
                    line_text(args),
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
                    line_text(args)
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
