//! The connections' own metrics (registered on serve's page by
//! `http/metrics.rs`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    reason: &'static str,
}

/// The API listener's connections: open now, and those serve closed itself
/// by reason (`header_timeout`, `idle_timeout`, `shed` at the cap,
/// `refused` at the cap while every one was busy).
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    open: Gauge,
    closed: Family<ClosedLabels, Counter>,
}

/// Counts a connection open until dropped.
pub struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl ConnectionMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "connections",
            "Connections open on the API listener",
            self.open.clone(),
        );
        registry.register(
            "connections_closed",
            "Connections serve closed: header_timeout, idle_timeout, shed (at the connection cap, the longest waiting for their clients), refused (at the cap while every one was busy)",
            self.closed.clone(),
        );
    }

    pub fn open(&self) -> OpenConnection {
        self.open.inc();
        OpenConnection(self.open.clone())
    }

    pub fn closed(&self, reason: &'static str, n: usize) {
        if n > 0 {
            self.closed
                .get_or_create(&ClosedLabels { reason })
                .inc_by(n as u64);
        }
    }
}
