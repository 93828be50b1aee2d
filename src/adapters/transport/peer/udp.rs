//! The peer endpoint's UDP socket for quinn on tokio, registered with the
//! reactor for reads only.
//!
//! quinn's own tokio socket (`quinn::TokioRuntime::wrap_udp_socket`)
//! registers for reads and writes, edge-triggered. Linux signals a UDP
//! socket writable each time a datagram it sent is freed
//! (`sock_def_write_space`: on loopback during the send itself, on a
//! network card at its transmit completion), so every datagram a node
//! sent came back to it as an `EPOLLOUT` event with nothing to do: one
//! `epoll_wait` more per datagram, and a whole wakeup (a context switch)
//! whenever the completion came after the node had gone to sleep. Here:
//!
//! - A send is a plain non-blocking `sendmsg`. Only after a send refused
//!   for a full buffer (`EAGAIN`, rare on UDP) does quinn's check before
//!   each send wait for writability, on a duplicate of the socket
//!   registered for writes for that one wait (epoll keys a registration by
//!   file and descriptor, so the duplicate has its own) and deregistered
//!   as soon as it reports.
//! - A read that returns fewer datagrams than it asked for clears the
//!   socket's read readiness: the queue was empty at that moment, so the
//!   `recvmmsg` that would only have said so (`EAGAIN`) is skipped. A
//!   datagram queued later raises a new edge: Linux signals a UDP socket
//!   readable for every datagram queued (`sock_def_readable`), and tokio
//!   clears readiness only if no event arrived since it reported it.
//!
//! What the two bought is in docs/performance.md, "The peer socket:
//! datagrams and wakeups".
//!
//! - Receive offload (UDP GRO) is turned off: quinn copies each batch the
//!   kernel coalesced (up to 64 datagrams) into one allocation, and every
//!   stream chunk it carried keeps that allocation alive. A stream whose
//!   client stopped reading then pins whole batches that carried other
//!   streams: 300 HTTP/1.1 clients that never read their forwarded answers
//!   held about 2 MB each in their entry with 256 KiB stream windows,
//!   against about 0.5 MB without GRO (tests/backpressure.rs; one
//!   allocation per datagram then, and quinn's receive buffer is 32
//!   datagrams instead of 32 x 64).

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use quinn::udp::{self, RecvMeta, Transmit, UdpSocketState};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A bound, non-blocking UDP socket as quinn's [`quinn::AsyncUdpSocket`],
/// registered with the current tokio runtime for reads only (module doc).
pub(crate) struct PeerUdpSocket {
    io: AsyncFd<std::net::UdpSocket>,
    state: UdpSocketState,
    /// The last send was refused for a full buffer: pollers wait for room
    /// until one of them sees it.
    full: AtomicBool,
    /// Receive offload is off on the socket: one datagram per receive
    /// buffer (module doc).
    gro_off: bool,
}

impl PeerUdpSocket {
    /// Wraps `socket` (bound and non-blocking) for quinn. Must run inside a
    /// tokio runtime with I/O enabled.
    ///
    /// # Errors
    /// quinn-udp could not set the socket options it needs (ECN, GRO,
    /// don't-fragment), or the reactor refused the registration.
    pub(crate) fn wrap(socket: std::net::UdpSocket) -> io::Result<Arc<PeerUdpSocket>> {
        let state = UdpSocketState::new((&socket).into())?;
        let gro_off = gro_off(&socket).is_ok();
        let io = register(socket, Interest::READABLE)?;
        Ok(Arc::new(PeerUdpSocket {
            io,
            state,
            full: AtomicBool::new(false),
            gro_off,
        }))
    }
}

/// Turns UDP receive offload off on `socket` (quinn-udp turned it on).
///
/// # Errors
/// The kernel refused the option (it has no GRO: then quinn-udp found
/// none either).
#[cfg(target_os = "linux")]
// setsockopt(2) through libc: neither std nor socket2 has UDP_GRO.
#[allow(unsafe_code)]
fn gro_off(socket: &std::net::UdpSocket) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let off: libc::c_int = 0;
    // SAFETY: the descriptor is the live socket's; the option value is a
    // c_int that outlives the call, and its size is passed with it.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_GRO,
            (&raw const off).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn gro_off(_: &std::net::UdpSocket) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

