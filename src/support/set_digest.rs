//! A digest of a set of ids that is kept as members come and go: the sum of
//! the members' hashes modulo 2^52. Two sets with the same count and digest
//! are the same set but with a chance of 2^-52, so reconcile compares a
//! voucher's sets across Redis and MySQL by two numbers each instead of
//! reading millions of members.
//!
//! The same digest is computed in three places that must agree: here, in
//! Redis's Lua (`lua/lib/digest.lua`, with `redis.sha1hex`) and in SQL
//! (`sql_hash!`, with `SHA1()`). A member's hash is the first 52 bits (13
//! hex digits) of the SHA-1 of its decimal form; 2^52 keeps every sum exact
//! in a Lua number (a double).

use serde::Serialize;

/// The digest's modulus.
pub const MODULUS: u64 = 1 << 52;

/// One member's hash.
pub fn hash(id: u64) -> u64 {
    let bytes = sha1_smol::Sha1::from(id.to_string()).digest().bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(first) >> 12
}

/// SQL for one member's hash, `$column` an integer column (a literal, so
/// the SQL can be a constant: the schema migration's).
macro_rules! sql_hash {
    ($column:literal) => {
        concat!(
            "CAST(CONV(LEFT(SHA1(",
            $column,
            "), 13), 16, 10) AS UNSIGNED)"
        )
    };
}
pub(crate) use sql_hash;

/// [`MODULUS`] in SQL.
macro_rules! sql_modulus {
    () => {
        "4503599627370496"
    };
}
pub(crate) use sql_modulus;

/// A set's digest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct SetDigest(pub u64);

impl SetDigest {
    pub fn of(ids: impl IntoIterator<Item = u64>) -> SetDigest {
        let mut d = SetDigest::default();
        for id in ids {
            d.add(id);
        }
        d
    }

    pub fn add(&mut self, id: u64) {
        self.0 = (self.0 + hash(id)) % MODULUS;
    }

    pub fn remove(&mut self, id: u64) {
        self.0 = (self.0 + MODULUS - hash(id)) % MODULUS;
    }

    /// The union with `other`, a set with no member of this one.
    pub fn plus(self, other: SetDigest) -> SetDigest {
        SetDigest((self.0 + other.0) % MODULUS)
    }

    /// What taking `other`'s members out of this set leaves (`other` a subset).
    pub fn less(self, other: SetDigest) -> SetDigest {
        SetDigest((self.0 + MODULUS - other.0) % MODULUS)
    }

    /// Meta's field as Lua writes it (absent: the empty set).
    pub fn parse(field: Option<&str>) -> Option<SetDigest> {
        match field {
            None => Some(SetDigest(0)),
            Some(s) => s
                .parse::<u64>()
                .ok()
                .filter(|d| *d < MODULUS)
                .map(SetDigest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_is_the_first_52_bits_of_the_sha1_of_the_decimal_id() {
        // sha1("1") = 356a192b7913b04c54574d18c28d46e6395428ab
        assert_eq!(hash(1), 0x356a192b7913b);
        assert!(hash(u64::MAX) < MODULUS);
    }

    #[test]
    fn the_sql_modulus_is_the_modulus() {
        assert_eq!(sql_modulus!().parse::<u64>().ok(), Some(MODULUS));
    }

    /// The benchmarks' data generator computes digests in Python: the
    /// same ones.
    #[test]
    fn the_bench_data_generator_s_copy_of_the_digest_is_this_one() {
        let ids = [1u64, 2, 42, 9_223_372_036_854_775_807, 1_000_000_000_007];
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/lib/bench_data.py");
        let out = std::process::Command::new("python3")
            .arg(script)
            .arg("digest")
            .args(ids.map(|i| i.to_string()))
            .output()
            .expect("python3 runs (scripts/services.sh installs it)");
        assert!(out.status.success(), "{out:?}");
        let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(printed, SetDigest::of(ids).0.to_string());
    }

    #[test]
    fn the_digest_forgets_the_order_and_what_was_taken_out() {
        let mut a = SetDigest::of([1, 2, 3]);
        let b = SetDigest::of([3, 1, 2]);
        assert_eq!(a, b);
        a.remove(2);
        assert_eq!(a, SetDigest::of([1, 3]));
        assert_eq!(b.less(SetDigest::of([2])), a);
        a.remove(1);
        a.remove(3);
        assert_eq!(a, SetDigest::default());
        assert_ne!(SetDigest::of([1, 2]), SetDigest::of([1, 3]));
    }
}
