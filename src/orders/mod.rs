//! MySQL's side of a sale, the source of truth: vouchers (their policy and
//! their split over buckets apart), orders and their status, payment, and
//! the payment deadline's cancel-and-release.

pub mod counters;
pub mod deadline;
pub mod order;
pub mod payment;
pub mod payment_key;
pub mod policy;
pub mod reference;
pub mod restore;
pub mod timeouts;
pub mod voucher;
pub mod voucher_buckets;
