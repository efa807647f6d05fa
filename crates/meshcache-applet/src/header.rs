//! The `CacheApplet` response header and the same-origin rule.
//!
//! ```text
//! CacheApplet: /applets/log.wasm
//! CacheApplet: http://www.example.com/applets/ads.wasm; log=/ad-log
//! ```
//!
//! The value is the module's URL, absolute or a path of the document's origin, optionally
//! followed by `; log=URL`, where the applet's log records are POSTed (default: the module's
//! URL). Both must be of the document's origin (scheme, host and port); anything else is
//! refused with a reason the proxy logs.

/// The header's name (lower-case, as `http` stores it).
pub const NAME: &str = "cacheapplet";

/// An applet attached to a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// Absolute URL of the module.
    pub module: String,
    /// Absolute URL its log records go to.
    pub log: String,
}

/// Why a `CacheApplet` value was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not text, or no URL.
    #[error("malformed CacheApplet value")]
    Malformed,
    /// A parameter other than `log`.
    #[error("unknown CacheApplet parameter {0:?}")]
    UnknownParameter(String),
    /// The URL is of another origin.
    #[error("{url} is not of the document's origin {origin}")]
    ForeignOrigin {
        /// The URL refused.
        url: String,
        /// The document's origin.
        origin: String,
    },
}

/// `http://host[:port]` of an absolute `http://` URL (port 80 left out), lower-case host.
pub fn origin_of(url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://")?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let port_of = |p: &str| -> Option<u16> {
        (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']')?;
        let port = match after {
            "" => 80,
            p => port_of(p.strip_prefix(':')?)?,
        };
        (format!("[{h}]"), port)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h.to_owned(), port_of(p)?),
            None => (authority.to_owned(), 80),
        }
    };
    if host.is_empty() || host == "[]" {
        return None;
    }
    let host = host.to_ascii_lowercase();
    Some(if port == 80 {
        format!("http://{host}")
    } else {
        format!("http://{host}:{port}")
    })
}

/// Resolves `reference` (absolute, or a path) against the document's origin, refusing others.
pub fn resolve(origin: &str, reference: &str) -> Result<String, Refusal> {
    if reference.starts_with('/') && !reference.starts_with("//") {
        return Ok(format!("{origin}{reference}"));
    }
    match origin_of(reference) {
        Some(o) if o == origin => {
            let path_at = "http://".len()
                + reference["http://".len()..]
                    .find('/')
                    .unwrap_or(reference.len() - "http://".len());
            let path = &reference[path_at..];
            Ok(format!(
                "{origin}{}",
                if path.is_empty() { "/" } else { path }
            ))
        }
        Some(_) => Err(Refusal::ForeignOrigin {
            url: reference.to_owned(),
            origin: origin.to_owned(),
        }),
        None if reference.is_empty() => Err(Refusal::Malformed),
        None => Err(Refusal::ForeignOrigin {
            url: reference.to_owned(),
            origin: origin.to_owned(),
        }),
    }
}

/// Parses a `CacheApplet` value for a document of `document_url`.
pub fn parse(document_url: &str, value: &[u8]) -> Result<Attachment, Refusal> {
    let value = std::str::from_utf8(value).map_err(|_| Refusal::Malformed)?;
    let origin = origin_of(document_url).ok_or(Refusal::Malformed)?;
    let mut parts = value.split(';').map(str::trim);
    let module = unquote(parts.next().ok_or(Refusal::Malformed)?);
    if module.is_empty() {
        return Err(Refusal::Malformed);
    }
    let module = resolve(&origin, module)?;
    let mut log = None;
    for p in parts.filter(|p| !p.is_empty()) {
        match p.split_once('=') {
            Some((k, v)) if k.trim().eq_ignore_ascii_case("log") => {
                log = Some(resolve(&origin, unquote(v.trim()))?);
            }
            _ => return Err(Refusal::UnknownParameter(p.to_owned())),
        }
    }
    Ok(Attachment {
        log: log.unwrap_or_else(|| module.clone()),
        module,
    })
}

fn unquote(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('<')
        .and_then(|s| s.strip_suffix('>'))
        .or_else(|| s.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
        .unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        assert_eq!(
            origin_of("http://A.example/x").as_deref(),
            Some("http://a.example")
        );
        assert_eq!(
            origin_of("http://a.example:80/x").as_deref(),
            Some("http://a.example")
        );
        assert_eq!(
            origin_of("http://a.example:8080").as_deref(),
            Some("http://a.example:8080")
        );
        assert_eq!(
            origin_of("http://127.0.0.1:9/?q").as_deref(),
            Some("http://127.0.0.1:9")
        );
        assert_eq!(origin_of("https://a.example/"), None);
        assert_eq!(origin_of("http://u@a.example/"), None);
        assert_eq!(origin_of("http://a.example:x/"), None);
        assert_eq!(origin_of("http:///x"), None);
    }

    #[test]
    fn attachments_resolve_in_the_documents_origin() {
        let doc = "http://o.example:8080/news/today.html";
        assert_eq!(
            parse(doc, b"/applets/log.wasm"),
            Ok(Attachment {
                module: "http://o.example:8080/applets/log.wasm".into(),
                log: "http://o.example:8080/applets/log.wasm".into(),
            })
        );
        assert_eq!(
            parse(doc, b"http://O.example:8080/a.wasm; log=\"/log\"").map(|a| a.log),
            Ok("http://o.example:8080/log".into())
        );
        assert!(matches!(
            parse(doc, b"http://evil.example:8080/a.wasm"),
            Err(Refusal::ForeignOrigin { .. })
        ));
        assert!(matches!(
            parse(doc, b"http://o.example/a.wasm"),
            Err(Refusal::ForeignOrigin { .. })
        ));
        assert!(matches!(
            parse(doc, b"/a.wasm; log=http://evil.example/"),
            Err(Refusal::ForeignOrigin { .. })
        ));
        assert!(matches!(
            parse(doc, b"//evil.example/a.wasm"),
            Err(Refusal::ForeignOrigin { .. })
        ));
        assert_eq!(parse(doc, b""), Err(Refusal::Malformed));
        assert_eq!(parse(doc, b"\xff"), Err(Refusal::Malformed));
        assert!(matches!(
            parse(doc, b"/a.wasm; run=fast"),
            Err(Refusal::UnknownParameter(_))
        ));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever an origin sends, parsing answers without panicking, and an accepted
        /// attachment never leaves the document's origin.
        #[test]
        fn parsing_never_panics_nor_leaves_the_origin(
            value in proptest::collection::vec(any::<u8>(), 0..200),
            path in "[a-z/]{0,20}",
        ) {
            let doc = format!("http://o.example:8080/{path}");
            if let Ok(a) = parse(&doc, &value) {
                prop_assert!(a.module.starts_with("http://o.example:8080/"));
                prop_assert!(a.log.starts_with("http://o.example:8080/"));
            }
        }

        #[test]
        fn origins_of_arbitrary_text_never_panic(url in "\\PC{0,60}") {
            let _ = origin_of(&url);
            let _ = resolve("http://o.example", &url);
        }

        #[test]
        fn globs_never_panic(pattern in "[a*/]{0,12}", text in "[a/]{0,12}") {
            let _ = crate::config::glob_match(&pattern, &text);
        }
    }
}
