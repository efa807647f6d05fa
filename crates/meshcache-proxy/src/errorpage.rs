//! Error pages: the body of every response the proxy makes up itself (403, 502, 503, 504 …).
//!
//! Built in: a short plain-text page that says what happened, for which request, and which node
//! answered. With `errors.directory`, an HTML template per kind of error, named as Squid names
//! its pages (`ERR_ACCESS_DENIED`, `ERR_CONNECT_FAIL` …), so Squid's own templates
//! (`/usr/share/squid/errors/templates` on Debian) or an operator's copies of them work as
//! they are. A kind without a template file gets the built-in page.
//!
//! Templates use Squid's `%` codes; this subset is filled in (every value HTML-escaped):
//! `%U` the URL, `%M` the method, `%H` the origin's host, `%p` its port, `%i` the client's
//! address, `%c` the page's name (`ERR_ACCESS_DENIED`), `%E` what went wrong (the reason the
//! built-in page gives), `%T` the time (RFC 9110 date), `%h` the node's name, `%w` the admin's
//! address (`errors.admin`), `%W` a `mailto:` link to it, `%s` the software (`meshcache/x.y.z`),
//! `%%` a percent sign. Other codes become nothing.

use std::collections::HashMap;
use std::fmt::Write;
use std::net::IpAddr;
use std::path::Path;
use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};

/// Squid's names of the pages, and the meshcache error tokens each covers.
const PAGES: &[(&str, &[&str])] = &[
    (
        "ERR_ACCESS_DENIED",
        &["access-denied", "to-localhost", "connect-port"],
    ),
    ("ERR_CACHE_ACCESS_DENIED", &["auth-required"]),
    ("ERR_DNS_FAIL", &["dns-failure"]),
    ("ERR_CONNECT_FAIL", &["connect-failed"]),
    ("ERR_READ_TIMEOUT", &["upstream-timeout"]),
    ("ERR_READ_ERROR", &["upstream-failed"]),
    ("ERR_CANNOT_FORWARD", &["no-route", "parent-refused"]),
    ("ERR_ONLY_IF_CACHED_MISS", &["only-if-cached"]),
    ("ERR_UNSUP_REQ", &["unsupported-scheme"]),
    ("ERR_INVALID_URL", &["origin-form", "invalid-url"]),
    (
        "ERR_INVALID_REQ",
        &["invalid-request", "request-too-large", "forwarding-loop"],
    ),
];

/// The page name for an error token; `ERR_GATEWAY_FAILURE` for the rest.
pub(crate) fn page_name(token: &str) -> &'static str {
    PAGES
        .iter()
        .find(|(_, tokens)| tokens.contains(&token))
        .map_or("ERR_GATEWAY_FAILURE", |(name, _)| name)
}

/// What one error page is about.
pub(crate) struct Incident<'a> {
    /// The status sent.
    pub status: StatusCode,
    /// The `X-Meshcache-Error` token.
    pub token: &'a str,
    /// What went wrong, in a sentence.
    pub reason: &'a str,
    /// The request's method.
    pub method: &'a Method,
    /// The request's URL (as logged).
    pub url: &'a str,
    /// The client's address.
    pub client: IpAddr,
}

/// The node's error pages.
pub(crate) struct ErrorPages {
    /// Page name to template, for the pages the directory has.
    templates: HashMap<&'static str, String>,
    node: String,
    admin: String,
}

impl ErrorPages {
    /// The built-in pages only.
    pub(crate) fn built_in(node: &str, admin: &str) -> Self {
        Self {
            templates: HashMap::new(),
            node: node.to_owned(),
            admin: admin.to_owned(),
        }
    }

