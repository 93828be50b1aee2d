//! Failover and replay: whether a request can be sent again to the next
//! candidate, and what the entry node does after an attempt on one
//! candidate failed.
//!
//! Pure functions of the request's shape (method, body, `Content-Length`)
//! and of how the attempt failed; the ingress reads the body, opens the
//! streams and applies the answers.
//!
//! A request is **replayable** when it has no body, or when its method is
//! idempotent (RFC 9110 §9.2.2: GET, HEAD, PUT, DELETE, OPTIONS, TRACE) and
//! its `Content-Length` is at most [`REPLAY_LIMIT`]: such a body is read
//! whole before the first attempt and sent again on each. Any other body
//! (chunked, larger, or of a POST or PATCH) streams once.
//!
//! After a failed attempt ([`ReplayPlan::after`]):
//!
//! | failure | may the owner have processed it? | next candidate when |
//! | --- | --- | --- |
//! | [`Failure::Unreachable`] | no | always |
//! | [`Failure::Refused`] | no | the request is replayable (any method) |
//! | [`Failure::HeadTooLarge`] | no (no peer can take it) | replayable and idempotent |
//! | [`Failure::Lost`] | yes | replayable and idempotent |
//! | [`Failure::Timeout`], [`Failure::ClientBody`] | yes | never |

use http::Method;

/// Largest body kept for replay on the next candidate, in bytes (64 KiB),
/// like Envoy's per-request retry buffer.
pub(crate) const REPLAY_LIMIT: u64 = 64 * 1024;

/// True for the idempotent methods of RFC 9110 §9.2.2 that peerlb replays:
/// GET, HEAD, PUT, DELETE, OPTIONS, TRACE.
pub(crate) fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS | Method::TRACE
    )
}

/// How the entry sends a request's body, decided before the first attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyPlan {
    /// The request has no body: every attempt sends none.
    Empty,
    /// Read the body whole (at most [`REPLAY_LIMIT`] bytes) before the first
    /// attempt and send a copy on each.
    Buffer,
    /// Stream the body once, to the first candidate that takes it.
    Stream,
}

/// How an attempt on one candidate failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No connection or stream to the candidate: nothing was sent.
    Unreachable,
    /// The request head does not fit a peer frame: nothing was sent, and no
    /// peer can take it (the entry itself still may).
    HeadTooLarge,
    /// The owner refused the stream before processing it (shutting down).
    Refused,
    /// The stream or connection failed after the head was sent, before the
    /// response head: the owner may have processed the request.
    Lost,
    /// No response head within the response timeout.
    Timeout,
    /// The client's own request body failed (malformed, cut off, stalled).
    ClientBody,
}

/// What the entry does after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Try the next candidate.
    NextCandidate,
    /// Answer the client with this failure's error.
    Fail,
}

/// The replay plan of one request: how its body is sent and whether it may
/// be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplayPlan {
    body: BodyPlan,
    idempotent: bool,
}

impl ReplayPlan {
    /// The plan for a request with `method`, whose body is empty
    /// (`body_empty`: the client sent no body, or an empty one) or announces
    /// `content_length` bytes (`None`: chunked, or no valid
    /// `Content-Length`).
    pub(crate) fn new(
        method: &Method,
        body_empty: bool,
        content_length: Option<u64>,
    ) -> ReplayPlan {
        let idempotent = is_idempotent(method);
        let body = if body_empty {
            BodyPlan::Empty
        } else if idempotent && content_length.is_some_and(|n| n <= REPLAY_LIMIT) {
            BodyPlan::Buffer
        } else {
            BodyPlan::Stream
        };
        ReplayPlan { body, idempotent }
    }

    /// How the body is sent.
    pub(crate) fn body(&self) -> BodyPlan {
        self.body
    }

    /// True when every attempt can send the whole request: no body, or a
    /// buffered one.
    pub(crate) fn replayable(&self) -> bool {
        self.body != BodyPlan::Stream
    }

