//! Sticky routes: the node that owns a session, carried by the client.
//!
//! The route travels in the `peerlb-route` cookie, or, when the client refuses
//! cookies, as a path parameter on the last path segment
//! (`/cart;peerlb-route=n1`, the `;jsessionid=` convention of servlet
//! containers and mod_proxy_balancer's `stickysession=...|jsessionid`).
//! The node id is percent-encoded: every byte outside RFC 3986 *unreserved*
//! (`A-Z a-z 0-9 - . _ ~`) becomes `%XX`, which is valid in both a cookie
//! value (RFC 6265) and a path segment.
//!
//! A route is only a hint: the router honours it only when it names a serving
//! member (a forged or stale route gains nothing, cases H4 and C7).
//!
//! Case codes (C7, H4) name cases of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::borrow::Cow;

use crate::engine::header_scan::Scan as _;
use http::HeaderMap;
use http::header::COOKIE;

/// Name of the sticky route cookie.
pub(crate) const ROUTE_COOKIE: &str = "peerlb-route";

/// Name of the sticky route path parameter (`;peerlb-route=<id>`).
pub(crate) const ROUTE_PARAM: &str = "peerlb-route";

/// The sticky route a request carries, decoded, from the route cookies
/// named `cookie` (over all `Cookie` headers, in order) and then the
/// `;peerlb-route=` parameters of the last path segment, empty values
/// skipped: the first that names a member for which `serving` holds, else
/// the first at all (a stale or forged route, which the router ignores and
/// the response replaces). `None` if the request carries none.
///
/// A browser may send two cookies of one name (one per `Path` or domain,
/// RFC 6265 section 5.4 orders them longest path first): a stale one must
/// not hide a valid one.
pub(crate) fn route_from_request(
    headers: &HeaderMap,
    uri: &http::Uri,
    cookie: &str,
    serving: impl Fn(&str) -> bool,
) -> Option<String> {
    let path = uri.path();
    let last = &path[last_segment_start(path)..];
    // Without a `;` the segment has no parameter: nothing to split.
    let last = if last.as_bytes().contains(&b';') {
        last
    } else {
        ""
    };
    let params = last
        .split(';')
        .skip(1)
        .filter_map(|p| p.split_once('='))
        .filter(|(name, _)| *name == ROUTE_PARAM)
        .map(|(_, v)| v);
    let mut first: Option<String> = None;
    for v in cookies(headers)
        .filter(|(name, _)| *name == cookie)
        .map(|c| c.1)
        .chain(params)
        .filter(|v| !v.is_empty())
    {
        let route = percent_decode(v, false);
        if serving(&route) {
            return Some(route.into_owned());
        }
        if first.is_none() {
            first = Some(route.into_owned());
        }
    }
    first
}

/// `SameSite` of the route cookie (RFC 6265bis section 4.1.2.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SameSite {
    /// Sent on same-site requests only.
    Strict,
    /// Also sent on top-level cross-site GET navigations (the default).
    Lax,
    /// Sent on every request, cross-site POSTs included (SAML and OIDC
    /// `form_post` logins); browsers require `Secure` with it.
    None,
}

impl SameSite {
    /// The attribute's value: `Strict`, `Lax` or `None`.
    pub fn as_str(self) -> &'static str {
        match self {
            SameSite::Strict => "Strict",
            SameSite::Lax => "Lax",
            SameSite::None => "None",
        }
    }
}

/// The sticky route cookie's name and attributes (`[sticky]` in the
/// config); the default is `peerlb-route`, `Path=/`, `SameSite=Lax`, not
/// `Secure`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteCookie {
    /// Cookie name: an RFC 6265 token (checked by config validation).
    pub name: String,
    /// `Path` attribute: starts with `/`, no `;` or control characters.
    pub path: String,
    /// `SameSite` attribute.
    pub same_site: SameSite,
    /// Add `Secure` (the client reaches peerlb through HTTPS in front).
    pub secure: bool,
}

impl Default for RouteCookie {
    fn default() -> Self {
        RouteCookie {
            name: ROUTE_COOKIE.to_owned(),
            path: "/".to_owned(),
            same_site: SameSite::Lax,
            secure: false,
        }
    }
}

