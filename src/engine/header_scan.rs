//! Header lookups by name that scan a small map instead of hashing the
//! name: the request path asks a request's map for about a dozen names it
//! usually does not have (`Upgrade`, `TE`, `Cookie`, `Content-Length`,
//! `Connection`...), and most requests carry a handful of fields.
//!
//! `http::HeaderMap::get` hashes the name and probes the map's index:
//! about 110 instructions for a standard name, present or not. A map of
//! at most [`SCAN_UP_TO`] distinct names is searched entry by entry
//! instead (a standard name compares as one byte, a few instructions an
//! entry); a larger one is looked up as before. A name a small map has
//! is then looked up by its hash for its values: the scan answers only
//! absence, the usual answer for the names asked. Both give the same
//! answer (a property test checks it); only the cost differs.

use http::header::{HeaderMap, HeaderName, HeaderValue, ValueIter};

/// Distinct names up to which a map is scanned rather than hashed: past
/// this a scan's comparisons cost more than the hash and the probe.
pub(crate) const SCAN_UP_TO: usize = 8;

/// Lookups by name for the request path ([`HeaderMap`]'s own `get`,
/// `contains_key` and `get_all`, answered alike).
pub(crate) trait Scan {
    /// The first value of `name`, as `HeaderMap::get`.
    fn first(&self, name: &HeaderName) -> Option<&HeaderValue>;
    /// Whether `name` is present, as `HeaderMap::contains_key`.
    fn has(&self, name: &HeaderName) -> bool;
    /// Every value of `name` in order, as `HeaderMap::get_all(..).iter()`.
    fn all_of(&self, name: &HeaderName) -> Values<'_>;
}

impl Scan for HeaderMap {
    fn first(&self, name: &HeaderName) -> Option<&HeaderValue> {
        if absent_by_scan(self, name) {
            return None;
        }
        self.get(name)
    }

    fn has(&self, name: &HeaderName) -> bool {
        if self.keys_len() > SCAN_UP_TO {
            return self.contains_key(name);
        }
        self.keys().any(|k| k == name)
    }

    fn all_of(&self, name: &HeaderName) -> Values<'_> {
        if absent_by_scan(self, name) {
            return Values(None);
        }
        Values(Some(self.get_all(name).iter()))
    }
}

/// True when `map` is small and its names (a slice cheaper to walk than
/// its lines with their values) do not include `name`; a present name's
/// values are then looked up by its hash (a scan of every line for them
/// cost more than the hash).
fn absent_by_scan(map: &HeaderMap, name: &HeaderName) -> bool {
    map.keys_len() <= SCAN_UP_TO && !map.keys().any(|k| k == name)
}

/// The values of one name ([`Scan::all_of`]): none, without a lookup, when
/// a small map does not have it.
pub(crate) struct Values<'a>(Option<ValueIter<'a, HeaderValue>>);

impl<'a> Iterator for Values<'a> {
    type Item = &'a HeaderValue;

    fn next(&mut self) -> Option<&'a HeaderValue> {
        self.0.as_mut()?.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Names the request path asks for, and others a map may hold.
    const NAMES: [&str; 12] = [
        "host",
        "upgrade",
        "connection",
        "te",
        "cookie",
        "content-length",
        "transfer-encoding",
        "x-request-id",
        "accept",
        "peerlb-trailers",
        "x-custom",
        "user-agent",
    ];

    proptest! {
        /// Every lookup answers what `HeaderMap`'s own gives, below and
        /// above the scan's limit, with repeated names and custom ones.
        #[test]
        fn a_scan_answers_as_the_maps_own_lookup(
            lines in prop::collection::vec((0..NAMES.len(), 0u8..4), 0..24),
        ) {
            let mut map = HeaderMap::new();
            for (n, v) in &lines {
                let value = HeaderValue::from_str(&format!("v{v}")).unwrap();
                map.append(HeaderName::from_static(NAMES[*n]), value);
            }
            for name in NAMES {
                let name = HeaderName::from_static(name);
                prop_assert_eq!(map.first(&name), map.get(&name));
                prop_assert_eq!(map.has(&name), map.contains_key(&name));
                let scanned: Vec<_> = map.all_of(&name).collect();
                let hashed: Vec<_> = map.get_all(&name).iter().collect();
                prop_assert_eq!(scanned, hashed);
            }
        }
    }
}
