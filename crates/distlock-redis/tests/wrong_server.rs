//! A server that answers wrongly: a tiny TCP server that speaks enough RESP to let the client
//! connect (`PING`, `CLIENT`, `SELECT`) and answers every other request with bad bytes. Each
//! case must end the lock call with a typed error within the response timeout and a margin,
//! with no panic and no large allocation (a counting allocator watches the whole test binary).

use std::time::Duration;

use distlock_core::{ErrorKind, LockClient};
use distlock_redis::RedisBackend;
use distlock_testkit::wrong_server::{Counting, expect_error, listen};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[global_allocator]
static ALLOC: Counting = Counting;

/// The client's response timeout, in the URL.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(1500);

/// What the server sends in place of a reply.
#[derive(Clone)]
enum Answer {
    /// These bytes, then the connection closed.
    ThenClose(Vec<u8>),
    /// These bytes, the connection kept open.
    Bytes(Vec<u8>),
    /// These bytes one at a time, `gap` apart.
    Trickle(Vec<u8>, Duration),
    /// The first bytes, then the second over and over, as fast as the client reads them.
    Endless(Vec<u8>, Vec<u8>),
}

/// The commands of a request: the words of each RESP array of bulk strings in `buf`, and how
/// many bytes they took (`None` when more bytes are needed).
fn requests(buf: &[u8]) -> Option<(Vec<Vec<String>>, usize)> {
    let mut at = 0;
    let mut out = Vec::new();
    let line = |from: usize| -> Option<(&[u8], usize)> {
        let end = buf[from..].windows(2).position(|w| w == b"\r\n")?;
        Some((&buf[from..from + end], from + end + 2))
    };
    while at < buf.len() {
        let (head, mut next) = line(at)?;
        let n: usize = std::str::from_utf8(head.get(1..)?).ok()?.parse().ok()?;
        let mut words = Vec::with_capacity(n);
        for _ in 0..n {
            let (len, after) = line(next)?;
            let len: usize = std::str::from_utf8(len.get(1..)?).ok()?.parse().ok()?;
            let word = buf.get(after..after + len)?;
            words.push(String::from_utf8_lossy(word).to_uppercase());
            next = after + len + 2;
            if next > buf.len() {
                return None;
            }
        }
        out.push(words);
        at = next;
    }
    Some((out, at))
}

/// Which of the client's two connections the lock requests take.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// The direct connection (ours, `direct/resp.rs` reads its replies) when it is free.
    Direct,
    /// redis-rs's multiplexed connection (its parser reads the replies): the URL names a
    /// database, which the direct connection selects as it opens; the server closes every
    /// connection whose first commands are not redis-rs's (with `CLIENT SETINFO`), so the
    /// direct connection never opens and the multiplexed one carries everything.
    Multiplexed,
}

/// Answers one connection: the connection's own commands properly, the rest with `answer`.
async fn serve(mut stream: TcpStream, answer: Answer, path: Path) {
    let mut buf = Vec::new();
    let mut first = true;
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(n) = stream.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some((commands, used)) = requests(&buf) else {
            continue;
        };
        buf.drain(..used);
        if std::mem::take(&mut first)
            && matches!(path, Path::Multiplexed)
            && !commands
                .iter()
                .any(|w| w.first().is_some_and(|c| c == "CLIENT"))
        {
            return;
        }
        for words in commands {
            let first = words.first().map(String::as_str).unwrap_or_default();
            let fine: &[u8] = match first {
                "PING" => b"+PONG\r\n",
                "CLIENT" | "SELECT" | "AUTH" => b"+OK\r\n",
                "HELLO" => b"-ERR unknown command 'HELLO'\r\n",
                _ => b"",
            };
            if !fine.is_empty() {
                if stream.write_all(fine).await.is_err() {
                    return;
                }
                continue;
            }
            match &answer {
                Answer::ThenClose(bytes) => {
                    let _ = stream.write_all(bytes).await;
                    return;
                }
                Answer::Bytes(bytes) => {
                    if stream.write_all(bytes).await.is_err() {
                        return;
                    }
                }
                Answer::Trickle(bytes, gap) => {
                    for b in bytes {
                        if stream.write_all(&[*b]).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(*gap).await;
                    }
                }
                Answer::Endless(first, again) => {
                    if stream.write_all(first).await.is_err() {
                        return;
                    }
                    while stream.write_all(again).await.is_ok() {}
                    return;
                }
            }
        }
    }
}

/// A server on a free port that answers every lock request with `answer`.
async fn wrong_server(answer: Answer, path: Path) -> String {
    let port = listen(move |stream| serve(stream, answer.clone(), path)).await;
    let db = match path {
        Path::Direct => 0,
        Path::Multiplexed => 1,
    };
    format!(
        "redis://127.0.0.1:{port}/{db}?response_timeout={}ms&connect_timeout=1s",
        RESPONSE_TIMEOUT.as_millis()
    )
}

