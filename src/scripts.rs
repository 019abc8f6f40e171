//! The Lua scripts of `lua/`, embedded in the binary. `Script::invoke_async`
//! sends EVALSHA and, on NOSCRIPT (a restarted or flushed server), loads the
//! script and retries.

use std::sync::LazyLock;

use redis::Script;

/// Layer 1 admission; KEYS/ARGV/returns are documented in the file.
pub const ADMISSION_SOURCE: &str = include_str!("../lua/seckill.lua");
pub static ADMISSION: LazyLock<Script> = LazyLock::new(|| Script::new(ADMISSION_SOURCE));

/// Publishes a voucher's gate state in one step (used by `seckill preload`).
pub const PRELOAD_SOURCE: &str = include_str!("../lua/preload.lua");
pub static PRELOAD: LazyLock<Script> = LazyLock::new(|| Script::new(PRELOAD_SOURCE));
