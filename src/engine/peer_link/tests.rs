//! The link choice's rules, one test each (module doc).

use super::*;

const S: Duration = Duration::from_secs(1);

const W: Windows = Windows {
    linger: Duration::from_secs(5),
    usable: Duration::from_secs(7),
};

/// An open, quiet, current connection established (and last busy) at `at`
/// seconds.
fn link(dialled: bool, at: u64) -> LinkFacts {
    LinkFacts {
        dialled,
        legacy: false,
        open: true,
        retired: false,
        streams: 0,
        last_busy: S * at as u32,
        established: S * at as u32,
        predates_pause: false,
    }
}

fn ids() -> (NodeId, NodeId) {
    (NodeId::from("n1"), NodeId::from("n2"))
}

#[test]
fn the_smaller_ids_dial_wins_at_both_ends_of_a_pair() {
    let (a, b) = ids();
    assert!(dialler_wins(&a, &b));
    assert!(!dialler_wins(&b, &a));
    // n1's own dial (newer) and n2's (accepted, older): both keep n1's.
    let at_n1 = [link(false, 1), link(true, 0)];
    let c = choose(&a, &b, &at_n1, S * 2, W);
    assert_eq!(
        c,
        Choice {
            chosen: Some(1),
            retire: vec![0]
        }
    );
    // At n2 the same two connections, seen the other way round.
    let at_n2 = [link(true, 1), link(false, 0)];
    let c = choose(&b, &a, &at_n2, S * 2, W);
    assert_eq!(
        c,
        Choice {
            chosen: Some(1),
            retire: vec![0]
        }
    );
}

#[test]
fn of_two_connections_dialled_by_the_same_end_the_newest_is_kept() {
    let (a, b) = ids();
    let links = [link(true, 0), link(true, 2), link(true, 1)];
    assert_eq!(
        choose(&a, &b, &links, S * 3, W),
        Choice {
            chosen: Some(1),
            retire: vec![0, 2]
        }
    );
}

#[test]
fn a_quiet_connection_is_usable_for_linger_and_the_usable_window_then_not() {
    let (a, b) = ids();
    let links = [link(true, 0)];
    let end = W.linger + W.usable;
    assert_eq!(choose(&a, &b, &links, end - S, W).chosen, Some(0));
    assert_eq!(choose(&a, &b, &links, end, W), Choice::default());
    // Busy (a stream open) keeps it usable however long ago it started.
    let busy = [LinkFacts {
        streams: 1,
        ..links[0]
    }];
    assert_eq!(choose(&a, &b, &busy, end * 10, W).chosen, Some(0));
    // A `peerlb/1` connection is usable while open.
    let legacy = [LinkFacts {
        legacy: true,
        ..links[0]
    }];
    assert_eq!(choose(&a, &b, &legacy, end * 10, W).chosen, Some(0));
    let closed = [LinkFacts {
        open: false,
        ..legacy[0]
    }];
    assert_eq!(choose(&a, &b, &closed, S, W), Choice::default());
}

#[test]
fn a_retired_connection_carries_no_new_stream_and_is_not_retired_again() {
    let (a, b) = ids();
    let links = [
        LinkFacts {
            retired: true,
            ..link(true, 3)
        },
        link(false, 0),
    ];
    assert_eq!(
        choose(&a, &b, &links, S * 4, W),
        Choice {
            chosen: Some(1),
            retire: vec![]
        }
    );
}

#[test]
fn after_a_pause_connections_from_before_it_are_retired_and_a_new_one_dialled() {
    let (a, b) = ids();
    let before = LinkFacts {
        predates_pause: true,
        streams: 2,
        ..link(true, 0)
    };
    assert_eq!(
        choose(&a, &b, &[before], S, W),
        Choice {
            chosen: None,
            retire: vec![0]
        }
    );
    // A connection made after the pause is kept; the old one retired.
    let links = [before, link(false, 5)];
    assert_eq!(
        choose(&a, &b, &links, S * 6, W),
        Choice {
            chosen: Some(1),
            retire: vec![0]
        }
    );
}

#[test]
fn a_connection_the_peer_dialled_retires_the_quiet_ones_older_than_a_dial() {
    let timeout = S * 2;
    let busy = LinkFacts {
        streams: 1,
        ..link(true, 0)
    };
    let links = [link(true, 0), busy, link(true, 9)];
    // At 10 s: the first is quiet and 10 s old; the second busy; the
    // third only 1 s old (a dial of its own may still be completing).
    assert_eq!(retire_on_register(&links, true, S * 10, timeout), vec![0]);
    // A connection this node dialled, or a `peerlb/1` one, retires nothing.
    assert!(retire_on_register(&links, false, S * 10, timeout).is_empty());
}
