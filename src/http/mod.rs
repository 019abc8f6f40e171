//! `seckill serve`: the HTTP front door. Application servers in any language
//! send one request per purchase instead of re-implementing the gate
//! protocol (node-id leases, order ids, keys, EVALSHA, routing, tokens).
//!
//! Stateless: any number of instances behind a load balancer, each with a
//! node id of its own and a few multiplexed Redis connections shared by all
//! requests. Routes live one file per resource; this file builds the router,
//! its shared state and its limits, and runs it until shutdown.

mod auth;
mod body;
mod connections;
mod contract;
mod error;
mod health;
mod idempotent;
mod ids;
mod metrics;
pub mod openapi;
mod order;
mod problem;
mod purchase;
mod request_id;
mod schema;
mod shared_redis;
mod standing;
mod tls;
mod voucher;
mod window;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

use crate::error::{Error, Result};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::{self, Redis};
pub use auth::ApiKeys;
pub use error::ApiError;
use shared_redis::SharedRedis;

/// What `seckill serve` is told to do.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    /// Keys a `/v1` request must present; none: only loopback is served.
    pub api_keys: Option<ApiKeys>,
    /// Requests handled at once; more are answered 503 at once.
    pub max_in_flight: usize,
    /// A request not answered within this is answered 503.
    pub request_timeout: Duration,
    /// A request's head must arrive within this of the connection's
    /// opening or of its first byte; between requests a connection may
    /// wait `idle_timeout`.
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// Connections open at once (fewer if the descriptor limit is lower).
    pub max_connections: usize,
    /// Requests in flight at shutdown get this long to finish.
    pub drain: Duration,
    /// Multiplexed Redis connections shared by all requests (with
    /// `wait`, as many again for purchases).
    pub redis_connections: usize,
    /// `/metrics` on a listener of its own here, and 404 on the API's
    /// (which may face the internet: sales velocity is nobody's business).
    pub metrics_addr: Option<SocketAddr>,
    pub node_id: Option<u16>,
    /// HTTPS with this certificate chain and key (PEM); none: plain HTTP.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// After a success, wait for replicas to have it (`--wait-replicas`).
    pub wait: Option<crate::gate::admission::ReplicaWait>,
    /// How long an `Idempotency-Key`'s records live.
    pub idempotency_ttl: Duration,
}

/// MySQL lookups for already_bought answers at once (a pool holds 100).
const ORDER_LOOKUPS: usize = 8;

/// Bodies are a few fields: anything larger is refused before parsing.
pub const MAX_BODY: usize = 4 * 1024;

impl ServeOptions {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidInput(m.to_string()));
        if self.api_keys.is_none() && !self.listen.ip().is_loopback() {
            return bad(
                "refusing to listen on a non-loopback address without --api-key-file: anyone who can reach it could buy",
            );
        }
        if !(1..=100_000).contains(&self.max_in_flight) {
            return bad("--max-in-flight must be between 1 and 100000");
        }
        if self.request_timeout < Duration::from_millis(10) {
            return bad("--request-timeout must be at least 10ms");
        }
        let day = Duration::from_secs(86_400);
        if !(Duration::from_millis(100)..=day).contains(&self.header_timeout) {
            return bad("--header-timeout must be between 100ms and 1day");
        }
        if !(Duration::from_millis(100)..=day).contains(&self.idle_timeout) {
            return bad("--idle-timeout must be between 100ms and 1day");
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return bad("--max-connections must be between 1 and 1000000");
        }
        if !(1..=64).contains(&self.redis_connections) {
            return bad("--redis-connections must be between 1 and 64");
        }
        if !(Duration::from_secs(1)..=crate::idempotency::MAX_LIFETIME)
            .contains(&self.idempotency_ttl)
        {
            return bad("--idempotency-ttl must be between 1s and 30days");
        }
        if let Some(wait) = self.wait {
            // A WAIT longer than the request may take would turn every
            // success on a lagging replica into "unknown".
            if wait.timeout.is_zero()
                || wait.timeout + Duration::from_millis(200) > self.request_timeout
            {
                return bad(
                    "--wait-timeout must be above 0 and at least 200ms below --request-timeout",
                );
            }
        }
        Ok(())
    }
}

/// Shared by every request.
pub(crate) struct AppState {
    pub cfg: Arc<Config>,
    pub db: Db,
    pub ids: Arc<OrderIds>,
    pub keys: Option<ApiKeys>,
    pub request_timeout: Duration,
    pub wait: Option<crate::gate::admission::ReplicaWait>,
    pub idempotency_ttl: Duration,
    /// Sale windows, so attempts outside them cost Redis nothing.
    pub windows: window::SaleWindows,
    pub metrics: metrics::ServeMetrics,
    pub readiness: health::Readiness,
    /// MySQL lookups of already_bought answers under way at once.
    pub order_lookups: tokio::sync::Semaphore,
    /// Purchase lookups held with `?wait=` at once (half the in-flight
    /// cap, rounded down: held requests are in flight).
    pub long_polls: tokio::sync::Semaphore,
    /// How fast each voucher's line has moved (waiting buyers' estimates).
    pub pace: crate::gate::waiting::Pace,
    /// Cancelled at shutdown: held lookups answer then.
    pub stopping: CancellationToken,
    redis: SharedRedis,
    /// With `--wait-replicas`, purchases get connections of their own: a
    /// WAIT holds up everything behind it on its connection, and a lagging
    /// replica must slow purchases only, not reads, tokens or payments.
    purchases: Option<SharedRedis>,
    /// The connections' mender's progress (`/healthz`).
    pub mending: shared_redis::Mending,
}

