//! Exit codes: one place, documented in `seckill --help`, the man page and
//! the book (docs/src/reference/exit-codes.md). Scripts and cron jobs depend on these numbers.

/// Everything went as asked (`buy`: the user was admitted).
pub const OK: u8 = 0;
/// An error: bad input, a server unreachable or refusing, a refused operation.
pub const ERROR: u8 = 1;
/// The command line could not be parsed (clap's convention).
pub const USAGE: u8 = 2;
/// `reconcile`: drift found (with --dry-run, or not all of it repaired).
pub const DRIFT_FOUND: u8 = 3;
/// `reconcile`: drift found and all of it repaired.
pub const DRIFT_REPAIRED: u8 = 4;
/// `doctor`: some checks warn, none fails.
pub const DOCTOR_WARNINGS: u8 = 5;
/// `doctor`: at least one check fails.
pub const DOCTOR_FAILURES: u8 = 6;
/// `buy`: the user already holds a unit of this voucher.
pub const ALREADY_BOUGHT: u8 = 10;
/// `buy`: sold out; the user is on the waitlist (or, for a voucher in
/// buckets, waits there for units its other buckets hold).
pub const SOLD_OUT: u8 = 11;
/// `buy`: the sale window has not opened yet.
pub const NOT_STARTED: u8 = 12;
/// `buy`: the sale window has closed.
pub const ENDED: u8 = 13;
/// `buy`: the voucher is not loaded into Redis (`seckill preload`).
pub const UNKNOWN_VOUCHER: u8 = 14;

/// `buy`: the gate is paused (e.g. while it is rebuilt after Redis lost writes).
pub const PAUSED: u8 = 15;
/// `buy`: the user made the voucher's allowed attempts in the last second.
pub const RATE_LIMITED: u8 = 16;
/// `buy`: the voucher requires an admission token and this was not the user's.
pub const BAD_TOKEN: u8 = 17;
/// `buy`: fewer units left than the quantity asked for (nothing taken).
pub const NOT_ENOUGH_STOCK: u8 = 18;

/// `buy --idempotency-key`: the key was used for another purchase
/// (another user, voucher, quantity or token); nothing was done.
pub const IDEMPOTENCY_KEY_REUSED: u8 = 19;

/// `pay`: the order was already paid.
pub const ALREADY_PAID: u8 = 20;
/// `pay`: the order was cancelled at (or is past) its payment deadline.
pub const ORDER_CANCELLED: u8 = 21;
/// `pay`, `order show`: no such order.
pub const UNKNOWN_ORDER: u8 = 22;

/// `buy --idempotency-key`: a purchase with the key is still being
/// answered; nothing was done: run it again in a moment.
pub const IDEMPOTENCY_KEY_IN_FLIGHT: u8 = 23;

/// The table shown in `seckill --help` and the book.
pub const HELP: &str = "\
Exit codes:
   0  success (buy: admitted)
   1  error (bad input, server unreachable or refusing, operation refused)
   2  usage error (the command line could not be parsed)
   3  reconcile: drift found (dry run, or not all of it repaired)
   4  reconcile: drift found and all of it repaired
   5  doctor: warnings (no failure)
   6  doctor: at least one check failed
  10  buy: already bought
  11  buy: sold out, waitlisted
  12  buy: sale not started
  13  buy: sale ended
  14  buy: unknown voucher (not preloaded)
  15  buy: the gate is paused
  16  buy: rate limited (too many attempts by the user in the last second)
  17  buy: bad token (missing, wrong, expired, another user's or voucher's)
  18  buy: not enough stock for the quantity asked (nothing taken)
  19  buy: the idempotency key was used for another purchase (nothing done)
  20  pay: already paid
  21  pay: cancelled at (or past) its payment deadline
  22  pay, order show: unknown order
  23  buy: a purchase with the idempotency key is still being answered (run again)";
