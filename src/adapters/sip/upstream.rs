//! The owner's relay to an upstream SIP server over UDP (`sip_app =
//! "udp:<ip>:<port>"`): one client transaction per request, on its own
//! ephemeral UDP socket connected to the upstream, so the kernel delivers
//! only the upstream's datagrams and a closed port shows as a refused
//! receive. What to send, when to resend and what to relay is decided by
//! `engine::sip::upstream`; this file only sends and waits (tokio time).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;
use tracing::debug;

use super::REQUEST_PATH;
use crate::engine::sip::upstream::{self as up, Received};
use crate::engine::sip::{self as sipmsg, MAX_MESSAGE, SipMessage};

/// An upstream SIP server and how long a transaction with it may take.
#[derive(Debug, Clone)]
pub(crate) struct SipUpstream {
    addr: SocketAddr,
    timeout: Duration,
}

impl SipUpstream {
    /// The server at `addr` (UDP); a request it has not answered finally
    /// within `timeout` is answered `408` by the owner.
    pub(crate) fn new(addr: SocketAddr, timeout: Duration) -> SipUpstream {
        SipUpstream { addr, timeout }
    }

    /// Sends `req` upstream as node `node` and returns the answers to
    /// relay, in order, the owner's `Via` removed: every provisional
    /// answer but `100`, then the final one. An `ACK` is sent once and
    /// has none. Without a final answer within the timeout: `408 Request
    /// Timeout` (RFC 3261 16.7 step 1, 16.8); a transport error (the port
    /// is closed, the socket fails): `503 Service Unavailable` (16.9).
    /// Either generated answer carries `Peerlb-Served-By: <node>`.
    pub(crate) async fn transact(&self, req: &SipMessage, node: &str) -> Vec<SipMessage> {
        let branch = up::branch(req, node);
        let generated = |status: u16, reason: &str| {
            let tag = &branch[branch.len() - 8..];
            let mut r = req.response(status, reason, Some(tag));
            r.headers
                .push((sipmsg::SERVED_BY.to_owned(), node.to_owned()));
            r
        };
        let method = req.method().unwrap_or("");
        let (invite, ack) = (method == "INVITE", method == "ACK");
        let socket = match connected(self.addr).await {
            Ok(s) => s,
            Err(e) => {
                debug!(target: REQUEST_PATH, upstream = %self.addr, error = %e, "sip upstream socket failed");
                return if ack {
                    Vec::new()
                } else {
                    vec![generated(503, "Service Unavailable")]
                };
            }
        };
        let Ok(local) = socket.local_addr() else {
            return if ack {
                Vec::new()
            } else {
                vec![generated(503, "Service Unavailable")]
            };
        };
        let sent = up::upstream_request(req, local, &branch);
        let bytes = sent.to_bytes();
        let mut answers = Vec::new();
        if let Err(e) = socket.send(&bytes).await {
            debug!(target: REQUEST_PATH, upstream = %self.addr, error = %e, "sip upstream send failed");
            if !ack {
                answers.push(generated(503, "Service Unavailable"));
            }
            return answers;
        }
        if ack {
            return answers;
        }
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut transmissions = 1;
        let mut resend = Some(start + up::retransmit_interval(invite, 1));
        let mut buf = vec![0u8; MAX_MESSAGE + 1];
        loop {
            let wake = resend.map_or(deadline, |r| r.min(deadline));
            let got = tokio::select! {
                r = socket.recv(&mut buf) => Some(r),
                _ = tokio::time::sleep_until(wake) => None,
            };
            match got {
                None if Instant::now() >= deadline => {
                    debug!(target: REQUEST_PATH, upstream = %self.addr, "sip upstream gave no final answer in time");
                    answers.push(generated(408, "Request Timeout"));
                    return answers;
                }
                None => {
                    // A lost datagram is resent (RFC 3261 17.1.1.2, 17.1.2.2).
                    let _ = socket.send(&bytes).await;
                    transmissions += 1;
                    resend = Some(Instant::now() + up::retransmit_interval(invite, transmissions));
                }
                Some(Err(e)) => {
                    debug!(target: REQUEST_PATH, upstream = %self.addr, error = %e, "sip upstream transport error");
                    answers.push(generated(503, "Service Unavailable"));
                    return answers;
                }
                Some(Ok(n)) => {
                    let Ok(msg) = sipmsg::parse(&buf[..n]) else {
                        continue;
                    };
                    match up::receive(msg, &branch) {
                        Received::Ignore => {}
                        Received::Trying => resend = (!invite).then(|| Instant::now() + up::T2),
                        Received::Provisional(m) => {
                            resend = (!invite).then(|| Instant::now() + up::T2);
                            answers.push(m);
                        }
                        Received::Final(m) => {
                            if let Some(a) = up::owner_ack(&sent, &m) {
                                let _ = socket.send(&a.to_bytes()).await;
                            }
                            answers.push(m);
                            return answers;
                        }
                    }
                }
            }
        }
    }
}

/// A fresh UDP socket on an ephemeral port, connected to `to`.
async fn connected(to: SocketAddr) -> std::io::Result<UdpSocket> {
    let any: SocketAddr = if to.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any).await?;
    s.connect(to).await?;
    Ok(s)
}
