//! The relay and the budget on bodies made in the test: one frame at a
//! time, the stall cut on paused time, and the budget's choice of whom to
//! cut.

use std::collections::VecDeque;

use super::*;

/// A body of the given frames, then its end; an empty frame in the list
/// is one `Pending` instead (nothing has arrived yet).
struct Frames {
    frames: VecDeque<Bytes>,
    /// Announced as a length (a forwarded answer has one usually).
    rest: u64,
}

fn frames(sizes: &[usize]) -> Frames {
    Frames {
        frames: sizes.iter().map(|&n| Bytes::from(vec![7u8; n])).collect(),
        rest: sizes.iter().sum::<usize>() as u64,
    }
}

impl HttpBody for Frames {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let f = self.frames.pop_front();
        if let Some(f) = &f {
            if f.is_empty() {
                return Poll::Pending;
            }
            self.rest -= f.len() as u64;
        }
        Poll::Ready(f.map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest)
    }
}

/// Polls `relay` once with a no-op waker.
fn poll(relay: &mut Relay<Frames>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(relay).poll_frame(&mut cx)
}

/// The data of a frame the relay handed on.
fn data(p: Poll<Option<Result<Frame<Bytes>, BodyError>>>) -> Bytes {
    match p {
        Poll::Ready(Some(Ok(f))) => f.into_data().expect("a data frame"),
        other => panic!("want a data frame, got {other:?}"),
    }
}

const MIB: u64 = 1 << 20;

fn budget(limit: u64, window: u64, stall: Duration) -> Arc<ResponseBudget> {
    ResponseBudget::new(limit, window, stall, Arc::default())
}

