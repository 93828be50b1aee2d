//! turmoil's simulated sockets behind the node's I/O seam ([`crate::Env`]):
//! a client listener, quinn's `AsyncUdpSocket`, and a virtual wall clock.

use std::cell::RefCell;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use quinn::udp::{RecvMeta, Transmit};

use crate::env::{Accepted, Clock, Connection, HttpListener};

/// A turmoil TCP listener as a node's client listener.
pub struct SimListener(pub turmoil::net::TcpListener);

impl HttpListener for SimListener {
    fn accept(&mut self) -> Accepted<'_> {
        Box::pin(async move {
            let (s, a) = self.0.accept().await?;
            Ok((Box::new(s) as Box<dyn Connection>, a))
        })
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

type Readable = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

thread_local! {
    /// Peer-layer (QUIC) datagrams sent by every node of the simulation
    /// running on this thread, per virtual second (index: whole seconds of
    /// [`super::trace::now`]).
    static PEER_DATAGRAMS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Takes (and resets) the count of peer-layer datagrams sent by every node
/// on this thread's simulation, per virtual second: `v[s]` is the count in
/// `[s, s + 1)` s.
pub fn take_peer_datagrams() -> Vec<u64> {
    PEER_DATAGRAMS.with_borrow_mut(std::mem::take)
}

/// A turmoil UDP socket as quinn's `AsyncUdpSocket`: one datagram per
/// transmit (no GSO/GRO), no ECN, always writable (turmoil's UDP has no
/// back-pressure).
pub struct SimUdp {
    socket: Arc<turmoil::net::UdpSocket>,
    /// The address quinn is told it is bound to (turmoil binds 0.0.0.0).
    local: SocketAddr,
    /// The pending readiness wait of the one task that receives.
    readable: Mutex<Option<Readable>>,
}

impl std::fmt::Debug for SimUdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimUdp")
            .field("local", &self.local)
            .finish()
    }
}

impl SimUdp {
    /// Binds `0.0.0.0:<port of addr>` on the current turmoil host; quinn
    /// sees `addr` as its local address.
    ///
    /// # Errors
    /// turmoil's bind error (port in use).
    pub async fn bind(addr: SocketAddr) -> io::Result<SimUdp> {
        let socket = turmoil::net::UdpSocket::bind(("0.0.0.0", addr.port())).await?;
        Ok(SimUdp {
            socket: Arc::new(socket),
            local: addr,
            readable: Mutex::new(None),
        })
    }
}

#[derive(Debug)]
struct AlwaysWritable;

impl quinn::UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Largest peer datagram the simulated network carries: a 1,500-byte
/// Ethernet path (less the IPv4 and UDP headers). turmoil carries any
/// size, so quinn's path MTU discovery would otherwise climb to peerlb's
/// 6,500-byte bound on every connection, each probe padded to its size,
/// and the receiver parses padding one byte at a time (a third of a
/// 100-node run's start-up went there); production paths are mostly
/// Ethernet too.
pub(crate) const PATH_MTU_PAYLOAD: usize = 1500 - 20 - 8;

impl quinn::AsyncUdpSocket for SimUdp {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn quinn::UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let second = super::trace::now().as_secs() as usize;
        PEER_DATAGRAMS.with_borrow_mut(|v| {
            if v.len() <= second {
                v.resize(second + 1, 0);
            }
            v[second] += 1;
        });
        if transmit.contents.len() > PATH_MTU_PAYLOAD {
            // Lost on the way, as on a real path (no ICMP comes back).
            return Ok(());
        }
        self.socket
            .try_send_to(transmit.contents, transmit.destination)
            .map(|_| ())
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut n = 0;
            while n < bufs.len().min(meta.len()) {
                match self.socket.try_recv_from(&mut bufs[n]) {
                    Ok((len, from)) => {
                        meta[n] = RecvMeta {
                            addr: from,
                            len,
                            stride: len,
                            ecn: None,
                            dst_ip: None,
                        };
                        n += 1;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            let mut slot = self.readable.lock().expect("readable lock");
            let wait = slot.get_or_insert_with(|| {
                let s = self.socket.clone();
                Box::pin(async move { s.readable().await })
            });
            match wait.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => {
                    *slot = None;
                    r?;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    fn may_fragment(&self) -> bool {
        false
    }
}

/// The simulation's wall clock: a fixed epoch plus the simulation's
/// elapsed virtual time (see [`crate::sim::trace::now`]).
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    /// Wall-clock time at virtual time zero.
    pub epoch: SystemTime,
}

impl Clock for SimClock {
    fn now(&self) -> SystemTime {
        self.epoch + super::trace::now()
    }
}

/// Virtual wall-clock time zero of every simulation: 2026-01-01T00:00:00Z.
pub fn sim_epoch() -> SystemTime {
    std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}