impl AppState {
    /// One of the shared connections, in turn (each is multiplexed: a
    /// clone sends on the same socket).
    pub fn redis(&self) -> Redis {
        self.redis.next()
    }

    /// A connection for an admission (and its WAIT).
    pub fn purchase_redis(&self) -> Redis {
        match &self.purchases {
            Some(p) => p.next(),
            None => self.redis(),
        }
    }
}

pub(crate) type State = axum::extract::State<Arc<AppState>>;

/// Serves until `stop` is cancelled, then lets requests in flight finish
/// (at most `opts.drain`) and gives the node id back.
pub async fn serve(cfg: &Config, opts: &ServeOptions, stop: CancellationToken) -> Result<()> {
    opts.validate()?;
    // Taken over before anything slow (connects, the lease): SIGHUP's
    // default would end the process, e.g. a `systemctl reload` at start.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| Error::InvalidInput(format!("cannot wait for SIGHUP: {e}")))?;
    // First: a bad certificate fails the start with one line, before any
    // connection or lease is made.
    let tls = match &opts.tls {
        Some((cert, key)) => Some(tls::acceptor(cert, key)?),
        None => None,
    };
    let cap = connections::connection_cap(opts.max_connections, opts.redis_connections)?;
    let cfg = Arc::new(cfg.clone());
    let (redis, purchases) = open_redis(&cfg, opts).await?;
    let db = Db::connect(&cfg).await?;
    let ids = OrderIds::lease(&cfg, opts.node_id).await?;
    let stop_renewing = CancellationToken::new();
    let renewing = ids.keep_alive(stop_renewing.clone());
    let state = Arc::new(AppState {
        cfg: cfg.clone(),
        db: db.clone(),
        ids: ids.clone(),
        keys: opts.api_keys.clone(),
        request_timeout: opts.request_timeout,
        wait: opts.wait,
        idempotency_ttl: opts.idempotency_ttl,
        windows: window::SaleWindows::default(),
        metrics: metrics::ServeMetrics::default(),
        readiness: health::Readiness::default(),
        order_lookups: tokio::sync::Semaphore::new(ORDER_LOOKUPS),
        long_polls: tokio::sync::Semaphore::new(opts.max_in_flight / 2),
        stopping: stop.clone(),
        pace: crate::gate::waiting::Pace::default(),
        redis,
        purchases,
        mending: shared_redis::Mending::new(cfg.connect_timeout),
    });
    let stop_mending = CancellationToken::new();
    let mender = tokio::spawn(mend(state.clone(), stop_mending.clone()));
    let (listener, local) = listen(opts.listen).await?;
    tracing::info!(
        "serve listening on {}://{local} (node id {}, {} in flight and {} connections at most{})",
        if tls.is_some() { "https" } else { "http" },
        ids.node(),
        opts.max_in_flight,
        cap.connections,
        if state.keys.is_some() {
            ""
        } else {
            ", no API keys: loopback only"
        }
    );
    reload_keys_on_sighup(hangups, opts.api_keys.clone(), stop.clone());
    let metrics_page = match opts.metrics_addr {
        Some(addr) => Some(metrics::serve_page(addr, state.clone(), stop.clone()).await?),
        None => None,
    };
    let connection_metrics = state.metrics.connections.clone();
    if cap.connections < opts.max_connections {
        tracing::info!(
            "at most {} connections: the descriptor limit is {} and {} are kept for the stores (raise LimitNOFILE for more)",
            cap.connections,
            cap.descriptors,
            cap.kept_back
        );
    }
    let app = limited(state, opts);
    let limits = connections::ConnectionLimits {
        timers: connections::Timers {
            header: opts.header_timeout,
            idle: opts.idle_timeout,
        },
        cap: cap.connections,
    };
    let stopping = stop.clone();
    let served = async move {
        connections::serve(listener, tls, app, limits, connection_metrics, stopping).await;
        Ok::<(), Error>(())
    };
    let drained = async {
        stop.cancelled().await;
        tokio::time::sleep(opts.drain).await;
    };
    let result = tokio::select! {
        r = served => r,
        _ = drained => {
            tracing::warn!("requests still in flight after {}: stopping anyway", humantime::format_duration(opts.drain));
            Ok(())
        }
    };
    stop_mending.cancel();
    mender.await.ok();
    if let Some(page) = metrics_page {
        page.await.ok();
    }
    stop_renewing.cancel();
    renewing.await.ok();
    ids.release().await;
    db.close().await;
    tracing::info!("serve stopped");
    result
}