/// [`case_on`] on each path: the direct connection's error is one of `direct`, the
/// multiplexed connection's one of `multiplexed` (redis-rs closes its connection on a reply it
/// cannot parse, and waits for a bulk or array of any length until the response timeout).
async fn case(what: &str, answer: Answer, direct: &[ErrorKind], multiplexed: &[ErrorKind]) {
    case_on(
        &format!("{what} (direct)"),
        answer.clone(),
        Path::Direct,
        direct,
    )
    .await;
    case_on(
        &format!("{what} (multiplexed)"),
        answer,
        Path::Multiplexed,
        multiplexed,
    )
    .await;
}

/// [`case_on`] on the direct connection only: redis-rs's parser, under the multiplexed
/// connection, has no bound of its own on what it buffers or builds before the response
/// timeout (it held 2.9 to 3.5 GB of an endless array of bulks, and allocated 117 to 235 MB
/// at once for an array of 4,000,000 integers); ours refuses both at once.
async fn case_direct(what: &str, answer: Answer, direct: &[ErrorKind]) {
    case_on(&format!("{what} (direct)"), answer, Path::Direct, direct).await;
}

/// Connects to a server answering `answer` on `path`, tries to take a lock, and checks that
/// the call ends with an error of one of `kinds` in time, with no large allocation. Returns
/// the error's kind and the time taken.
async fn case_on(
    what: &str,
    answer: Answer,
    path: Path,
    kinds: &[ErrorKind],
) -> (ErrorKind, Duration) {
    let url = wrong_server(answer, path).await;
    let client = LockClient::new(
        RedisBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{what}: connect: {e}")),
    );
    // The acquire resends a request whose reply was lost once: the margin covers it.
    let (e, elapsed) =
        expect_error(what, RESPONSE_TIMEOUT, kinds, client.try_acquire("wrong")).await;
    drop(client);
    (e.kind(), elapsed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_reply_is_a_connection_error() {
    case(
        "truncated",
        Answer::ThenClose(b"*2\r\n:1\r\n$10\r\nabc".to_vec()),
        &[ErrorKind::Connection],
        &[ErrorKind::Connection],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_length_of_ten_to_the_thirteen_is_refused_unallocated() {
    case(
        "bulk 10^13",
        Answer::Bytes(b"$10000000000000\r\nabc\r\n".to_vec()),
        &[ErrorKind::Protocol],
        &[ErrorKind::Timeout],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_array_length_of_ten_to_the_thirteen_is_refused_unallocated() {
    case(
        "array 10^13",
        Answer::Bytes(b"*10000000000000\r\n:1\r\n".to_vec()),
        &[ErrorKind::Protocol],
        &[ErrorKind::Timeout],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_array_of_large_bulks_is_refused_without_filling_memory() {
    let mut bulk = b"$16000000\r\n".to_vec();
    bulk.resize(bulk.len() + 16_000_000, b'x');
    bulk.extend_from_slice(b"\r\n");
    case_direct(
        "an array of 1,000 bulks of 16 MB",
        Answer::Endless(b"*1000\r\n".to_vec(), bulk),
        &[ErrorKind::Protocol],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_array_of_four_million_integers_is_refused_without_building_it() {
    let mut bytes = b"*4000000\r\n".to_vec();
    bytes.extend_from_slice(&b":1\r\n".repeat(4_000_000));
    case_direct(
        "an array of 4,000,000 integers",
        Answer::Bytes(bytes),
        &[ErrorKind::Protocol],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_thousand_nested_arrays_are_refused_without_recursion() {
    let mut bytes = b"*1\r\n".repeat(200_000);
    bytes.extend_from_slice(b":1\r\n");
    case(
        "200,000 nested arrays",
        Answer::Bytes(bytes),
        &[ErrorKind::Protocol],
        &[ErrorKind::Connection],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_reply_type_is_a_protocol_error() {
    for (what, bytes) in [
        ("an integer", &b":7\r\n"[..]),
        ("a status", b"+OK\r\n"),
        ("a bulk string", b"$5\r\nhello\r\n"),
        ("an array of junk", b"*3\r\n+a\r\n+b\r\n+c\r\n"),
        ("a type RESP2 does not have", b"?huh\r\n"),
    ] {
        case(
            what,
            Answer::Bytes(bytes.to_vec()),
            &[ErrorKind::Protocol],
            &[ErrorKind::Protocol, ErrorKind::Connection],
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_every_few_seconds_is_a_timeout() {
    case(
        "one byte every 2 s",
        Answer::Trickle(b"*2\r\n:1\r\n:1\r\n".to_vec(), Duration::from_secs(2)),
        &[ErrorKind::Timeout],
        &[ErrorKind::Timeout],
    )
    .await;
}
