//! A voucher's admission policy as MySQL stores it: who the gate lets try,
//! how often and for how many units, its limits, and a change of it
//! (`seckill voucher update`; orders/voucher.rs writes it to the row).

use serde::Serialize;

use crate::error::{Error, Result};

/// The most attempts per user per second a voucher may allow at the gate:
/// every attempt reads that user's passing attempts of the last second, so
/// the bound keeps a refused attempt cheap.
pub const MAX_USER_RATE: u32 = 100;

/// The most units one user may hold of a voucher.
pub const MAX_PER_USER_LIMIT: u32 = 100;

/// The most requests a waitlist may be capped at.
pub const MAX_WAITLIST_LIMIT: u32 = 100_000_000;

/// Who the gate lets try, and for how much: stored in MySQL, published to
/// the gate's meta.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Policy {
    /// At most this many attempts per user in any one second (0: no limit).
    pub user_rate: u32,
    /// Admission needs a token issued for the user and voucher.
    pub require_token: bool,
    /// The most units one purchase (one user's one order) may take.
    pub per_user_limit: u32,
    /// Once this many requests wait, a sold-out attempt writes nothing
    /// (None: no cap).
    pub waitlist_limit: Option<u32>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            user_rate: 0,
            require_token: false,
            per_user_limit: 1,
            waitlist_limit: None,
        }
    }
}

impl Policy {
    /// From the MySQL columns; out-of-range values are taken at the bounds.
    pub fn from_columns(
        user_rate: i64,
        require_token: i64,
        per_user_limit: i64,
        waitlist_limit: Option<i64>,
    ) -> Policy {
        Policy {
            user_rate: user_rate.clamp(0, i64::from(MAX_USER_RATE)) as u32,
            require_token: require_token != 0,
            per_user_limit: per_user_limit.clamp(1, i64::from(MAX_PER_USER_LIMIT)) as u32,
            waitlist_limit: waitlist_limit
                .map(|w| w.clamp(0, i64::from(MAX_WAITLIST_LIMIT)) as u32),
        }
    }

    /// For tables: `-` when off, else e.g. `5/s per user, token`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.user_rate > 0 {
            parts.push(format!("{}/s per user", self.user_rate));
        }
        if self.require_token {
            parts.push("token".to_string());
        }
        if self.per_user_limit > 1 {
            parts.push(format!("up to {} per user", self.per_user_limit));
        }
        if let Some(w) = self.waitlist_limit {
            parts.push(format!("waitlist of {w} at most"));
        }
        match parts.is_empty() {
            true => "-".to_string(),
            false => parts.join(", "),
        }
    }

    pub fn validate(&self) -> Result<()> {
        if self.user_rate > MAX_USER_RATE {
            return Err(Error::InvalidInput(format!(
                "user rate {} is out of range: it must be between 0 (off) and {MAX_USER_RATE}",
                self.user_rate
            )));
        }
        if !(1..=MAX_PER_USER_LIMIT).contains(&self.per_user_limit) {
            return Err(Error::InvalidInput(format!(
                "per-user limit {} is out of range: it must be between 1 and {MAX_PER_USER_LIMIT}",
                self.per_user_limit
            )));
        }
        if self.waitlist_limit.is_some_and(|w| w > MAX_WAITLIST_LIMIT) {
            return Err(Error::InvalidInput(format!(
                "waitlist limit is out of range: it must be between 0 and {MAX_WAITLIST_LIMIT}"
            )));
        }
        Ok(())
    }
}

/// What `voucher update` changes of the policy (None: it stays).
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyChange {
    pub user_rate: Option<u32>,
    pub require_token: Option<bool>,
    pub per_user_limit: Option<u32>,
    /// Some(None): no cap from now on.
    pub waitlist_limit: Option<Option<u32>>,
}

impl PolicyChange {
    pub fn is_empty(&self) -> bool {
        self.user_rate.is_none()
            && self.require_token.is_none()
            && self.per_user_limit.is_none()
            && self.waitlist_limit.is_none()
    }
}

/// A policy as MySQL held it, with the row's `policy_version` then: every
/// change of the policy raises the version, so of two publishes the gate
/// can tell the older one (lua/policy.lua refuses it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct VersionedPolicy {
    #[serde(flatten)]
    pub policy: Policy,
    pub version: u64,
}