/// The shared connections to Redis (the first checks the server's
/// version), and with `--wait-replicas` the purchases' own.
async fn open_redis(
    cfg: &Config,
    opts: &ServeOptions,
) -> Result<(SharedRedis, Option<SharedRedis>)> {
    let mut first = redis_conn::connect(cfg).await?;
    redis_conn::check_version(&mut first).await?;
    let mut redis = vec![first];
    redis.extend(shared_redis::open(cfg, opts.redis_connections.saturating_sub(1)).await?);
    let purchases = match opts.wait {
        Some(_) => shared_redis::open(cfg, opts.redis_connections).await?,
        None => Vec::new(),
    };
    let redis = SharedRedis::new(redis)
        .ok_or_else(|| Error::InvalidInput("--redis-connections must be at least 1".into()))?;
    Ok((redis, SharedRedis::new(purchases)))
}

/// Replaces the connections of the pools that broke, until `stop`.
async fn mend(state: Arc<AppState>, stop: CancellationToken) {
    let mut pools = vec![(&state.redis, "shared")];
    if let Some(p) = &state.purchases {
        pools.push((p, "purchase"));
    }
    shared_redis::mend_until(&state.cfg, &pools, &state.mending, stop).await;
}

/// The API's listener, and the address it is bound to.
async fn listen(
    addr: std::net::SocketAddr,
) -> Result<(tokio::net::TcpListener, std::net::SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::InvalidInput(format!("cannot listen on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::InvalidInput(format!("cannot listen on {addr}: {e}")))?;
    Ok((listener, local))
}

/// `systemctl reload` (SIGHUP) reads the key file again: keys rotate
/// without a restart. A bad file keeps the keys in use (a WARN says why).
fn reload_keys_on_sighup(
    mut hangups: tokio::signal::unix::Signal,
    keys: Option<ApiKeys>,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = hangups.recv() => if got.is_none() { return },
            }
            match keys.as_ref().map(ApiKeys::reload) {
                Some(Ok(n)) => tracing::info!("SIGHUP: API keys read again, {n} key(s)"),
                Some(Err(e)) => tracing::warn!("SIGHUP: {e}; the keys in use stay"),
                None => tracing::info!("SIGHUP: no --api-key-file to read again"),
            }
        }
    });
}

fn router(state: Arc<AppState>, public_metrics: bool) -> Router {
    let v1 = Router::new()
        .route("/v1/vouchers/{voucher}", get(voucher::show))
        .route("/v1/vouchers/{voucher}/purchases", post(purchase::create))
        .route(
            "/v1/vouchers/{voucher}/purchases/{user}",
            get(standing::show),
        )
        .route("/v1/vouchers/{voucher}/tokens", post(voucher::issue_token))
        .route("/v1/orders/{order}", get(order::show))
        .route("/v1/orders/{order}/payment", post(order::pay))
        .route("/v1/openapi.json", get(openapi::document_route))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ));
    let mut open = Router::new()
        .merge(v1)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz));
    if public_metrics {
        open = open.route("/metrics", get(metrics::render));
    }
    open.fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::observe,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// The router behind the limits that hold for the whole process (a layer
/// added to the router is cloned into every route: a concurrency limit
/// there would be one per route). Past the in-flight cap a request is
/// refused at once, never queued; the timeout is a backstop past the
/// handlers' own (`--request-timeout`, after which a purchase answers
/// `unknown`).
fn limited(state: Arc<AppState>, opts: &ServeOptions) -> impl connections::Routes {
    let app = router(state.clone(), opts.metrics_addr.is_none());
    let backstop_state = state.clone();
    let refused = move |method: axum::http::Method, uri: axum::http::Uri, e: axum::BoxError| {
        let state = state.clone();
        async move { error::overloaded(&state, changes_something(&method, &uri), e) }
    };
    ServiceBuilder::new()
        .layer(axum::middleware::from_fn(request_id::layer))
        .layer(axum::middleware::from_fn(body::close_if_refused_with_body))
        .layer(HandleErrorLayer::new(refused))
        .load_shed()
        .concurrency_limit(opts.max_in_flight)
        .layer(axum::middleware::from_fn_with_state(
            backstop_state,
            backstop,
        ))
        .service(app)
}

/// A purchase or a payment: the request may have changed something.
fn changes_something(method: &axum::http::Method, uri: &axum::http::Uri) -> bool {
    method == axum::http::Method::POST
        && (uri.path().ends_with("/purchases") || uri.path().ends_with("/payment"))
}

/// The backstop past the handlers' own timeouts: a request not answered
/// by then is answered 503 (a purchase or a payment `outcome_unknown`). A
/// purchase lookup held with `?wait=` has its wait on top.
async fn backstop(
    axum::extract::State(state): axum::extract::State<Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let changes = changes_something(request.method(), request.uri());
    let mut limit = state.request_timeout + Duration::from_secs(1);
    if matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    ) {
        limit += standing::held_for(request.uri());
    }
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(elapsed) => error::overloaded(&state, changes, Box::new(elapsed)),
    }
}