#[tokio::test(start_paused = true)]
async fn the_next_frame_waits_until_the_client_connection_lets_go_of_the_last() {
    let budget = budget(MIB, 0, Duration::from_secs(60));
    let mut relay = Relay::new(frames(&[1000, 2000]), Some(budget.clone()), false, None);
    let first = data(poll(&mut relay));
    assert_eq!(first.len(), 1000);
    assert_eq!(budget.held(), 1000);
    // The connection still holds the first frame: no second one yet.
    assert!(poll(&mut relay).is_pending());
    // Slices of the frame keep it held until the last is gone.
    let tail = first.slice(500..);
    drop(first);
    assert!(poll(&mut relay).is_pending());
    drop(tail);
    assert_eq!(budget.held(), 0);
    assert_eq!(data(poll(&mut relay)).len(), 2000);
    assert!(matches!(poll(&mut relay), Poll::Ready(None)));
    assert_eq!(budget.held(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_frame_the_client_does_not_take_within_the_send_timeout_ends_the_body() {
    let stall = Duration::from_secs(60);
    let budget = budget(MIB, 0, stall);
    let mut relay = Relay::new(frames(&[1000, 2000]), Some(budget.clone()), false, None);
    let first = data(poll(&mut relay));
    assert!(poll(&mut relay).is_pending());
    tokio::time::advance(stall - Duration::from_millis(1)).await;
    assert!(poll(&mut relay).is_pending(), "not before the send timeout");
    tokio::time::advance(Duration::from_millis(1)).await;
    match poll(&mut relay) {
        Poll::Ready(Some(Err(BodyError::Stalled(d)))) => assert_eq!(d, stall),
        other => panic!("want Stalled, got {other:?}"),
    }
    assert!(matches!(poll(&mut relay), Poll::Ready(None)));
    assert_eq!(budget.counts.stalled.load(Ordering::Relaxed), 1);
    drop(first);
    assert_eq!(budget.held(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_frame_taken_in_time_restarts_the_stall_clock() {
    let stall = Duration::from_secs(10);
    let budget = budget(MIB, 0, stall);
    let mut relay = Relay::new(frames(&[10, 10, 10]), Some(budget.clone()), false, None);
    for _ in 0..3 {
        let f = data(poll(&mut relay));
        assert!(poll(&mut relay).is_pending());
        tokio::time::advance(stall - Duration::from_millis(1)).await;
        assert!(poll(&mut relay).is_pending());
        drop(f);
    }
    assert!(matches!(poll(&mut relay), Poll::Ready(None)));
    assert_eq!(budget.counts.stalled.load(Ordering::Relaxed), 0);
}

/// A forwarded answer whose stream had data waiting is charged its
/// window (twice: `WINDOW_PINS`) until a read finds the stream empty or
/// the body ends; at most what is left of the body.
#[tokio::test(start_paused = true)]
async fn a_forwarded_answer_is_charged_its_peer_window_while_its_stream_has_a_backlog() {
    const W: u64 = 256 * 1024;
    let budget = budget(16 * MIB, W, Duration::from_secs(60));
    let mut relay = Relay::new(frames(&[1000, 100]), Some(budget.clone()), true, None);
    let f = data(poll(&mut relay));
    assert_eq!(budget.held(), 1000 + WINDOW_PINS * 100);
    drop(f);
    // The frame is gone, the backlog's charge stays.
    assert_eq!(budget.held(), WINDOW_PINS * 100);
    let last = data(poll(&mut relay));
    // Nothing more to come: no window.
    assert_eq!(budget.held(), 100);
    drop(last);
    assert_eq!(budget.held(), 0);

    let mut relay = Relay::new(
        frames(&[1000, 0, 4000, 1 << 20]),
        Some(budget.clone()),
        true,
        None,
    );
    let f = data(poll(&mut relay));
    assert_eq!(budget.held(), 1000 + WINDOW_PINS * W);
    drop(f);
    assert_eq!(budget.held(), WINDOW_PINS * W);
    // The stream is read empty: no backlog.
    assert!(poll(&mut relay).is_pending());
    assert_eq!(budget.held(), 0);
    let f = data(poll(&mut relay));
    assert_eq!(budget.held(), 4000 + WINDOW_PINS * W);
    drop(f);
    drop(relay);
    assert_eq!(budget.held(), 0, "a dropped relay releases its backlog");

    // A local answer is charged its frames only.
    let mut relay = Relay::new(frames(&[1000, 1 << 20]), Some(budget.clone()), false, None);
    let f = data(poll(&mut relay));
    assert_eq!(budget.held(), 1000);
    drop(f);
    assert_eq!(budget.held(), 0);
}

#[tokio::test(start_paused = true)]
async fn past_the_budget_the_largest_holder_is_cut_and_the_new_frame_still_goes() {
    let budget = budget(10_000, 0, Duration::from_secs(60));
    let mut small = Relay::new(frames(&[2_000, 1]), Some(budget.clone()), false, None);
    let mut large = Relay::new(frames(&[6_000, 1]), Some(budget.clone()), false, None);
    let mut mid = Relay::new(frames(&[4_000, 1]), Some(budget.clone()), false, None);
    let s = data(poll(&mut small));
    let l = data(poll(&mut large));
    assert!(poll(&mut small).is_pending() && poll(&mut large).is_pending());
    assert_eq!(
        budget.counts.budget.load(Ordering::Relaxed),
        0,
        "8,000 bytes fit"
    );
    // 12,000 bytes: the largest (6,000) is cut, the new frame goes.
    let m = data(poll(&mut mid));
    assert_eq!(m.len(), 4_000);
    assert_eq!(budget.counts.budget.load(Ordering::Relaxed), 1);
    assert!(matches!(
        poll(&mut large),
        Poll::Ready(Some(Err(BodyError::OverBudget)))
    ));
    assert!(poll(&mut small).is_pending(), "the others go on");
    assert!(poll(&mut mid).is_pending());
    // The cut one's frame is released when the connection lets go of it
    // (the stream reset, the connection closed).
    drop(l);
    drop(large);
    assert_eq!(budget.held(), 6_000);
    drop((s, m));
    assert_eq!(budget.held(), 0);
    assert_eq!(data(poll(&mut small)).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn of_equal_holders_the_one_without_progress_for_longest_is_cut() {
    let budget = budget(2_500, 0, Duration::from_secs(60));
    let mut old = Relay::new(frames(&[1_000, 1]), Some(budget.clone()), false, None);
    let o = data(poll(&mut old));
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut young = Relay::new(frames(&[1_000, 1]), Some(budget.clone()), false, None);
    let y = data(poll(&mut young));
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut newest = Relay::new(frames(&[1_000, 1]), Some(budget.clone()), false, None);
    let n = data(poll(&mut newest));
    assert_eq!(budget.counts.budget.load(Ordering::Relaxed), 1);
    assert!(matches!(
        poll(&mut old),
        Poll::Ready(Some(Err(BodyError::OverBudget)))
    ));
    assert!(poll(&mut young).is_pending());
    assert!(poll(&mut newest).is_pending());
    drop((o, y, n));
    assert_eq!(budget.held(), 0);
}

/// A holder cut while its relay waits is woken, so hyper polls it and
/// meets the error (an HTTP/2 stream waiting for its frame to drain).
#[tokio::test(start_paused = true)]
async fn a_waiting_relay_is_woken_when_it_is_cut() {
    let budget = budget(1_500, 0, Duration::from_secs(60));
    let mut victim = Relay::new(frames(&[1_000, 1]), Some(budget.clone()), false, None);
    let v = data(poll(&mut victim));
    let waiting = tokio::spawn(async move {
        std::future::poll_fn(|cx| Pin::new(&mut victim).poll_frame(cx)).await
    });
    tokio::task::yield_now().await;
    let mut other = Relay::new(frames(&[800, 1]), Some(budget.clone()), false, None);
    let o = data(poll(&mut other));
    let got = waiting.await.unwrap();
    assert!(matches!(got, Some(Err(BodyError::OverBudget))), "{got:?}");
    drop((v, o));
    assert_eq!(budget.held(), 0);
}

/// A relay waiting for its frame to be let go is woken when it is, and
/// hands on the next frame (an HTTP/2 stream whose window opened).
#[tokio::test(start_paused = true)]
async fn a_relay_waiting_for_its_frame_is_woken_when_the_frame_is_let_go() {
    let budget = budget(MIB, 0, Duration::from_secs(60));
    let mut relay = Relay::new(frames(&[1_000, 2_000]), Some(budget.clone()), false, None);
    let first = data(poll(&mut relay));
    let next = tokio::spawn(async move {
        std::future::poll_fn(|cx| Pin::new(&mut relay).poll_frame(cx)).await
    });
    tokio::task::yield_now().await;
    assert!(!next.is_finished(), "it waits while the frame is held");
    drop(first);
    let got = tokio::time::timeout(Duration::from_secs(1), next)
        .await
        .expect("woken")
        .unwrap();
    assert_eq!(got.unwrap().unwrap().into_data().unwrap().len(), 2_000);
}

/// On HTTP/2 (no connection given) the end of a body is told only once
/// its last frame was let go, so a stream whose client never takes it is
/// still cut at the send timeout; on HTTP/1.1 at once.
#[tokio::test(start_paused = true)]
async fn on_http2_the_end_waits_for_the_last_frame_and_meets_the_stall_cut() {
    let stall = Duration::from_secs(60);
    let budget = budget(MIB, 0, stall);
    let mut relay = Relay::new(frames(&[1_000]), Some(budget.clone()), false, None);
    let last = data(poll(&mut relay));
    assert!(!relay.is_end_stream(), "the last frame is still held");
    assert!(poll(&mut relay).is_pending());
    drop(last);
    assert!(relay.is_end_stream());
    assert!(matches!(poll(&mut relay), Poll::Ready(None)));

    let mut relay = Relay::new(frames(&[1_000]), Some(budget.clone()), false, None);
    let last = data(poll(&mut relay));
    assert!(poll(&mut relay).is_pending());
    tokio::time::advance(stall).await;
    assert!(matches!(
        poll(&mut relay),
        Poll::Ready(Some(Err(BodyError::Stalled(_))))
    ));
    drop(last);

    // HTTP/1.1: the end is told with the last frame.
    let table = crate::adapters::http::ConnTable::with_tunnels(10, 10, stall, 100);
    let admitted = table.admit("127.0.0.1".parse().unwrap(), false).unwrap();
    let conn = Some(admitted.state.clone());
    let mut relay = Relay::new(frames(&[1_000]), Some(budget.clone()), false, conn);
    let last = data(poll(&mut relay));
    assert!(relay.is_end_stream());
    drop(last);
}

/// A one-frame answer is charged but not registered (no lock of the
/// registry): the budget cannot cut it, and it never holds more than that
/// frame.
#[tokio::test(start_paused = true)]
async fn a_one_frame_answer_is_charged_but_never_cut() {
    let budget = budget(1_500, 0, Duration::from_secs(60));
    let mut one = Relay::new(frames(&[1_000]), Some(budget.clone()), false, None);
    let o = data(poll(&mut one));
    assert!(budget.holders.lock().unwrap().is_empty());
    let mut two = Relay::new(frames(&[1_000, 1]), Some(budget.clone()), false, None);
    let t = data(poll(&mut two));
    assert_eq!(budget.held(), 2_000);
    // Over the budget: the registered one is cut, the one-frame one not.
    assert!(matches!(
        poll(&mut two),
        Poll::Ready(Some(Err(BodyError::OverBudget)))
    ));
    drop(o);
    assert!(matches!(poll(&mut one), Poll::Ready(None)));
    drop((t, one, two));
    assert_eq!(budget.held(), 0);
    assert!(budget.holders.lock().unwrap().is_empty());
}

/// On HTTP/1.1 (the end is told with the last frame, `hold_end` off) a
/// one-frame answer has no holder at all: its lease charges the node's
/// total until the client connection lets go of it, a charge past the
/// budget cuts the registered answer beside it, and the budget's cut
/// passes the one-frame answer by.
#[tokio::test(start_paused = true)]
async fn an_http_1_one_frame_answer_is_charged_without_a_holder() {
    let budget = budget(1_500, 0, Duration::from_secs(60));
    let mut two = Relay::new(frames(&[1_000, 1]), Some(budget.clone()), false, None);
    two.hold_end = false;
    let t = data(poll(&mut two));
    assert!(two.holder.is_some());
    assert_eq!(budget.held(), 1_000);
    // The one-frame answer's charge passes the budget: the registered
    // answer is cut, the new frame still goes.
    let mut one = Relay::new(frames(&[1_000]), Some(budget.clone()), false, None);
    one.hold_end = false;
    let o = data(poll(&mut one));
    assert!(one.holder.is_none());
    assert!(one.is_end_stream());
    assert_eq!(budget.held(), 2_000);
    assert!(matches!(
        poll(&mut two),
        Poll::Ready(Some(Err(BodyError::OverBudget)))
    ));
    // Its end was told with the frame; polled again, it ends.
    assert!(matches!(poll(&mut one), Poll::Ready(None)));
    // Its charge goes when the client connection lets go of the frame.
    drop(o);
    assert_eq!(budget.held(), 1_000);
    drop((t, one, two));
    assert_eq!(budget.held(), 0);
    assert!(budget.holders.lock().unwrap().is_empty());
}

#[tokio::test]
async fn without_a_budget_the_body_is_passed_on_as_it_is() {
    let mut relay = Relay::new(frames(&[1000, 2000]), None, true, None);
    let f = data(poll(&mut relay));
    // The second frame comes though the first is still held.
    assert_eq!(data(poll(&mut relay)).len(), 2000);
    drop(f);
}
