//! Layer 1, the Redis gate: admission through `lua/seckill.lua`, the gate's
//! state and waitlist, publishing a gate rebuilt from MySQL (preload and
//! reconcile).

pub mod admission;
pub mod buckets;
pub mod mover_lease;
pub mod pause;
pub mod policy;
pub mod preload;
pub mod rebuilt;
pub mod state;
pub mod token;
pub mod transfer;
pub mod waiting;
pub mod waitlist;
pub mod witness;
