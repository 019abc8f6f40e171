//! This host's name and random tags, for names that must differ between
//! hosts, processes and runs.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

pub fn name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// 64 bits from the standard library's randomly seeded hasher: enough to
/// keep concurrent runs' names apart (not a secret: tokens use getrandom).
pub fn random_tag() -> u64 {
    RandomState::new().hash_one(std::process::id())
}
