//! A voucher's order stream as data: entry ids and entries, how much of it is
//! not yet in MySQL, and what is pending or dead-lettered.

pub mod backlog;
pub mod entry;
pub mod id;
pub mod pending;
pub mod read_reply;
