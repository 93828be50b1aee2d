//! A node's status endpoint (`GET /_peerlb/status`) read over HTTP/1.1
//! with hyper's client: which process answers and what it sees.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// Longest one status read may take (connect, request, whole body).
const READ_WITHIN: Duration = Duration::from_secs(2);

/// The pid of the node answering on `addr` and the number of serving
/// members in its view, from its status endpoint; `None` when nothing
/// answers within [`READ_WITHIN`], the answer is not a 200, or its JSON
/// lacks `pid` or `serving`.
pub(super) async fn serving_count(addr: SocketAddr) -> Option<(u32, usize)> {
    let body = tokio::time::timeout(READ_WITHIN, get(addr, "/_peerlb/status"))
        .await
        .ok()??;
    parse(&body)
}

/// `GET path` on `addr`: the body of a 200 answer.
async fn get(addr: SocketAddr, path: &str) -> Option<Bytes> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    let conn = tokio::spawn(conn);
    let req = http::Request::get(path)
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .ok()?;
    let res = send.send_request(req).await.ok()?;
    let ok = res.status() == http::StatusCode::OK;
    // Read to the end (the connection is then done with) even when the
    // status is wrong.
    let body = res.into_body().collect().await.ok()?.to_bytes();
    drop(send);
    let _ = conn.await;
    ok.then_some(body)
}

/// `(pid, serving members)` from a status document.
fn parse(body: &[u8]) -> Option<(u32, usize)> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some((
        u32::try_from(v["pid"].as_u64()?).ok()?,
        v["serving"].as_array()?.len(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_reads_pid_and_serving_members() {
        let doc = br#"{"pid": 4242, "serving": ["n1", "n2", "n3"], "members": []}"#;
        assert_eq!(parse(doc), Some((4242, 3)));
        assert_eq!(parse(br#"{"serving": []}"#), None);
        assert_eq!(parse(br#"{"pid": 1}"#), None);
        assert_eq!(parse(b"not json"), None);
    }

    #[tokio::test]
    async fn serving_count_reads_a_node_status_over_http() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut b = [0u8; 1];
                s.read_exact(&mut b).await.unwrap();
                head.push(b[0]);
            }
            let body = r#"{"pid": 7, "serving": ["n1", "n2"]}"#;
            let res = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(res.as_bytes()).await.unwrap();
            String::from_utf8(head).unwrap()
        });
        assert_eq!(serving_count(addr).await, Some((7, 2)));
        let head = server.await.unwrap();
        assert!(
            head.starts_with("GET /_peerlb/status HTTP/1.1\r\n"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn serving_count_is_none_when_nothing_listens() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        assert_eq!(serving_count(addr).await, None);
    }
}
