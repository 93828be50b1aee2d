//! The built-in app's WebSocket echo, `/ws/echo`: the opening handshake
//! (RFC 6455 section 4.2) answered here, then every text and binary
//! message echoed back by tungstenite's framing on an in-process duplex
//! whose other end travels in the 101's extensions as a [`Tunnel`] (the
//! node relays it like an upstream app's upgraded connection).
//!
//! A text message `close` makes the app close the WebSocket itself (close
//! code 1000, reason `app closed`): the app-initiated close the tests use.

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode, header};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use crate::adapters::body::{self, Body};
use crate::adapters::tunnel::{self, Tunnel};

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::app::websocket";

/// The path of the echo.
pub(crate) const PATH: &str = "/ws/echo";

/// In-process buffer between the relay and the echo, in bytes.
const DUPLEX_BYTES: usize = 64 * 1024;

/// Largest message the echo takes, in bytes.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

fn refuse(status: StatusCode, msg: &'static str) -> Response<Body> {
    let mut r = Response::new(body::full(msg));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    if status == StatusCode::UPGRADE_REQUIRED {
        let h = r.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
    }
    r
}

/// Answers `/ws/echo`: 101 and the echo for a valid WebSocket opening
/// request; 426 for a request that is not one (or another version than
/// 13); 400 for a missing or malformed `Sec-WebSocket-Key`.
pub(crate) fn answer(req: &Request<Body>) -> Response<Body> {
    let h = req.headers();
    if !tunnel::wants_websocket(req.method(), req.version(), h) {
        return refuse(
            StatusCode::UPGRADE_REQUIRED,
            "want a WebSocket upgrade (GET, Connection: Upgrade, Upgrade: websocket)\n",
        );
    }
    if h.get(header::SEC_WEBSOCKET_VERSION)
        .map(HeaderValue::as_bytes)
        != Some(b"13")
    {
        return refuse(
            StatusCode::UPGRADE_REQUIRED,
            "want Sec-WebSocket-Version: 13\n",
        );
    }
    let key = match h.get(header::SEC_WEBSOCKET_KEY) {
        Some(k)
            if base64::engine::general_purpose::STANDARD
                .decode(k.as_bytes())
                .is_ok_and(|b| b.len() == 16) =>
        {
            k.as_bytes()
        }
        _ => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "want a Sec-WebSocket-Key of 16 bytes in base64\n",
            );
        }
    };
    let accept = HeaderValue::from_str(&tunnel::accept_key(key)).expect("base64 is a header value");
    let (ours, theirs) = tokio::io::duplex(DUPLEX_BYTES);
    tokio::spawn(echo(ours));
    let mut r = Response::new(body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let hm = r.headers_mut();
    hm.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    hm.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    hm.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    r.extensions_mut().insert(Tunnel::ready(Box::new(theirs)));
    r
}

/// Echoes text and binary messages until the close handshake ends (either
/// side's), then drops its end (the relay passes the end on).
async fn echo(io: tokio::io::DuplexStream) {
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(MAX_MESSAGE);
    config.max_frame_size = Some(MAX_MESSAGE);
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
    while let Some(msg) = ws.next().await {
        let sent = match msg {
            Ok(Message::Text(t)) if t.as_str() == "close" => {
                ws.close(Some(CloseFrame {
                    code: CloseCode::Normal,
                    reason: "app closed".into(),
                }))
                .await
            }
            Ok(m @ (Message::Text(_) | Message::Binary(_))) => ws.send(m).await,
            // Pings are answered by tungstenite; a close is answered by it
            // too, and the stream then ends.
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::debug!(target: LOG, error = %e, "websocket echo: peer broke the protocol");
                return;
            }
        };
        if let Err(e) = sent {
            tracing::debug!(target: LOG, error = %e, "websocket echo: send failed");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgrade(key: Option<&'static str>, version: &'static str) -> Request<Body> {
        let mut b = Request::get(PATH)
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", version);
        if let Some(k) = key {
            b = b.header("sec-websocket-key", k);
        }
        b.body(body::empty()).unwrap()
    }

    #[tokio::test]
    async fn a_valid_opening_gets_101_and_a_tunnel_others_a_4xx() {
        let r = answer(&upgrade(Some("dGhlIHNhbXBsZSBub25jZQ=="), "13"));
        assert_eq!(r.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(
            r.headers()[header::SEC_WEBSOCKET_ACCEPT],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert!(r.extensions().get::<Tunnel>().is_some());
        let plain = Request::get(PATH).body(body::empty()).unwrap();
        assert_eq!(answer(&plain).status(), StatusCode::UPGRADE_REQUIRED);
        let v8 = answer(&upgrade(Some("dGhlIHNhbXBsZSBub25jZQ=="), "8"));
        assert_eq!(v8.status(), StatusCode::UPGRADE_REQUIRED);
        assert_eq!(
            answer(&upgrade(None, "13")).status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            answer(&upgrade(Some("short"), "13")).status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test]
    async fn the_echo_answers_messages_and_closes_when_asked() {
        let r = answer(&upgrade(Some("dGhlIHNhbXBsZSBub25jZQ=="), "13"));
        let t = r.extensions().get::<Tunnel>().unwrap().clone();
        let io = t.open().await.unwrap();
        let mut client = WebSocketStream::from_raw_socket(io, Role::Client, None).await;
        client
            .send(Message::binary(vec![7u8; 100_000]))
            .await
            .unwrap();
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::binary(vec![7u8; 100_000])
        );
        client.send(Message::text("close")).await.unwrap();
        match client.next().await.unwrap().unwrap() {
            Message::Close(Some(f)) => assert_eq!(f.code, CloseCode::Normal),
            m => panic!("want a close, got {m:?}"),
        }
        // The close handshake completes and the stream ends.
        assert!(client.next().await.is_none());
    }
}