impl fmt::Debug for PeerUdpSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerUdpSocket")
            .field("local", &self.io.get_ref().local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl quinn::AsyncUdpSocket for PeerUdpSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn quinn::UdpPoller>> {
        Box::pin(WritableWait {
            socket: self,
            registered: None,
        })
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let sent = self.state.send(self.io.get_ref().into(), transmit);
        if matches!(&sent, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            self.full.store(true, Ordering::Relaxed);
        }
        sent
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let asked = bufs.len().min(meta.len()).min(udp::BATCH_SIZE);
        loop {
            let mut guard = ready!(self.io.poll_read_ready(cx))?;
            match guard.try_io(|io| self.state.recv(io.get_ref().into(), bufs, meta)) {
                Ok(Ok(n)) => {
                    if n < asked {
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(n));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // EAGAIN: `try_io` cleared the readiness; wait for the next edge.
                Err(_would_block) => {}
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().local_addr()
    }

    fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }

    fn max_transmit_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    fn max_receive_segments(&self) -> usize {
        if self.gro_off {
            1
        } else {
            self.state.gro_segments()
        }
    }
}

/// Registers `socket` with the current runtime's reactor for `interest`.
// tokio's `AsyncFd::register_with_interest` is unsafe (an I/O-safety
// condition on the descriptor, kept below).
#[allow(unsafe_code)]
fn register(
    socket: std::net::UdpSocket,
    interest: Interest,
) -> io::Result<AsyncFd<std::net::UdpSocket>> {
    // SAFETY: the `UdpSocket` owns its descriptor, and the `AsyncFd` owns
    // the socket: the descriptor stays open and the same until the
    // `AsyncFd` is dropped (tokio's I/O-safety condition).
    unsafe { AsyncFd::register_with_interest(socket, interest) }.map_err(io::Error::from)
}

/// One task's wait for the socket to take sends again, after
/// [`quinn::AsyncUdpSocket::try_send`] said `WouldBlock`: a duplicate of
/// the socket registered for writes while the wait lasts.
struct WritableWait {
    socket: Arc<PeerUdpSocket>,
    registered: Option<AsyncFd<std::net::UdpSocket>>,
}

impl fmt::Debug for WritableWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WritableWait")
            .field("waiting", &self.registered.is_some())
            .finish_non_exhaustive()
    }
}

