//! Interim (1xx) responses from an HTTP/2 server's service (peerlb's
//! patch: hyper 1.12 has no way for a service to send one, though h2's
//! `SendResponse::send_informational` does).

/// Sends interim (1xx) responses on the HTTP/2 stream of the request it
/// was found in (a request extension the HTTP/2 server inserts), before
/// the service's final response. Each is written when the stream is next
/// polled; those sent after the final response are dropped.
#[derive(Clone, Debug)]
pub struct Http2Informational(
    pub(crate) futures_channel::mpsc::UnboundedSender<http::Response<()>>,
);

impl Http2Informational {
    /// Queues `response` (its status must be 1xx, not 101) for the stream.
    /// False once the stream has sent its final response or ended.
    pub fn send(&self, response: http::Response<()>) -> bool {
        self.0.unbounded_send(response).is_ok()
    }
}
