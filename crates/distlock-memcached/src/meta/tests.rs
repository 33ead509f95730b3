//! The pipeline against a scripted server on loopback: what a connection reads for each
//! request, when one is refused, and when the replies come after the client gave up.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

fn pool(addr: String, response_timeout: Duration) -> Pool {
    Pool::new(
        addr,
        Duration::from_secs(2),
        response_timeout,
        #[cfg(feature = "tls")]
        None,
    )
}

fn mg<'a>(key: &'a str, tag: &'a str) -> Request<'a> {
    Request {
        args: vec![Arg::Word("mg"), Arg::Word(key)],
        data: None,
        tag,
    }
}

/// Reads from `s` until `lines` more request lines have come.
async fn read_lines(s: &mut TcpStream, lines: usize) {
    let mut seen = 0;
    let mut buf = [0u8; 1024];
    while seen < lines {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "the client closed the connection");
        seen += buf[..n].iter().filter(|&&b| b == b'\n').count();
    }
}

/// One request of three is refused with an error line: it gets the error, the two others their
/// replies, and the connection is kept for the next request (the server accepts one only).
#[tokio::test]
async fn an_error_line_in_a_pipeline_answers_its_own_request_only() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        read_lines(&mut s, 3).await;
        s.write_all(b"HD c1\r\nCLIENT_ERROR bad data chunk\r\nHD c3\r\n")
            .await
            .unwrap();
        read_lines(&mut s, 1).await;
        s.write_all(b"EN\r\n").await.unwrap();
        // Held open until the client is done.
        let _ = s.read(&mut [0u8; 16]).await;
    });
    let p = pool(addr, Duration::from_secs(2));
    let out = p
        .call_many(&[mg("a", "t1"), mg("b", "t2"), mg("c", "t3")])
        .await;
    assert_eq!(out.len(), 3);
    assert_eq!(out[0].as_ref().ok().and_then(|r| r.cas), Some(1));
    let e = out[1].as_ref().expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Protocol);
    assert!(e.message().contains("bad data chunk"), "{e}");
    assert_eq!(out[2].as_ref().ok().and_then(|r| r.cas), Some(3));
    let next = tokio::time::timeout(Duration::from_secs(2), p.call(&[Arg::Word("mg")], None))
        .await
        .expect("answered on the same connection");
    assert_eq!(next.expect("a reply").code, "EN");
    assert!(!p.has_orphans());
    drop(p);
    server.await.unwrap();
}

/// The server answers a pipeline only after the client gave up on it: the connection is kept
/// with its replies unread, and settling any of its tags reads them all, each handed over with
/// its own tag.
#[tokio::test]
async fn a_pipeline_given_up_is_settled_whole_by_any_of_its_tags() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (late, answer) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        read_lines(&mut s, 2).await;
        answer.await.unwrap();
        s.write_all(b"HD c5\r\nHD c6\r\n").await.unwrap();
        let _ = s.read(&mut [0u8; 16]).await;
    });
    let p = pool(addr, Duration::from_millis(200));
    let out = p.call_many(&[mg("a", "t1"), mg("b", "t2")]).await;
    assert!(
        out.iter()
            .all(|r| r.as_ref().is_err_and(|e| e.kind() == ErrorKind::Timeout)),
        "{out:?}"
    );
    assert!(p.has_orphans());
    assert_eq!(
        p.orphaned_tags(),
        ["t1".to_owned(), "t2".to_owned()].into_iter().collect()
    );
    late.send(()).unwrap();
    let mut read = Vec::new();
    p.settle("t2", &mut |tag, r| read.push((tag.to_owned(), r.cas)))
        .await
        .expect("settled");
    assert_eq!(
        read,
        [("t1".to_owned(), Some(5)), ("t2".to_owned(), Some(6))]
    );
    assert!(!p.has_orphans());
    // Nothing left for the other tag.
    p.settle("t1", &mut |_, _| panic!("read twice"))
        .await
        .expect("nothing to read");
    drop(p);
    server.await.unwrap();
}