    /// Reads the templates of `dir` (the files it has of Squid's page names).
    pub(crate) fn load(node: &str, admin: &str, dir: &Path) -> std::io::Result<Self> {
        let mut pages = Self::built_in(node, admin);
        // The directory must be there and readable; a page it lacks is the built-in one.
        std::fs::read_dir(dir)?;
        let names = PAGES
            .iter()
            .map(|(name, _)| *name)
            .chain(["ERR_GATEWAY_FAILURE"]);
        for name in names {
            match std::fs::read(dir.join(name)) {
                Ok(bytes) => {
                    pages
                        .templates
                        .insert(name, String::from_utf8_lossy(&bytes).into_owned());
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(pages)
    }

    /// The page for `incident`: its content type and body.
    pub(crate) fn render(&self, incident: &Incident<'_>) -> (HeaderValue, Bytes) {
        let name = page_name(incident.token);
        match self.templates.get(name) {
            Some(template) => (
                HeaderValue::from_static("text/html; charset=utf-8"),
                Bytes::from(self.fill(template, name, incident, SystemTime::now())),
            ),
            None => (
                HeaderValue::from_static("text/plain; charset=utf-8"),
                Bytes::from(format!(
                    "meshcache: {}\n\n{} {} for {} {}, answered by {} ({name}).\n",
                    incident.reason,
                    incident.status.as_u16(),
                    incident.status.canonical_reason().unwrap_or(""),
                    incident.method,
                    incident.url,
                    self.node,
                )),
            ),
        }
    }

    /// Fills a template's `%` codes.
    fn fill(&self, template: &str, name: &str, incident: &Incident<'_>, now: SystemTime) -> String {
        let (host, port) = host_port(incident.url);
        let mut out = String::with_capacity(template.len() + 256);
        let mut chars = template.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(code) = chars.next() else {
                out.push('%');
                break;
            };
            match code {
                '%' => out.push('%'),
                'U' => escape(&mut out, incident.url),
                'M' => escape(&mut out, incident.method.as_str()),
                'H' => escape(&mut out, host),
                'p' => escape(&mut out, port),
                'i' => escape(&mut out, &incident.client.to_string()),
                'c' => escape(&mut out, name),
                'E' => escape(&mut out, incident.reason),
                'T' => escape(&mut out, &httpdate::fmt_http_date(now)),
                'h' => escape(&mut out, &self.node),
                'w' => escape(&mut out, &self.admin),
                'W' => {
                    out.push_str("<a href=\"mailto:");
                    escape(&mut out, &self.admin);
                    out.push_str("\">");
                    escape(&mut out, &self.admin);
                    out.push_str("</a>");
                }
                's' => {
                    let _ = write!(out, "meshcache/{}", env!("CARGO_PKG_VERSION"));
                }
                _ => {}
            }
        }
        out
    }
}

/// The host and port of a URL as logged (`http://host:port/…` or `host:port`).
fn host_port(url: &str) -> (&str, &str) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, p),
        _ => (
            authority,
            if url.starts_with("http://") { "80" } else { "" },
        ),
    }
}

/// Appends `text` with HTML's special characters escaped.
fn escape(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incident<'a>(url: &'a str, method: &'a Method) -> Incident<'a> {
        Incident {
            status: StatusCode::FORBIDDEN,
            token: "access-denied",
            reason: "access denied by access rule 2",
            method,
            url,
            client: "127.0.0.2".parse().expect("literal"),
        }
    }

    #[test]
    fn codes_are_filled_and_escaped() {
        let pages = ErrorPages::built_in("node1", "ops@example.org");
        let get = Method::GET;
        let i = incident("http://a.test:8080/<script>?q=\"x\"", &get);
        let t = SystemTime::UNIX_EPOCH;
        let out = pages.fill(
            "%c %U %M %H %p %i %E %h %w %W %s %% %Z%",
            "ERR_ACCESS_DENIED",
            &i,
            t,
        );
        assert!(out.starts_with("ERR_ACCESS_DENIED http://a.test:8080/&lt;script&gt;?q=&quot;x&quot; GET a.test 8080 127.0.0.2 access denied by access rule 2 node1 ops@example.org <a href=\"mailto:ops@example.org\">ops@example.org</a> meshcache/"), "{out}");
        assert!(out.ends_with(" % %"), "{out}");
        let out = pages.fill("%T", "X", &i, t);
        assert_eq!(out, "Thu, 01 Jan 1970 00:00:00 GMT");
    }

    #[test]
    fn the_built_in_page_says_what_and_who() {
        let pages = ErrorPages::built_in("node1", "webmaster");
        let get = Method::GET;
        let (ct, body) = pages.render(&incident("http://a.test/", &get));
        assert_eq!(ct, "text/plain; charset=utf-8");
        let body = String::from_utf8_lossy(&body);
        assert!(
            body.starts_with("meshcache: access denied by access rule 2\n"),
            "{body}"
        );
        assert!(
            body.contains(
                "403 Forbidden for GET http://a.test/, answered by node1 (ERR_ACCESS_DENIED)"
            ),
            "{body}"
        );
    }

    #[test]
    fn tokens_map_to_squid_pages() {
        assert_eq!(page_name("to-localhost"), "ERR_ACCESS_DENIED");
        assert_eq!(page_name("no-route"), "ERR_CANNOT_FORWARD");
        assert_eq!(page_name("something-new"), "ERR_GATEWAY_FAILURE");
        assert_eq!(host_port("127.0.0.1:443"), ("127.0.0.1", "443"));
        assert_eq!(host_port("http://h/x"), ("h", "80"));
    }

    proptest::proptest! {
        #[test]
        fn templates_never_panic(template in ".{0,200}", url in ".{0,60}") {
            let pages = ErrorPages::built_in("n", "w");
            let get = Method::GET;
            let _ = pages.fill(&template, "ERR_X", &incident(&url, &get), SystemTime::now());
        }
    }
}