impl quinn::UdpPoller for WritableWait {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // quinn asks before every send: without a refused send, the socket
        // is taken to have room (as tokio's cached readiness would say).
        if this.registered.is_none() && !this.socket.full.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        if this.registered.is_none() {
            // Registering a descriptor that is already writable reports it
            // at once (epoll checks the state on `EPOLL_CTL_ADD`), so room
            // freed between the refused send and this line is not missed.
            let dup = this.socket.io.get_ref().try_clone()?;
            this.registered = Some(register(dup, Interest::WRITABLE)?);
        }
        let fd = this.registered.as_ref().expect("registered above");
        let guard = ready!(fd.poll_write_ready(cx));
        drop(guard);
        // Writable (or the registration failed): deregister, and let the
        // caller try its send again.
        this.registered = None;
        this.socket.full.store(false, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn::AsyncUdpSocket as _;
    use std::time::Duration;

    fn bound() -> std::net::UdpSocket {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    fn transmit(to: SocketAddr, contents: &[u8]) -> Transmit<'_> {
        Transmit {
            destination: to,
            ecn: None,
            contents,
            segment_size: None,
            src_ip: None,
        }
    }

    /// Reads what is queued on `sock` within a second, through `poll_recv`.
    async fn recv_some(sock: &PeerUdpSocket) -> Vec<Vec<u8>> {
        let mut storage = vec![0u8; 64 * 1024 * udp::BATCH_SIZE];
        let mut bufs: Vec<IoSliceMut<'_>> =
            storage.chunks_mut(64 * 1024).map(IoSliceMut::new).collect();
        let mut meta = vec![RecvMeta::default(); udp::BATCH_SIZE];
        let n = tokio::time::timeout(
            Duration::from_secs(1),
            std::future::poll_fn(|cx| sock.poll_recv(cx, &mut bufs, &mut meta)),
        )
        .await
        .expect("a datagram within a second")
        .unwrap();
        (0..n).map(|i| bufs[i][..meta[i].len].to_vec()).collect()
    }

    /// A datagram sent after a short read (which cleared the readiness
    /// without an `EAGAIN`) still wakes the reader: the edge of its arrival
    /// is not lost.
    #[tokio::test]
    async fn a_datagram_after_a_short_read_still_wakes_the_reader() {
        let a = PeerUdpSocket::wrap(bound()).unwrap();
        let b = PeerUdpSocket::wrap(bound()).unwrap();
        let to_b = b.local_addr().unwrap();
        a.try_send(&transmit(to_b, b"one")).unwrap();
        assert_eq!(recv_some(&b).await, vec![b"one".to_vec()]);
        // The read above was short (1 of BATCH_SIZE): readiness is clear.
        // The next datagram must raise a new edge.
        a.try_send(&transmit(to_b, b"two")).unwrap();
        a.try_send(&transmit(to_b, b"three")).unwrap();
        let mut got = recv_some(&b).await;
        if got.len() < 2 {
            got.extend(recv_some(&b).await);
        }
        assert_eq!(got, vec![b"two".to_vec(), b"three".to_vec()]);
    }

    /// Receive offload is off: a batch of three datagrams sent in one GSO
    /// call (where the kernel has GSO) arrives as three datagrams, each in
    /// its own receive buffer, and quinn is told to expect one per buffer.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn datagrams_arrive_one_per_receive_buffer() {
        let a = PeerUdpSocket::wrap(bound()).unwrap();
        let b = PeerUdpSocket::wrap(bound()).unwrap();
        assert_eq!(b.max_receive_segments(), 1);
        let to_b = b.local_addr().unwrap();
        let contents = [[1u8; 100], [2u8; 100], [3u8; 100]].concat();
        let segment_size = (a.max_transmit_segments() > 1).then_some(100);
        if segment_size.is_some() {
            a.try_send(&Transmit {
                segment_size,
                ..transmit(to_b, &contents)
            })
            .unwrap();
        } else {
            for part in contents.chunks(100) {
                a.try_send(&transmit(to_b, part)).unwrap();
            }
        }
        let mut got = Vec::new();
        while got.len() < 3 {
            got.extend(recv_some(&b).await);
        }
        assert_eq!(
            got,
            contents.chunks(100).map(<[u8]>::to_vec).collect::<Vec<_>>()
        );
    }

    /// quinn asks the poller before every send: without a refused send it
    /// answers at once, with no registration (no `epoll_ctl`, no
    /// duplicate). After one (`EAGAIN`; loopback never refuses a UDP send,
    /// it frees the sender's buffer as it delivers, so the refusal is set
    /// by hand here) it waits on the duplicate's write readiness, which an
    /// idle socket reports at once, and the refusal is forgotten.
    #[tokio::test]
    async fn the_writable_wait_registers_only_after_a_refused_send() {
        let a = PeerUdpSocket::wrap(bound()).unwrap();
        let mut poller = a.clone().create_io_poller();
        let once = std::future::poll_fn(|cx| Poll::Ready(poller.as_mut().poll_writable(cx)));
        assert!(matches!(once.await, Poll::Ready(Ok(()))));
        assert!(
            format!("{poller:?}").contains("waiting: false"),
            "{poller:?}"
        );

        a.full.store(true, Ordering::Relaxed);
        let waited = tokio::time::timeout(
            Duration::from_secs(1),
            std::future::poll_fn(|cx| poller.as_mut().poll_writable(cx)),
        )
        .await
        .expect("an idle socket is writable");
        assert!(waited.is_ok());
        assert!(!a.full.load(Ordering::Relaxed), "the refusal is forgotten");
        assert!(
            format!("{poller:?}").contains("waiting: false"),
            "{poller:?}"
        );
        let to_a = a.local_addr().unwrap();
        a.try_send(&transmit(to_a, b"after")).unwrap();
        assert_eq!(recv_some(&a).await, vec![b"after".to_vec()]);
    }
}
