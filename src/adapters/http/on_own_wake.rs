//! A future polled only when it wakes ([`OnOwnWake`]): the drain signal
//! beside a client connection in one `select!` (`server.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

/// A future polled only on its first poll and after its own waker was
/// woken: for a future beside a busy one in a `select!` (the drain signal
/// beside a client connection), whose task wakes for the busy one far
/// more often than for it. `F` sees its own waker, which marks it woken
/// and wakes the task's.
pub(crate) struct OnOwnWake<F> {
    inner: Pin<Box<F>>,
    wake: Arc<OwnWake>,
    /// `wake` as a waker, made once.
    waker: std::task::Waker,
}

/// [`OnOwnWake`]'s waker: whether the inner future was woken since its
/// last poll, and the task to wake.
struct OwnWake {
    woken: AtomicBool,
    task: futures_util::task::AtomicWaker,
}

impl std::task::Wake for OwnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future> OnOwnWake<F> {
    /// `inner`, to be polled on its first poll and after its own wakes.
    pub(crate) fn new(inner: F) -> OnOwnWake<F> {
        let wake = Arc::new(OwnWake {
            // Polled once first, to register its waker.
            woken: AtomicBool::new(true),
            task: futures_util::task::AtomicWaker::new(),
        });
        OnOwnWake {
            inner: Box::pin(inner),
            waker: std::task::Waker::from(wake.clone()),
            wake,
        }
    }
}

impl<F: Future> Future for OnOwnWake<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        // Registered before the flag is read: a wake after the read finds
        // this task's waker and polls again.
        this.wake.task.register(cx.waker());
        if !this.wake.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;
    use std::task::Waker;
    use std::time::Duration;

    use tokio::sync::watch;

    use super::*;

    /// A future that counts its polls, keeps its last waker, and is ready
    /// once `ready` is set.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        ready: AtomicBool,
        waker: Mutex<Option<Waker>>,
    }

    struct Polled(Arc<Probe>);

    impl Future for Polled {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0.polls.fetch_add(1, Ordering::Relaxed);
            *self.0.waker.lock().unwrap() = Some(cx.waker().clone());
            if self.0.ready.load(Ordering::Relaxed) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    /// The task's waker: counts its wakes.
    struct Task(AtomicUsize);

    impl std::task::Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Polled once to start, then only after its own waker fired, which
    /// wakes the task: a poll of the task for anything else leaves the
    /// inner future alone.
    #[test]
    fn on_own_wake_polls_its_future_only_when_that_future_was_woken() {
        let probe = Arc::new(Probe::default());
        let task = Arc::new(Task(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let mut f = Box::pin(OnOwnWake::new(Polled(probe.clone())));
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert_eq!(probe.polls.load(Ordering::Relaxed), 1);
        // The task woke for its other futures: the inner one is not polled.
        for _ in 0..3 {
            assert!(f.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(probe.polls.load(Ordering::Relaxed), 1);
        // Its own wake (spurious: still pending) wakes the task and earns
        // one poll.
        probe.waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(task.0.load(Ordering::Relaxed), 1);
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert_eq!(probe.polls.load(Ordering::Relaxed), 2);
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert_eq!(probe.polls.load(Ordering::Relaxed), 2);
        // Ready, and woken: the next poll completes.
        probe.ready.store(true, Ordering::Relaxed);
        probe.waker.lock().unwrap().take().unwrap().wake();
        assert!(f.as_mut().poll(&mut cx).is_ready());
        assert_eq!(probe.polls.load(Ordering::Relaxed), 3);
    }

    /// The drain signal through it, in a task of its own (polled again
    /// only when woken): a watch receiver's wait resolves on the change,
    /// its wake passed on by the wrapper.
    #[tokio::test]
    async fn on_own_wake_passes_the_drain_signal() {
        let (tx, mut rx) = watch::channel(false);
        let stop = tokio::spawn(OnOwnWake::new(async move {
            let _ = rx.wait_for(|s| *s).await;
        }));
        // Its first poll (one thread: the spawned task runs here).
        tokio::task::yield_now().await;
        assert!(!stop.is_finished());
        tx.send_replace(true);
        // Bounded: a wake that does not get through would hang the test.
        tokio::time::timeout(Duration::from_secs(10), stop)
            .await
            .expect("the drain signal got through")
            .unwrap();
    }
}
