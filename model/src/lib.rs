//! A checked model of seckill's protocols (docs/src/concepts/checked-model.md): what the Lua
//! scripts, the SQL statements and the Rust code between them do, one
//! action per step between two durable writes, for the model checker
//! (stateright) to visit every state of within small bounds. The
//! conformance test (tests/conformance.rs of the seckill crate) holds it
//! to the real scripts.

pub mod sale;

/// The checker's trait, for callers that walk the model (the conformance
/// test) without depending on stateright themselves.
pub use stateright::Model;
