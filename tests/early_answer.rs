//! Early answers: an app that answers `413` and closes while the client
//! is still uploading. A client that writes its whole body before it
//! reads (as Python's `http.client` does) gets the 413, on the local path
//! and across the hop, every time: the entry reads and discards the rest
//! of the body (up to `limits.early_answer_drain_bytes`) before it closes
//! instead of resetting the connection under the client, and the answer
//! the app sent before it closed wins over the failed upload. Real
//! `peerlb` processes on loopback; the app is a raw socket that answers
//! and closes without reading the body.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers every request with `413` at once and closes, reading nothing
/// of the body (the kernel resets the connection: unread bytes).
async fn refusing_app() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut c, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = c
                    .write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\nconnection: close\r\n\r\ntoo big\n")
                    .await;
            });
        }
    });
    addr
}

/// Writes a whole 512 KiB upload, then reads the answer until the entry
/// closes: the status line, or what went wrong.
fn upload_then_read(entry: SocketAddr, user: &str) -> Result<String, String> {
    let mut s = std::net::TcpStream::connect(entry).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let body = vec![b'x'; 512 * 1024];
    let head = format!(
        "POST /upload?user={user} HTTP/1.1\r\nHost: a\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .map_err(|e| format!("head: {e}"))?;
    s.write_all(&body).map_err(|e| format!("body: {e}"))?;
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if !got.is_empty() => eprintln!("read ended with {e} after {} bytes", got.len()),
        Err(e) => return Err(format!("read: {e}")),
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    Ok(text.lines().next().unwrap_or("").to_owned())
}

/// Six uploads on each path, each answered 413 (none cut with a broken
/// pipe or a reset, none a 502).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_writes_its_whole_body_first_gets_the_early_413_on_both_paths() {
    let app = refusing_app().await;
    let c = Cluster::start(
        "early-answer",
        2,
        &format!("app = \"http://{app}\"\n[ring]\nvnodes = 1024\n{STEADY}"),
        USER_RULES,
    );
    let r = ring(&["n1", "n2"], 1024);
    let local = user_where(&r, |o| o == "n1");
    let remote = user_where(&r, |o| o == "n2");
    let entry = c.nodes[0].http;
    for user in [local, remote] {
        let got = tokio::task::spawn_blocking(move || {
            (0..6)
                .map(|_| upload_then_read(entry, &user))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        for g in &got {
            assert_eq!(
                g.as_deref(),
                Ok("HTTP/1.1 413 Payload Too Large"),
                "every try: {got:?}"
            );
        }
    }
}
