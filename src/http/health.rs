//! `GET /healthz` (the process is up) and `GET /readyz` (it can sell: Redis
//! and MySQL answer, the admission script is loaded, a node id is held).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::State;
use crate::store::scripts::ADMISSION;

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "meta", security(()),
    responses((status = 200, description = "Up", content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// It can sell: Redis and MySQL answer, the script is loaded, a node id is held.
#[utoipa::path(get, path = "/readyz", tag = "meta", security(()),
    responses(
        (status = 200, description = "Ready", body = super::schema::ReadyAnswer),
        (status = 503, description = "Not ready: which check failed", body = super::schema::ReadyAnswer),
    ))]
pub async fn readyz(state: State) -> Response {
    let mut conn = state.redis();
    let script: redis::RedisResult<Vec<bool>> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(ADMISSION.get_hash())
        .query_async(&mut conn)
        .await;
    let redis_ok = script.is_ok();
    // A script missing on this node is loaded by the first purchase; a
    // fresh server must not make the instance look broken, so load it here.
    let script_ok = match script {
        Ok(v) if v.first() == Some(&true) => true,
        Ok(_) => redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(crate::store::scripts::ADMISSION_SOURCE)
            .query_async::<String>(&mut conn)
            .await
            .is_ok(),
        Err(_) => false,
    };
    let mysql_ok = match state.db.conn().await {
        Ok(mut c) => mysql_async::prelude::Queryable::query_drop(&mut c, "SELECT 1")
            .await
            .is_ok(),
        Err(_) => false,
    };
    let node_ok = state.ids.holds_lease();
    let ready = redis_ok && script_ok && mysql_ok && node_ok;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "ready": ready,
        "redis": redis_ok,
        "script": script_ok,
        "mysql": mysql_ok,
        "node_id": node_ok,
    });
    (status, Json(body)).into_response()
}
