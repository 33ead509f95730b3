//! An etcd that answers wrongly: a tiny server on a loopback port, either plain TCP that
//! never speaks HTTP/2 (garbage, a close, one byte every 2 s), or a real HTTP/2 server (the
//! `h2` crate, as under tonic) that answers every gRPC call with a broken reply: a truncated
//! message, a length prefix of 4 GiB - 1, the wrong protobuf type, 200,000 nested groups, an
//! error status, one byte every 2 s. The first call that reaches the server is the probe of
//! `EtcdBackend::connect`; each case must end it with a typed error within the response
//! timeout times the sends (each member twice) and a margin, with no panic and no large
//! allocation (a counting allocator watches the whole test binary).

use std::time::Duration;

use distlock_core::ErrorKind;
use distlock_etcd::EtcdBackend;
use distlock_testkit::wrong_server::{Counting, expect_error, listen};
use prost::bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[global_allocator]
static ALLOC: Counting = Counting;

/// The client's response timeout, in the URL.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(1500);
/// How many times a request may be sent to the one member (each member twice).
const SENDS: u32 = 2;

/// What a plain TCP server does with a connection (it never speaks HTTP/2).
#[derive(Clone)]
enum Tcp {
    /// These bytes, then the connection closed.
    ThenClose(Vec<u8>),
    /// These bytes one at a time, `gap` apart.
    Trickle(Vec<u8>, Duration),
}

/// What an HTTP/2 server answers every gRPC call with.
#[derive(Clone)]
enum Grpc {
    /// Status 200 and gRPC headers, then these bytes as the body, then `grpc-status: 0`.
    Body(Vec<u8>),
    /// Headers, then these bytes, the stream kept open.
    BodyOpen(Vec<u8>),
    /// Headers, then these bytes one at a time, `gap` apart.
    Trickle(Vec<u8>, Duration),
    /// A trailers-only answer with this `grpc-status` and message.
    Status(u16, &'static str),
}

async fn serve_tcp(mut stream: TcpStream, answer: Tcp) {
    // Reads what the client sends meanwhile (its preface), so its writes never block.
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(50), stream.read(&mut buf)).await;
    match answer {
        Tcp::ThenClose(bytes) => {
            let _ = stream.write_all(&bytes).await;
        }
        Tcp::Trickle(bytes, gap) => {
            for b in bytes {
                if stream.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(gap).await;
            }
        }
    }
}

/// A gRPC frame: the compression flag, a 32-bit length, and `message`.
fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    out.extend_from_slice(message);
    out
}

async fn answer_call(mut respond: h2::server::SendResponse<Bytes>, answer: Grpc) {
    let headers = |status: Option<(u16, &str)>| {
        let mut b = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc");
        if let Some((code, message)) = status {
            b = b
                .header("grpc-status", code.to_string())
                .header("grpc-message", message);
        }
        b.body(()).unwrap()
    };
    if let Grpc::Status(code, message) = answer {
        let _ = respond.send_response(headers(Some((code, message))), true);
        return;
    }
    let Ok(mut send) = respond.send_response(headers(None), false) else {
        return;
    };
    match answer {
        Grpc::Body(bytes) => {
            let _ = send.send_data(Bytes::from(bytes), false);
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let _ = send.send_trailers(trailers);
        }
        Grpc::BodyOpen(bytes) => {
            let _ = send.send_data(Bytes::from(bytes), false);
            // Kept open until the client gives up.
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Grpc::Trickle(bytes, gap) => {
            for b in bytes {
                if send.send_data(Bytes::copy_from_slice(&[b]), false).is_err() {
                    return;
                }
                tokio::time::sleep(gap).await;
            }
        }
        Grpc::Status(..) => unreachable!(),
    }
}

async fn serve_h2(stream: TcpStream, answer: Grpc) {
    let Ok(mut conn) = h2::server::handshake(stream).await else {
        return;
    };
    // Accepting drives the connection, the answers' frames included.
    while let Some(Ok((_request, respond))) = conn.accept().await {
        tokio::spawn(answer_call(respond, answer.clone()));
    }
}

/// A server on a free port that serves each connection with `serve`; returns its etcd URL.
async fn server<F, Fut>(serve: F) -> String
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let port = listen(serve).await;
    format!(
        "etcd://127.0.0.1:{port}?response_timeout={}ms&connect_timeout=1s",
        RESPONSE_TIMEOUT.as_millis()
    )
}

