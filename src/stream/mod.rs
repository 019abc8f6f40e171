//! A voucher's order stream as data: entry ids and entries, how much of it is
//! not yet in MySQL, what is pending or dead-lettered, and dead letters put
//! back on the stream (`seckill pending --requeue`).

pub mod backlog;
pub mod entry;
pub mod id;
pub mod pending;
pub mod read_reply;
pub mod requeue;
