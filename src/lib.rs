//! `seckill`: a flash-sale system in five layers (see the book under docs/).
//!
//! The library holds all logic; `src/cli` only parses arguments and renders
//! results, and `src/main.rs` maps the outcome to an exit code.
//!
//! - `store`: configuration, connections, schema, key layout, scripts, registry
//! - `gate`: layer 1 (admission, waitlist, preload)
//! - `purchase`: one purchase as `buy`, `bench` and `serve` make it
//! - `bench`: the admission load generator (`seckill bench`)
//! - `stream`: the order stream as data (ids, entries, backlog, dead letters)
//! - `worker`: layers 2–5 as one long-running process
//! - `orders`: MySQL's vouchers and orders, payment, deadline cancellation
//! - `reconcile`, `status`: both stores side by side
//! - `doctor`: the servers' settings and the roles' rights, checked
//! - `support`: masking, time, ids, signals, backoff

pub mod bench;
pub mod cli;
pub mod doctor;
pub mod error;
pub mod exit_code;
pub mod gate;
pub mod http;
pub mod idempotency;
pub mod orders;
pub mod purchase;
pub mod reconcile;
pub mod status;
pub mod store;
pub mod stream;
pub mod support;
pub mod worker;

pub use error::{Error, Result};
