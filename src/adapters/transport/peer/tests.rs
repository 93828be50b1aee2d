//! Unit tests of the peer layer's pure parts: the stream allowance, the
//! transport settings, the span quinn's drivers run in.

use super::*;

#[test]
fn the_stream_allowance_doubles_at_half_use_up_to_the_cap() {
    assert_eq!(more_streams(1, FIRST_STREAMS), None);
    assert_eq!(
        more_streams(FIRST_STREAMS / 2, FIRST_STREAMS),
        Some(2 * FIRST_STREAMS)
    );
    let mut allowed = FIRST_STREAMS;
    for open in 1..=MAX_STREAMS {
        if let Some(more) = more_streams(open, allowed) {
            assert!(more > allowed);
            allowed = more;
        }
        // Room for as many more again as are open, until the cap.
        assert!(allowed >= (2 * open).min(MAX_STREAMS), "{open}: {allowed}");
    }
    assert_eq!(allowed, MAX_STREAMS);
    assert_eq!(more_streams(MAX_STREAMS, MAX_STREAMS), None);
}

/// quinn's driver of a new connection runs in the debug span
/// `peer_driver` when that is enabled, else in no span at all: never in
/// the info-level span of the task that made the connection (which every
/// poll of the driver would enter and exit).
#[test]
fn connections_are_made_outside_the_callers_span() {
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt;
    let addr: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    let name = |s: &tracing::Span| s.metadata().map(|m| m.name());
    let info = tracing_subscriber::registry().with(LevelFilter::INFO);
    tracing::subscriber::with_default(info, || {
        let _link = tracing::info_span!("peer_link").entered();
        assert_eq!(name(&tracing::Span::current()), Some("peer_link"));
        let inside = outside_spans(addr, tracing::Span::current);
        assert!(inside.is_none(), "{:?}", name(&inside));
        assert_eq!(name(&tracing::Span::current()), Some("peer_link"));
    });
    let debug = tracing_subscriber::registry().with(LevelFilter::DEBUG);
    tracing::subscriber::with_default(debug, || {
        let _link = tracing::info_span!("peer_link").entered();
        let inside = outside_spans(addr, tracing::Span::current);
        assert_eq!(name(&inside), Some("peer_driver"));
    });
}