impl RouteCookie {
    /// The `Set-Cookie` header value that makes the client stick to `node`:
    /// `<name>=<pct-encoded id>; Path=<path>; HttpOnly; SameSite=<s>` and
    /// `; Secure` when set. A valid header value when the name and path
    /// passed config validation.
    pub(crate) fn set_cookie_value(&self, node: &str) -> String {
        format!(
            "{}={}; Path={}; HttpOnly; SameSite={}{}",
            self.name,
            percent_encode(node),
            self.path,
            self.same_site.as_str(),
            if self.secure { "; Secure" } else { "" }
        )
    }
}

/// The sticky-route part of a routing decision under a sticky policy
/// (`Router::is_sticky`): the route the request carried, parsed once by
/// [`route_from_request`] when the router decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Session {
    /// The route the request carried (decoded); `None` when it carried none.
    pub(crate) route: Option<String>,
}

/// A route the response must announce to the client: the route cookie
/// ([`RouteCookie::set_cookie_value`]), the `peerlb-route` response header
/// ([`encode_route_param`]), and with `in_location` the route parameter on
/// `Location` ([`with_route_param`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Announcement {
    /// The request carried its route in the URL (a client that refuses
    /// cookies): `Location` is rewritten to carry the new one.
    pub(crate) in_location: bool,
}

impl Session {
    /// What a response served by `served_by` announces: a route naming
    /// `served_by` when the session starts (the response sets a cookie,
    /// `sets_cookie`) or has moved (the request carried a route naming
    /// another node: a failover, case C7, or a forged or stale route);
    /// nothing when the route it carried already names `served_by`, or when
    /// it carried none and no session starts. `route_in_url`: the request's
    /// last path segment carried a `;peerlb-route=` parameter.
    pub(crate) fn announce(
        &self,
        served_by: &str,
        sets_cookie: bool,
        route_in_url: bool,
    ) -> Option<Announcement> {
        if self.route.as_deref() == Some(served_by) || !(sets_cookie || self.route.is_some()) {
            return None;
        }
        Some(Announcement {
            in_location: route_in_url,
        })
    }
}

/// The path parameter naming `node`, to append to the last path segment of
/// URLs the app emits when cookies are refused: `;peerlb-route=<pct id>`.
pub(crate) fn encode_route_param(node: &str) -> String {
    format!(";{ROUTE_PARAM}={}", percent_encode(node))
}

/// Where the last segment of `path` starts: after its last `/` (a byte
/// loop: on a short path `rfind`'s searcher costs several times as much,
/// and this runs twice per request).
fn last_segment_start(path: &str) -> usize {
    path.bytes().rposition(|b| b == b'/').map_or(0, |i| i + 1)
}

/// Removes every `;peerlb-route=...` parameter from the last segment of
/// `path` (a path without query), keeping other parameters, so the app sees
/// the path it emitted. Borrows when there is nothing to strip.
pub(crate) fn strip_route_param(path: &str) -> Cow<'_, str> {
    let seg_start = last_segment_start(path);
    let last = &path[seg_start..];
    // Most paths have no parameter at all: one byte scan, not `split`'s
    // searcher (about 280 instructions per request).
    if !last.as_bytes().contains(&b';') {
        return Cow::Borrowed(path);
    }
    let is_route = |p: &str| p.split_once('=').map_or(p, |(n, _)| n) == ROUTE_PARAM;
    if !last.split(';').skip(1).any(is_route) {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    out.push_str(&path[..seg_start]);
    let mut parts = last.split(';');
    out.push_str(parts.next().unwrap_or(""));
    for p in parts.filter(|p| !is_route(p)) {
        out.push(';');
        out.push_str(p);
    }
    Cow::Owned(out)
}

