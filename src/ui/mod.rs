//! The operator console (`/ui`) and the customer portal (`/portal`): static pages and ES
//! modules embedded in the binary. They hold no server-side logic: the browser calls the
//! public `/v1` API with the token the user signed in with, so the OpenAPI document stays
//! the only contract and a page can do nothing its token could not do with curl.
//!
//! Every response carries a strict Content-Security-Policy (no inline script or style, no
//! other origin), `nosniff` and `no-referrer`: the pages show producers' payloads and
//! receivers' response snippets, which are attacker-controlled text.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::domain::FrameAncestors;

/// The CSP of a page framable by `frame_ancestors` (and of the assets, where it is inert
/// but harmless). `img-src data:` is for the empty inline favicon that saves a request.
fn content_security_policy(frame_ancestors: &str) -> String {
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors {frame_ancestors}"
    )
}

/// A file under `ui/assets/`, compiled into the binary.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $type:literal) => {
        Asset {
            name: $name,
            content_type: $type,
            body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/ui/assets/", $name)),
        }
    };
}

const ASSETS: &[Asset] = &[
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("common.js", "text/javascript; charset=utf-8"),
    asset!("console.js", "text/javascript; charset=utf-8"),
    asset!("portal.js", "text/javascript; charset=utf-8"),
];

const CONSOLE_HTML: &str = include_str!("../../ui/console.html");
const PORTAL_HTML: &str = include_str!("../../ui/portal.html");

/// Response headers shared by every page and asset.
fn headers(csp: &str, content_type: &'static str) -> [(HeaderName, HeaderValue); 5] {
    [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_str(csp).expect("a validated policy is a valid header value"),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        // the pages are a few kilobytes and change with every release; revalidating beats
        // an operator staring at yesterday's script after an upgrade
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ]
}

/// `/ui`, `/ui/…` (the console routes on the client: `/ui/messages/<id>` and the like are
/// the same page), `/ui/assets/<file>` and `/portal`. Stateless, so it merges into any
/// router.
pub fn router<S: Clone + Send + Sync + 'static>(
    portal_frame_ancestors: &FrameAncestors,
) -> Router<S> {
    let console_csp = content_security_policy("'none'");
    let portal_csp = content_security_policy(&portal_frame_ancestors.to_string());
    let console = {
        let csp = console_csp.clone();
        move || {
            let csp = csp.clone();
            async move {
                (
                    headers(&csp, "text/html; charset=utf-8"),
                    // legacy browsers that ignore frame-ancestors
                    [(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"))],
                    CONSOLE_HTML,
                )
                    .into_response()
            }
        }
    };
    let portal = move || {
        let csp = portal_csp.clone();
        async move { (headers(&csp, "text/html; charset=utf-8"), PORTAL_HTML).into_response() }
    };
    let assets = move |Path(name): Path<String>| {
        let csp = console_csp.clone();
        async move { asset(&csp, &name) }
    };
    Router::new()
        .route("/", get(root))
        .route("/ui", get(console.clone()))
        .route("/ui/", get(console.clone()))
        .route("/ui/{*page}", get(console))
        .route("/ui/assets/{name}", get(assets))
        .route("/portal", get(portal.clone()))
        .route("/portal/", get(portal))
}

/// `GET /`: where things are, for whoever opens the API's address in a browser or with
/// curl (it used to be a JSON 404). JSON rather than a redirect, so a client reading the
/// API gets a body that says something; the console link is one click away.
async fn root() -> Response {
    (
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        axum::Json(serde_json::json!({
            "service": "hookd",
            "version": env!("CARGO_PKG_VERSION"),
            "console": "/ui",
            "portal": "/portal",
            "openapi": "/openapi.json",
            "health": "/healthz",
            "message": "this is the hookd API; the operator console is at /ui (sign in there with an API token), the API is described at /openapi.json",
        })),
    )
        .into_response()
}

fn asset(csp: &str, name: &str) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => (headers(csp, a.content_type), a.body).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            headers(csp, "text/plain; charset=utf-8"),
            "no such asset",
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_the_pages_name_is_embedded() {
        // a page that names a missing module fails silently in the browser; fail here
        for html in [CONSOLE_HTML, PORTAL_HTML] {
            for part in html.split("/ui/assets/").skip(1) {
                let name = part.split('"').next().unwrap();
                assert!(
                    ASSETS.iter().any(|a| a.name == name),
                    "{name} is not embedded"
                );
            }
        }
        let imports = ASSETS
            .iter()
            .filter(|a| a.name.ends_with(".js"))
            .flat_map(|a| std::str::from_utf8(a.body).unwrap().lines())
            .filter_map(|l| l.trim().strip_prefix("import "))
            .filter_map(|l| l.split("\"./").nth(1)?.split('"').next());
        for name in imports {
            assert!(
                ASSETS.iter().any(|a| a.name == name),
                "{name} is imported but not embedded"
            );
        }
    }
}
