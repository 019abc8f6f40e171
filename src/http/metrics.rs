//! `GET /metrics` of `seckill serve` (Prometheus text format, through the
//! Prometheus org's own client crate): requests by route, status and
//! outcome, their latency, requests in flight, Redis errors, connections
//! open and closed by serve (timers, the cap); and the
//! access line of each request at `-v`. Label sets
//! are bounded: a route is its template (`/v1/vouchers/{voucher}/...`),
//! never an id.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::connections::ConnectionMetrics;
use super::AppState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    status: u16,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

type LatencyFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// What a handler says of its request's outcome (a purchase's, a
/// payment's), for the requests counter; "-" where there is none.
#[derive(Clone, Copy, Debug)]
pub struct OutcomeLabel(pub &'static str);

pub struct ServeMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: LatencyFamily,
    in_flight: Gauge,
    redis_errors: Counter,
    pub connections: ConnectionMetrics,
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~3.3 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

impl Default for ServeMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("seckill_http");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: LatencyFamily = Family::new_with_constructor(latency_histogram);
        let in_flight = Gauge::default();
        let redis_errors = Counter::default();
        registry.register(
            "requests",
            "HTTP requests answered, by route template, status and outcome",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to answer a request, by route template",
            latency.clone(),
        );
        registry.register(
            "requests_in_flight",
            "Requests being handled now",
            in_flight.clone(),
        );
        registry.register(
            "redis_errors",
            "Redis calls of requests that failed (timeouts, lost connections)",
            redis_errors.clone(),
        );
        let connections = ConnectionMetrics::default();
        connections.register(&mut registry);
        ServeMetrics {
            registry,
            requests,
            latency,
            in_flight,
            redis_errors,
            connections,
        }
    }
}

impl ServeMetrics {
    pub fn redis_error(&self) {
        self.redis_errors.inc();
    }

    /// A request refused by the limits in front of the router (route "-").
    pub fn refused(&self, outcome: &'static str) {
        self.requests
            .get_or_create(&RequestLabels {
                route: "-".to_string(),
                status: 503,
                outcome,
            })
            .inc();
    }
}

/// Counts a request in flight until dropped, also when its future is
/// dropped midway (a client gone, a timeout).
struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Counts and times every request.
pub async fn observe(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_string();
    let method = request.method().clone();
    let metrics = &state.metrics;
    metrics.in_flight.inc();
    let counted = InFlight(&metrics.in_flight);
    let started = Instant::now();
    let response = next.run(request).await;
    drop(counted);
    // An access line at -v: the route's template, never an id or a body.
    tracing::debug!(
        "{method} {route} -> {} in {:.2} ms",
        response.status().as_u16(),
        started.elapsed().as_secs_f64() * 1e3
    );
    metrics
        .latency
        .get_or_create(&RouteLabels {
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    let outcome = response
        .extensions()
        .get::<OutcomeLabel>()
        .map_or("-", |o| o.0);
    metrics
        .requests
        .get_or_create(&RequestLabels {
            route,
            status: response.status().as_u16(),
            outcome,
        })
        .inc();
    response
}

/// Prometheus metrics (OpenMetrics text).
#[utoipa::path(get, path = "/metrics", tag = "meta", security(()),
    responses((status = 200, description = "The metrics", content_type = "application/openmetrics-text")))]
pub async fn render(State(state): State<Arc<AppState>>) -> Response {
    let mut body = String::new();
    if encode(&mut body, &state.metrics.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// `--metrics-addr`: `/metrics` alone on a listener of its own until
/// `stop` (bound now: a busy port fails serve at start).
pub async fn serve_page(
    addr: std::net::SocketAddr,
    state: Arc<AppState>,
    stop: tokio_util::sync::CancellationToken,
) -> crate::error::Result<tokio::task::JoinHandle<()>> {
    let page = axum::Router::new()
        .route("/metrics", axum::routing::get(render))
        .with_state(state);
    let (task, addr) = crate::support::metrics_page::start(addr, page, stop).await?;
    tracing::info!("metrics on http://{addr}/metrics (not on the API's address)");
    Ok(task)
}
