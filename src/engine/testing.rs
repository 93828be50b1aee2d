//! Test support (not a stable API): one owned request shared by the engine's
//! unit tests and the criterion benches, so both build requests the same
//! way. [`TestRequest`] owns what a [`RequestView`] borrows.
//!
//! Re-exported as `peerlb::testing`, hidden from the documentation.

use std::net::SocketAddr;

use http::header::{COOKIE, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Uri};

use super::rules::RequestView;

/// The client address of a [`TestRequest`] unless set with
/// [`TestRequest::client`]: `192.0.2.7:40123` (TEST-NET-1).
pub const DEFAULT_CLIENT: &str = "192.0.2.7:40123";

/// An owned request: method, URI, headers and client address, built with
/// chained setters and viewed with [`TestRequest::view`].
///
/// The constructors and setters take test input and panic on input that does
/// not parse (a test's own mistake), naming the bad value.
#[derive(Clone, Debug)]
pub struct TestRequest {
    /// The method.
    pub method: Method,
    /// The request target.
    pub uri: Uri,
    /// The headers, in insertion order (repeated names kept).
    pub headers: HeaderMap,
    /// The client's address as the entry node sees it.
    pub client: SocketAddr,
    /// Whether the client connection is TLS (default false).
    pub tls: bool,
    /// The client's SNI name (default none).
    pub sni: Option<String>,
}

impl TestRequest {
    /// `method uri` with no headers, from [`DEFAULT_CLIENT`]. The method is
    /// taken as written (`"post"` is an extension method, not `POST`).
    ///
    /// # Panics
    ///
    /// If `method` is not a valid method token or `uri` not a valid
    /// request target.
    pub fn new(method: &str, uri: &str) -> TestRequest {
        TestRequest {
            method: method
                .parse()
                .unwrap_or_else(|e| panic!("test method {method:?}: {e}")),
            uri: uri
                .parse()
                .unwrap_or_else(|e| panic!("test uri {uri:?}: {e}")),
            headers: HeaderMap::new(),
            client: DEFAULT_CLIENT.parse().expect("valid default client"),
            tls: false,
            sni: None,
        }
    }

    /// `GET uri` (see [`TestRequest::new`]).
    ///
    /// # Panics
    ///
    /// If `uri` is not a valid request target.
    pub fn get(uri: &str) -> TestRequest {
        TestRequest::new("GET", uri)
    }

    /// Appends header `name: value` (a repeated name adds a line).
    ///
    /// # Panics
    ///
    /// If `name` or `value` is not valid in a header.
    pub fn header(mut self, name: &str, value: &str) -> TestRequest {
        let n = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|e| panic!("test header name {name:?}: {e}"));
        let v = HeaderValue::from_str(value)
            .unwrap_or_else(|e| panic!("test header value {value:?}: {e}"));
        self.headers.append(n, v);
        self
    }

    /// Appends each `(name, value)` in order ([`TestRequest::header`]).
    ///
    /// # Panics
    ///
    /// As [`TestRequest::header`].
    pub fn headers(self, headers: &[(&str, &str)]) -> TestRequest {
        headers.iter().fold(self, |req, (n, v)| req.header(n, v))
    }

    /// Appends a `Cookie` header line with `cookies` (`"a=1; b=2"`).
    ///
    /// # Panics
    ///
    /// If `cookies` is not a valid header value.
    pub fn cookie(self, cookies: &str) -> TestRequest {
        self.header(COOKIE.as_str(), cookies)
    }

    /// Sets the client address (`"ip:port"`).
    ///
    /// # Panics
    ///
    /// If `client` is not a socket address.
    pub fn client(mut self, client: &str) -> TestRequest {
        self.client = client
            .parse()
            .unwrap_or_else(|e| panic!("test client {client:?}: {e}"));
        self
    }

    /// Marks the request as received over TLS with SNI name `sni` (none
    /// when `None`).
    pub fn tls(mut self, sni: Option<&str>) -> TestRequest {
        self.tls = true;
        self.sni = sni.map(str::to_owned);
        self
    }

    /// The borrowed view the engine decides on.
    pub fn view(&self) -> RequestView<'_> {
        RequestView {
            method: &self.method,
            uri: &self.uri,
            headers: &self.headers,
            client: self.client,
            tls: self.tls,
            sni: self.sni.as_deref(),
        }
    }
}

/// The rule set most tests route with: one rule, the hash key from the
/// `user` query parameter (`?user=alice` routes on `alice`).
pub fn user_rules() -> super::rules::Rules {
    use super::rules::{ExtractorSpec, RuleSpec, Rules};
    Rules::compile(&[RuleSpec {
        name: None,
        when: Default::default(),
        extract: vec![ExtractorSpec {
            query: Some("user".into()),
            ..Default::default()
        }],
        key: None,
    }])
    .expect("one query extractor compiles")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_what_it_is_told() {
        let r = TestRequest::new("POST", "/cart?x=1")
            .headers(&[("x-a", "1"), ("x-a", "2")])
            .cookie("s=1")
            .client("[::1]:9");
        let v = r.view();
        assert_eq!((v.method.as_str(), v.uri.path()), ("POST", "/cart"));
        assert_eq!(v.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(v.headers[COOKIE], "s=1");
        assert_eq!(v.client.to_string(), "[::1]:9");
        assert_eq!(TestRequest::get("/").client.to_string(), DEFAULT_CLIENT);
    }
}