    /// What the entry does after an attempt failed with `failure` (see the
    /// module doc's table).
    pub(crate) fn after(&self, failure: Failure) -> AfterFailure {
        let next = match failure {
            Failure::Unreachable => true,
            Failure::Refused => self.replayable(),
            Failure::HeadTooLarge | Failure::Lost => self.replayable() && self.idempotent,
            Failure::Timeout | Failure::ClientBody => false,
        };
        if next {
            AfterFailure::NextCandidate
        } else {
            AfterFailure::Fail
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotent_methods() {
        assert!(is_idempotent(&Method::GET));
        assert!(is_idempotent(&Method::PUT));
        assert!(!is_idempotent(&Method::POST));
        assert!(!is_idempotent(&Method::PATCH));
    }

    #[test]
    fn small_idempotent_bodies_are_buffered_and_others_stream() {
        let plan = |m: Method, empty, len| ReplayPlan::new(&m, empty, len).body();
        assert_eq!(plan(Method::GET, true, None), BodyPlan::Empty);
        assert_eq!(plan(Method::POST, true, Some(0)), BodyPlan::Empty);
        assert_eq!(plan(Method::PUT, false, Some(10)), BodyPlan::Buffer);
        assert_eq!(
            plan(Method::PUT, false, Some(REPLAY_LIMIT)),
            BodyPlan::Buffer
        );
        assert_eq!(
            plan(Method::PUT, false, Some(REPLAY_LIMIT + 1)),
            BodyPlan::Stream
        );
        // Chunked: the length is unknown, so the body cannot be held back.
        assert_eq!(plan(Method::PUT, false, None), BodyPlan::Stream);
        assert_eq!(plan(Method::POST, false, Some(10)), BodyPlan::Stream);
        assert_eq!(plan(Method::PATCH, false, Some(10)), BodyPlan::Stream);
    }

    #[test]
    fn an_unreachable_candidate_is_always_skipped() {
        for (m, empty, len) in [
            (Method::POST, false, None),
            (Method::GET, true, None),
            (Method::PUT, false, Some(1 << 20)),
        ] {
            let p = ReplayPlan::new(&m, empty, len);
            assert_eq!(p.after(Failure::Unreachable), AfterFailure::NextCandidate);
        }
    }

    #[test]
    fn a_refused_request_is_retried_when_replayable_whatever_its_method() {
        let post_empty = ReplayPlan::new(&Method::POST, true, None);
        assert_eq!(
            post_empty.after(Failure::Refused),
            AfterFailure::NextCandidate
        );
        let get_buffered = ReplayPlan::new(&Method::GET, false, Some(5));
        assert_eq!(
            get_buffered.after(Failure::Refused),
            AfterFailure::NextCandidate
        );
        let post_streamed = ReplayPlan::new(&Method::POST, false, Some(5));
        assert_eq!(post_streamed.after(Failure::Refused), AfterFailure::Fail);
        let put_large = ReplayPlan::new(&Method::PUT, false, Some(REPLAY_LIMIT + 1));
        assert_eq!(put_large.after(Failure::Refused), AfterFailure::Fail);
    }

    #[test]
    fn a_request_the_owner_may_have_processed_is_retried_only_when_idempotent_and_replayable() {
        for failure in [Failure::Lost, Failure::HeadTooLarge] {
            let get = ReplayPlan::new(&Method::GET, true, None);
            assert_eq!(
                get.after(failure),
                AfterFailure::NextCandidate,
                "{failure:?}"
            );
            let put = ReplayPlan::new(&Method::PUT, false, Some(REPLAY_LIMIT));
            assert_eq!(
                put.after(failure),
                AfterFailure::NextCandidate,
                "{failure:?}"
            );
            // A POST without a body is replayable, but not idempotent.
            let post = ReplayPlan::new(&Method::POST, true, None);
            assert_eq!(post.after(failure), AfterFailure::Fail, "{failure:?}");
            let chunked = ReplayPlan::new(&Method::PUT, false, None);
            assert_eq!(chunked.after(failure), AfterFailure::Fail, "{failure:?}");
        }
    }

    #[test]
    fn timeouts_and_client_body_failures_are_never_retried() {
        let get = ReplayPlan::new(&Method::GET, true, None);
        assert_eq!(get.after(Failure::Timeout), AfterFailure::Fail);
        assert_eq!(get.after(Failure::ClientBody), AfterFailure::Fail);
    }
}
