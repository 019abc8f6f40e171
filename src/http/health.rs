//! `GET /healthz` (the process is up) and `GET /readyz` (it can sell: Redis
//! and MySQL answer, the admission script is loaded, a node id is held).

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{AppState, State};
use crate::store::scripts::ADMISSION;

/// The process is up and can recover by itself: its Redis connections'
/// mender has finished a round lately (src/http/shared_redis.rs). A store
/// that is down fails `/readyz`, never this.
#[utoipa::path(get, path = "/healthz", tag = "meta", security(()),
    responses(
        (status = 200, description = "Up", content_type = "text/plain"),
        (status = 503, description = "Stuck: the Redis connections' mender has not finished a round for twice its longest (18.5 s by default)", content_type = "text/plain"),
    ))]
pub async fn healthz(state: State) -> Response {
    let since = state.mending.since_last_round();
    if since > state.mending.stalled {
        let why = format!(
            "stuck: the Redis connections have not been looked after for {}\n",
            humantime::format_duration(Duration::from_secs(since.as_secs()))
        );
        return (StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    }
    "ok\n".into_response()
}

/// It can sell: Redis and MySQL answer, the script is loaded, a node id is held.
#[utoipa::path(get, path = "/readyz", tag = "meta", security(()),
    responses(
        (status = 200, description = "Ready", body = super::schema::ReadyAnswer),
        (status = 503, description = "Not ready: which check failed", body = super::schema::ReadyAnswer),
    ))]
pub async fn readyz(state: State) -> Response {
    let checks = state.readiness.checks(&state).await;
    let status = if checks.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "ready": checks.ready(),
        "redis": checks.redis,
        "script": checks.script,
        "mysql": checks.mysql,
        "node_id": checks.node_id,
    });
    (status, Json(body)).into_response()
}

/// A probe is answered from checks at most this old: however often load
/// balancers (or anyone: the route has no key) ask, the stores see one
/// round of checks a second per process.
const FRESH: Duration = Duration::from_secs(1);
/// A store that does not answer within this (or `--request-timeout`, if
/// shorter) is not ready, rather than the probe hanging.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
struct Checks {
    redis: bool,
    script: bool,
    mysql: bool,
    node_id: bool,
}

impl Checks {
    fn ready(&self) -> bool {
        self.redis && self.script && self.mysql && self.node_id
    }
}

/// The last checks; one probe at a time runs new ones, the others wait for
/// them.
#[derive(Default)]
pub struct Readiness {
    last: tokio::sync::Mutex<Option<(Instant, Checks)>>,
}

impl Readiness {
    async fn checks(&self, state: &AppState) -> Checks {
        let mut last = self.last.lock().await;
        if let Some((at, checks)) = *last {
            if at.elapsed() < FRESH {
                return checks;
            }
        }
        // Both at once, and within the request's own timeout: a probe is
        // never cut off by the backstop with its round unfinished.
        let bound = CHECK_TIMEOUT.min(state.request_timeout);
        let (redis, mysql) = tokio::join!(
            tokio::time::timeout(bound, redis_checks(state)),
            tokio::time::timeout(bound, mysql_check(state)),
        );
        let (redis, script) = redis.unwrap_or((false, false));
        let mysql = mysql.unwrap_or(false);
        let checks = Checks {
            redis,
            script,
            mysql,
            node_id: state.ids.holds_lease(),
        };
        *last = Some((Instant::now(), checks));
        checks
    }
}

/// Redis answers, and has the admission script.
async fn redis_checks(state: &AppState) -> (bool, bool) {
    let mut conn = state.redis();
    let script: redis::RedisResult<Vec<bool>> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(ADMISSION.get_hash())
        .query_async(&mut conn)
        .await;
    // A script missing on this node is loaded by the first purchase; a
    // fresh server must not make the instance look broken, so load it here.
    match script {
        Ok(v) if v.first() == Some(&true) => (true, true),
        Ok(_) => {
            let loaded = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(crate::store::scripts::ADMISSION_SOURCE)
                .query_async::<String>(&mut conn)
                .await
                .is_ok();
            (true, loaded)
        }
        Err(_) => (false, false),
    }
}

async fn mysql_check(state: &AppState) -> bool {
    match state.db.conn().await {
        Ok(mut c) => mysql_async::prelude::Queryable::query_drop(&mut c, "SELECT 1")
            .await
            .is_ok(),
        Err(_) => false,
    }
}
