//! `seckill`: a flash-sale system in five layers (see DESIGN.md and the README).
//!
//! The library holds all logic; `src/cli` only parses arguments and renders
//! results, and `src/main.rs` maps the outcome to an exit code.

pub mod admission;
pub mod backlog;
pub mod bench;
pub mod cli;
pub mod config;
pub mod db;
pub mod deadline;
pub mod error;
pub mod exit_code;
pub mod fault;
pub mod gate;
pub mod keys;
pub mod lock;
pub mod mask;
pub mod order;
pub mod payment;
pub mod pending;
pub mod preload;
pub mod reconcile;
pub mod redis_store;
pub mod schema;
pub mod scripts;
pub mod shutdown;
pub mod snowflake;
pub mod status;
pub mod timespec;
pub mod voucher;
pub mod waitlist;
pub mod worker;

pub use error::{Error, Result};
