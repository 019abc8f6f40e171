//! Every answer carries `X-Request-Id`: the request's own when it sent a
//! usable one (so an application server can follow its request through
//! its logs and ours), a fresh one otherwise. The id is on every log line
//! written while the request is served (a span), and in a problem's body.

use std::sync::Arc;

use axum::http::{HeaderName, HeaderValue, Request};
use axum::response::Response;
use tracing::Instrument;

pub static HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longer ids from a client are replaced: a log line must stay short.
const MAX_LEN: usize = 64;

tokio::task_local! {
    static CURRENT: Arc<str>;
}

/// The id of the request being served on this task, if any.
pub fn current() -> Option<Arc<str>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// The client's id when it is 1..=64 of `[A-Za-z0-9._:-]` (nothing that
/// could forge a log line), else a fresh one.
fn id_of<B>(request: &Request<B>) -> Arc<str> {
    let sent = request
        .headers()
        .get(&HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| usable(v));
    match sent {
        Some(v) => Arc::from(v),
        None => Arc::from(fresh().as_str()),
    }
}

fn usable(id: &str) -> bool {
    (1..=MAX_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// 128 random bits as 32 hex digits, as a token is minted.
pub fn fresh() -> String {
    crate::gate::token::mint().unwrap_or_else(|_| {
        // No randomness at hand: a clock-based id is still an id.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{nanos:032x}")
    })
}

/// Serves `inner` for the request with its id in scope, and puts the id
/// on the answer.
pub async fn serve<B, F>(request: Request<B>, inner: impl FnOnce(Request<B>) -> F) -> Response
where
    F: std::future::Future<Output = Response>,
{
    let id = id_of(&request);
    // At ERROR: on whatever lines are logged (a --quiet serve logs its
    // server faults, and they must carry the id).
    let span = tracing::error_span!("request", id = %id);
    let mut response = CURRENT
        .scope(id.clone(), inner(request).instrument(span))
        .await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER.clone(), value);
    }
    response
}

/// [`serve`] as a middleware: the outermost layer, so the answers of the
/// limits in front of the router carry the id too.
pub async fn layer(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    serve(request, |r| next.run(r)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_id_is_kept_only_when_it_is_short_and_plain() {
        let with = |v: &str| {
            Request::builder()
                .header("x-request-id", v)
                .body(())
                .unwrap()
        };
        assert_eq!(&*id_of(&with("abc-123_x.y:z")), "abc-123_x.y:z");
        for bad in ["", "a b", "a\"b", &"x".repeat(65)] {
            let id = id_of(&with(bad));
            assert_ne!(&*id, bad);
            assert_eq!(id.len(), 32);
        }
        assert_ne!(fresh(), fresh());
    }
}