/// Rewrites a `Location` value (absolute URL or path) so its last path
/// segment carries `;peerlb-route=<node>` instead of any route it had: how
/// a client that refuses cookies learns its route (servlet `encodeRedirectURL`).
pub(crate) fn with_route_param(location: &str, node: &str) -> String {
    // The path ends at the query or the fragment.
    let end = location.find(['?', '#']).unwrap_or(location.len());
    let (head, tail) = location.split_at(end);
    // In an absolute URL the path starts after "scheme://authority".
    let path_start = head
        .find("://")
        .map(|i| head[i + 3..].find('/').map_or(head.len(), |j| i + 3 + j))
        .unwrap_or(0);
    let (origin, path) = head.split_at(path_start);
    let path = if path.is_empty() { "/" } else { path };
    format!(
        "{origin}{}{}{tail}",
        strip_route_param(path),
        encode_route_param(node)
    )
}

/// Iterates the `name=value` pairs of all `Cookie` headers in order
/// (RFC 6265 §5.4 `a=1; b=2`), names and values trimmed, a value's
/// surrounding double quotes removed. Non-UTF-8 headers and pairs without
/// `=` are skipped.
pub(crate) fn cookies(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .all_of(&COOKIE)
        .filter_map(|v| std::str::from_utf8(v.as_bytes()).ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| {
            let (n, v) = pair.split_once('=')?;
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            Some((n.trim(), v))
        })
}

/// `s` split at every `sep` (an ASCII byte), as `str::split` with a
/// `char` does, by a byte loop: a query is short, and the `char`
/// pattern's searcher cost several times as much per request.
pub(crate) fn split_at_byte(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    debug_assert!(sep.is_ascii());
    let mut from = Some(0);
    std::iter::from_fn(move || {
        let start = from?;
        match s.as_bytes()[start..].iter().position(|&b| b == sep) {
            Some(i) => {
                from = Some(start + i + 1);
                Some(&s[start..start + i])
            }
            None => {
                from = None;
                Some(&s[start..])
            }
        }
    })
}

/// Percent-encodes `s`: every byte outside RFC 3986 unreserved
/// (`A-Z a-z 0-9 - . _ ~`) becomes `%XX` (uppercase hex).
pub(crate) fn percent_encode(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
    out
}

