//! Validation of `[sticky.session]` into the engine's
//! [`SessionRoute`]: routing by the servers named inside the app's own
//! session id.

use crate::engine::node_id::NodeId;
use crate::engine::session_id::{SessionIdForm, SessionRoute};

use super::StickySection;

/// Largest compiled automaton of the session-id regex, in bytes (1 MiB; the
/// regex crate's `RegexBuilder::size_limit`). A session-id pattern is small.
const SESSION_REGEX_SIZE_LIMIT: usize = 1 << 20;

/// `[sticky.session]`, checked: `None` when absent. Error: (field path,
/// message).
///
/// The cookie and parameter names are RFC 6265 tokens and at least one is
/// given; `format` is `weblogic`, `httpd` or `regex`; `regex` is given
/// exactly with `format = "regex"`, compiles within
/// [`SESSION_REGEX_SIZE_LIMIT`] and has a named capture `primary`; each
/// `servers` value is a valid node id.
pub(super) fn session_route(s: &StickySection) -> Result<Option<SessionRoute>, (String, String)> {
    let Some(s) = &s.session else {
        return Ok(None);
    };
    fn err<T>(field: &str, m: String) -> Result<T, (String, String)> {
        Err((format!("sticky.session.{field}"), m))
    }
    let token = |v: &str| {
        !v.is_empty()
            && v.chars()
                .all(|c| c.is_ascii_graphic() && !"()<>@,;:\\\"/[]?={}".contains(c))
    };
    for (field, name) in [("cookie", &s.cookie), ("path_param", &s.path_param)] {
        if let Some(n) = name
            && !token(n)
        {
            return err(field, format!("{n:?} is not a token (RFC 6265 / RFC 9110)"));
        }
    }
    if s.cookie.is_none() && s.path_param.is_none() {
        return err(
            "cookie",
            "give cookie, path_param or both (where the session id is read)".into(),
        );
    }
    let form = match (s.format.as_str(), &s.regex) {
        ("weblogic", None) => SessionIdForm::WebLogic,
        ("httpd", None) => SessionIdForm::Httpd,
        ("weblogic" | "httpd", Some(_)) => {
            return err("regex", "only with format = \"regex\"".into());
        }
        ("regex", None) => {
            return err("regex", "required with format = \"regex\"".into());
        }
        ("regex", Some(p)) => {
            let re = regex::RegexBuilder::new(p)
                .size_limit(SESSION_REGEX_SIZE_LIMIT)
                .build()
                .or_else(|e| err("regex", format!("{p:?}: {e}")))?;
            if !re.capture_names().any(|n| n == Some("primary")) {
                return err(
                    "regex",
                    format!("{p:?} has no named capture `primary` (write (?<primary>...))"),
                );
            }
            SessionIdForm::Regex(re)
        }
        (f, _) => {
            return err("format", format!("{f:?} is not weblogic, httpd or regex"));
        }
    };
    for (server, node) in &s.servers {
        if server.is_empty() {
            return err("servers", "a server id must not be empty".into());
        }
        if let Err(e) = NodeId::new(node) {
            return err(&format!("servers.{server}"), e.to_string());
        }
    }
    Ok(Some(SessionRoute {
        cookie: s.cookie.clone(),
        path_param: s.path_param.clone(),
        form,
        servers: s.servers.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::config::{ClusterFile, Source};
    use crate::engine::session_id::{SessionIdForm, SessionRoute};

    const ONE: &str = "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:1\"\npeer_addr = \"127.0.0.1:2\"\ngossip_addr = \"127.0.0.1:3\"\n";

    fn src(text: &str) -> Source {
        Source {
            origin: "test.toml".into(),
            base_dir: PathBuf::from("/etc/peerlb"),
            path: None,
            text: text.into(),
        }
    }

    /// The session route of `[sticky.session]` holding `body`, or the
    /// error's text (`check` and `validate` agree on it).
    fn session(body: &str) -> Result<Option<SessionRoute>, String> {
        let src = src(&format!("[sticky.session]\n{body}\n{ONE}"));
        let file: ClusterFile = src.parse().map_err(|e| e.to_string())?;
        let checked = file.check(&src).map_err(|e| e.to_string());
        let validated = file
            .validate(&src, "n1", &Default::default())
            .map(|c| c.routing.session_route)
            .map_err(|e| e.to_string());
        assert_eq!(checked.as_ref().err(), validated.as_ref().err());
        validated
    }

    #[test]
    fn each_form_is_configured() {
        let s = session("cookie = \"JSESSIONID\"\npath_param = \"jsessionid\"\nformat = \"weblogic\"\n[sticky.session.servers]\n\"-1503376427\" = \"n1\"")
            .unwrap()
            .unwrap();
        assert_eq!(s.cookie.as_deref(), Some("JSESSIONID"));
        assert_eq!(s.path_param.as_deref(), Some("jsessionid"));
        assert_eq!(s.form, SessionIdForm::WebLogic);
        assert_eq!(s.node_of("-1503376427"), "n1");
        let s = session("cookie = \"JSESSIONID\"\nformat = \"httpd\"")
            .unwrap()
            .unwrap();
        assert_eq!(s.form, SessionIdForm::Httpd);
        let s = session("path_param = \"sid\"\nformat = \"regex\"\nregex = \"^(?<primary>\\\\w+)-(?<secondary>\\\\w+)-\"")
            .unwrap()
            .unwrap();
        assert!(matches!(s.form, SessionIdForm::Regex(_)));
        assert_eq!(
            s.form.parse("n1-n2-x").map(|n| (n.primary, n.secondary)),
            Some(("n1", Some("n2")))
        );
        // Absent: off.
        let src = src(ONE);
        let c = src
            .parse()
            .unwrap()
            .validate(&src, "n1", &Default::default())
            .unwrap();
        assert_eq!(c.routing.session_route, None);
    }

    #[test]
    fn a_bad_session_section_names_its_field() {
        for (body, field) in [
            ("format = \"weblogic\"", "sticky.session.cookie"),
            (
                "cookie = \"a b\"\nformat = \"weblogic\"",
                "sticky.session.cookie",
            ),
            (
                "path_param = \"a=b\"\nformat = \"weblogic\"",
                "sticky.session.path_param",
            ),
            (
                "cookie = \"J\"\nformat = \"tomcat\"",
                "sticky.session.format",
            ),
            ("cookie = \"J\"\nformat = \"regex\"", "sticky.session.regex"),
            (
                "cookie = \"J\"\nformat = \"httpd\"\nregex = \"x\"",
                "sticky.session.regex",
            ),
            (
                "cookie = \"J\"\nformat = \"regex\"\nregex = \"(\"",
                "sticky.session.regex",
            ),
            // No named capture `primary`.
            (
                "cookie = \"J\"\nformat = \"regex\"\nregex = \"!(\\\\w+)!\"",
                "sticky.session.regex",
            ),
            (
                "cookie = \"J\"\nformat = \"regex\"\nregex = \"!(?<prim>\\\\w+)\"",
                "sticky.session.regex",
            ),
            // Compiles past the size limit.
            (
                "cookie = \"J\"\nformat = \"regex\"\nregex = \"(?<primary>\\\\w{500})\"",
                "sticky.session.regex",
            ),
            (
                "cookie = \"J\"\nformat = \"weblogic\"\n[sticky.session.servers]\nms1 = \"no such id\"",
                "sticky.session.servers.ms1",
            ),
        ] {
            let e = session(body).unwrap_err();
            assert!(e.contains(&format!(": {field}: ")), "{body}: {e}");
        }
    }
}