/// Connects to the server at `url` (the probe is the first request), and checks that it ends
/// with an error of one of `kinds` in time, with no large allocation.
async fn case(what: &str, url: String, kinds: &[ErrorKind]) {
    let budget = RESPONSE_TIMEOUT * SENDS;
    expect_error(what, budget, kinds, EtcdBackend::connect(&url)).await;
}

async fn tcp_case(what: &str, answer: Tcp, kinds: &[ErrorKind]) {
    let url = server(move |stream| serve_tcp(stream, answer.clone())).await;
    case(what, url, kinds).await;
}

async fn grpc_case(what: &str, answer: Grpc, kinds: &[ErrorKind]) {
    let url = server(move |stream| serve_h2(stream, answer.clone())).await;
    case(what, url, kinds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_http2_is_a_connection_error() {
    tcp_case(
        "garbage",
        Tcp::ThenClose(b"+OK\r\nHTTP/1.1 200 OK\r\n\r\n\x00\x01\x02garbage".to_vec()),
        &[ErrorKind::Connection, ErrorKind::Protocol],
    )
    .await;
    tcp_case(
        "closed at once",
        Tcp::ThenClose(Vec::new()),
        &[ErrorKind::Connection],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_every_few_seconds_before_http2_is_a_timeout() {
    tcp_case(
        "TCP: one byte every 2 s",
        Tcp::Trickle(vec![0; 64], Duration::from_secs(2)),
        &[ErrorKind::Timeout],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_grpc_message_is_a_protocol_error() {
    let mut bytes = frame(&[0x0a; 100]);
    bytes.truncate(20);
    grpc_case(
        "truncated message",
        Grpc::Body(bytes),
        &[ErrorKind::Protocol],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_prefix_of_4_gib_is_refused_unallocated() {
    let mut bytes = vec![0, 0xff, 0xff, 0xff, 0xff];
    bytes.extend_from_slice(&[0x0a; 64]);
    grpc_case(
        "length prefix 4 GiB - 1",
        Grpc::BodyOpen(bytes),
        &[ErrorKind::Protocol],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_protobuf_type_is_a_protocol_error() {
    for (what, message) in [
        // RangeResponse's header (field 1, a message) as a varint.
        ("a varint for a message", vec![0x08, 0x01]),
        // Its count (field 4, a varint) as a string.
        ("a string for a varint", vec![0x22, 0x03, b'a', b'b', b'c']),
        // A key-value (field 2) whose length runs past the message.
        ("a length past the end", vec![0x12, 0x7f, 0x0a]),
        ("a varint of 11 bytes", {
            let mut m = vec![0x20];
            m.extend_from_slice(&[0xff; 11]);
            m
        }),
    ] {
        grpc_case(what, Grpc::Body(frame(&message)), &[ErrorKind::Protocol]).await;
    }
    // A compressed message, where no compression was agreed.
    let mut bytes = frame(&[0x20, 0x01]);
    bytes[0] = 1;
    grpc_case(
        "a compressed message",
        Grpc::Body(bytes),
        &[ErrorKind::Protocol],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_thousand_nested_groups_are_a_protocol_error() {
    // Field 15's start-group tag, 200,000 times: prost skips an unknown group by recursion.
    grpc_case(
        "200,000 nested groups",
        Grpc::Body(frame(&[0x7b; 200_000])),
        &[ErrorKind::Protocol],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_status_is_a_typed_error() {
    grpc_case(
        "grpc-status 13",
        Grpc::Status(13, "boom"),
        &[ErrorKind::Protocol],
    )
    .await;
    grpc_case(
        "grpc-status 14",
        Grpc::Status(14, "down"),
        &[ErrorKind::Connection],
    )
    .await;
    grpc_case(
        "grpc-status 99",
        Grpc::Status(99, "what"),
        &[ErrorKind::Protocol],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_every_few_seconds_of_grpc_is_a_timeout() {
    grpc_case(
        "gRPC: one byte every 2 s",
        Grpc::Trickle(frame(&[0x20, 0x01]), Duration::from_secs(2)),
        &[ErrorKind::Timeout],
    )
    .await;
}