/// Percent-decodes `s` (WHATWG URL rules): `%XX` becomes the byte, a `%` not
/// followed by two hex digits is kept as is, and with `plus_as_space` a `+`
/// becomes a space (`application/x-www-form-urlencoded` query strings).
/// Invalid UTF-8 in the result is replaced by U+FFFD. Borrows when nothing
/// changes.
pub(crate) fn percent_decode(s: &str, plus_as_space: bool) -> Cow<'_, str> {
    let bytes = s.as_bytes();
    if !bytes
        .iter()
        .any(|&b| b == b'%' || (plus_as_space && b == b'+'))
    {
        return Cow::Borrowed(s);
    }
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let pair = bytes
                    .get(i + 1)
                    .copied()
                    .and_then(hex)
                    .zip(bytes.get(i + 2).copied().and_then(hex));
                if let Some((h, l)) = pair {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b'+' if plus_as_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    match String::from_utf8(out) {
        Ok(s) => Cow::Owned(s),
        Err(e) => Cow::Owned(String::from_utf8_lossy(e.as_bytes()).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn location_gets_the_route_param_on_its_last_segment() {
        use super::with_route_param;
        assert_eq!(
            with_route_param("/a/b?x=1", "n2"),
            "/a/b;peerlb-route=n2?x=1"
        );
        assert_eq!(
            with_route_param("/a/b;peerlb-route=n1#top", "n2"),
            "/a/b;peerlb-route=n2#top"
        );
        assert_eq!(
            with_route_param("http://h:80/cart", "n 3"),
            "http://h:80/cart;peerlb-route=n%203"
        );
        assert_eq!(
            with_route_param("http://h", "n1"),
            "http://h/;peerlb-route=n1"
        );
    }

    use super::*;
    use http::{HeaderValue, Uri};

    fn headers(cookies: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for c in cookies {
            h.append(COOKIE, HeaderValue::from_str(c).unwrap());
        }
        h
    }

    const ODD_IDS: [&str; 7] = [
        "n1",
        "10.0.0.1:555",
        "node with spaces",
        "a;b=c,d\"e\\f",
        "ünïcødé/ノード",
        "100%+plus",
        "-._~",
    ];

    #[test]
    fn encode_is_unreserved_only() {
        assert_eq!(percent_encode("10.0.0.1:555"), "10.0.0.1%3A555");
        assert_eq!(percent_encode("a b/ü"), "a%20b%2F%C3%BC");
        assert_eq!(percent_encode("-._~"), "-._~");
        assert_eq!(
            RouteCookie::default().set_cookie_value("s1:1"),
            "peerlb-route=s1%3A1; Path=/; HttpOnly; SameSite=Lax"
        );
        assert_eq!(encode_route_param("s1:1"), ";peerlb-route=s1%3A1");
    }

    #[test]
    fn decode_rules() {
        assert_eq!(percent_decode("a%20b", false), "a b");
        assert_eq!(percent_decode("a+b", false), "a+b");
        assert_eq!(percent_decode("a+b", true), "a b");
        assert_eq!(percent_decode("100%", false), "100%");
        assert_eq!(percent_decode("%4", false), "%4");
        assert_eq!(percent_decode("%zz%41", false), "%zzA");
        assert_eq!(percent_decode("%C3%BC", false), "ü");
        assert_eq!(percent_decode("%FF", false), "\u{FFFD}");
        assert!(matches!(
            percent_decode("plain", true),
            Cow::Borrowed("plain")
        ));
    }

    #[test]
    fn cookie_roundtrip_with_odd_ids() {
        for id in ODD_IDS {
            let set = RouteCookie::default().set_cookie_value(id);
            assert!(HeaderValue::from_str(&set).is_ok(), "{set}");
            // The client echoes name=value (the part before the first ';').
            let echoed = set.split(';').next().unwrap();
            let h = headers(&["theme=dark", echoed]);
            let uri = Uri::from_static("/cart");
            assert_eq!(
                route_from_request(&h, &uri, ROUTE_COOKIE, |_| false).as_deref(),
                Some(id)
            );
        }
    }

    #[test]
    fn param_roundtrip_with_odd_ids() {
        for id in ODD_IDS {
            let path = format!("/shop/cart{}", encode_route_param(id));
            let uri: Uri = format!("{path}?x=1").parse().unwrap();
            assert_eq!(
                route_from_request(&HeaderMap::new(), &uri, ROUTE_COOKIE, |_| false).as_deref(),
                Some(id)
            );
            assert_eq!(strip_route_param(uri.path()), "/shop/cart");
        }
    }

    #[test]
    fn cookie_wins_over_param_and_first_cookie_wins() {
        let uri = Uri::from_static("/a;peerlb-route=p");
        assert_eq!(
            route_from_request(&headers(&["peerlb-route=c"]), &uri, ROUTE_COOKIE, |_| false)
                .as_deref(),
            Some("c")
        );
        let h = headers(&["x=1; peerlb-route=\"first\"", "peerlb-route=second"]);
        assert_eq!(
            route_from_request(&h, &uri, ROUTE_COOKIE, |_| false).as_deref(),
            Some("first")
        );
        // An empty cookie does not hide the parameter.
        assert_eq!(
            route_from_request(&headers(&["peerlb-route="]), &uri, ROUTE_COOKIE, |_| false)
                .as_deref(),
            Some("p")
        );
        assert_eq!(
            route_from_request(&HeaderMap::new(), &uri, ROUTE_COOKIE, |_| false).as_deref(),
            Some("p")
        );
    }

    #[test]
    fn param_only_on_last_segment() {
        let none = |u: &'static str| {
            route_from_request(
                &HeaderMap::new(),
                &Uri::from_static(u),
                ROUTE_COOKIE,
                |_| false,
            )
        };
        assert_eq!(none("/a;peerlb-route=n1/b"), None);
        assert_eq!(
            none("/a;jsessionid=x;peerlb-route=n2").as_deref(),
            Some("n2")
        );
        assert_eq!(none("/a;peerlb-route="), None);
        assert_eq!(none("/a;peerlb-routex=n1"), None);
        assert_eq!(none("/a?peerlb-route=n1"), None);
        assert_eq!(none("/"), None);
    }

    #[test]
    fn strip_keeps_other_params_and_borrows_when_clean() {
        assert!(matches!(strip_route_param("/a/b"), Cow::Borrowed("/a/b")));
        assert!(matches!(
            strip_route_param("/a;peerlb-route=x/b"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            strip_route_param("/a/b;jsessionid=1;peerlb-route=n1;v=2"),
            "/a/b;jsessionid=1;v=2"
        );
        assert_eq!(strip_route_param(";peerlb-route=n1"), "");
        assert_eq!(strip_route_param("/x;peerlb-route"), "/x");
    }

    #[test]
    fn a_route_is_announced_when_a_session_starts_or_moves() {
        let none = Session { route: None };
        let on_n1 = Session {
            route: Some("n1".into()),
        };
        // No route and no session started by the app: nothing to say.
        assert_eq!(none.announce("n1", false, false), None);
        // The app starts a session: it sticks to the node that served it.
        assert_eq!(
            none.announce("n1", true, false),
            Some(Announcement { in_location: false })
        );
        // The route already names the serving node: nothing changes.
        assert_eq!(on_n1.announce("n1", true, true), None);
        assert_eq!(on_n1.announce("n1", false, false), None);
        // A failover moved the session: the new node is announced, in the
        // URL too when the client carried its route there.
        assert_eq!(
            on_n1.announce("n2", false, false),
            Some(Announcement { in_location: false })
        );
        assert_eq!(
            on_n1.announce("n2", false, true),
            Some(Announcement { in_location: true })
        );
    }

    #[test]
    fn cookie_parsing() {
        let h = headers(&["a=1; b = 2 ;c", "d=\"q\"; e=x=y"]);
        let all: Vec<_> = cookies(&h).collect();
        assert_eq!(all, [("a", "1"), ("b", "2"), ("d", "q"), ("e", "x=y")]);
    }
}

#[cfg(test)]
mod route_cookie_tests {
    use super::*;
    use http::header::HeaderValue;

    #[test]
    fn the_first_route_cookie_naming_a_serving_node_counts() {
        let mut h = HeaderMap::new();
        h.append(
            COOKIE,
            HeaderValue::from_static("peerlb-route=gone; peerlb-route=n3"),
        );
        let uri = http::Uri::from_static("/x");
        let serving = |id: &str| ["n1", "n2", "n3"].contains(&id);
        assert_eq!(
            route_from_request(&h, &uri, ROUTE_COOKIE, serving).as_deref(),
            Some("n3")
        );
        // None serving: the first, so the response replaces it.
        assert_eq!(
            route_from_request(&h, &uri, ROUTE_COOKIE, |_| false).as_deref(),
            Some("gone")
        );
        // A stale cookie does not hide a valid path parameter either.
        let uri = http::Uri::from_static("/x;peerlb-route=n2");
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("peerlb-route=gone"));
        assert_eq!(
            route_from_request(&h, &uri, ROUTE_COOKIE, serving).as_deref(),
            Some("n2")
        );
        // Another cookie name is read when configured.
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("peerlb-route=n1; lb=n2"));
        assert_eq!(
            route_from_request(&h, &http::Uri::from_static("/"), "lb", serving).as_deref(),
            Some("n2")
        );
    }

    #[test]
    fn the_route_cookie_attributes_are_configurable() {
        let c = RouteCookie {
            name: "lb".into(),
            path: "/app".into(),
            same_site: SameSite::None,
            secure: true,
        };
        assert_eq!(
            c.set_cookie_value("n 2"),
            "lb=n%202; Path=/app; HttpOnly; SameSite=None; Secure"
        );
        assert_eq!(
            RouteCookie::default().set_cookie_value("n2"),
            "peerlb-route=n2; Path=/; HttpOnly; SameSite=Lax"
        );
    }
}

#[cfg(test)]
mod byte_scan_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The byte loops give what `str`'s `char` patterns give, on any
        /// text (multi-byte characters included) and any ASCII separator.
        #[test]
        fn byte_scans_equal_the_char_patterns(s in "[a-z&=;/%+é日]{0,24}", sep in "[&=;/]") {
            let sep = sep.as_bytes()[0];
            let ours: Vec<&str> = split_at_byte(&s, sep).collect();
            let std: Vec<&str> = s.split(sep as char).collect();
            prop_assert_eq!(ours, std);
            prop_assert_eq!(last_segment_start(&s), s.rfind('/').map_or(0, |i| i + 1));
        }
    }
}
