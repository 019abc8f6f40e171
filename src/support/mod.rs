//! Small pieces every layer uses: secret masking, time parsing, order ids,
//! signals, retry backoff, set digests and SHA-256, server versions, the metrics listener and the
//! test-only fault hook.

pub mod backoff;
pub mod fault;
pub mod host;
pub mod mask;
pub mod metrics_page;
pub mod nonce;
pub mod printable;
pub mod set_digest;
pub mod sha256;
pub mod shutdown;
pub mod snowflake;
pub mod timespec;
pub mod version;
