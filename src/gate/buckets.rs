//! Stock buckets (design/buckets.md): one voucher's gate split over N hash
//! tags, so one voucher sells on N masters. This module holds what every
//! part agrees on: which bucket a user belongs to, and each bucket's tag.
//!
//! Bucket 0 is the voucher's own tag `{V}`, so a voucher of one bucket has
//! today's layout. Bucket b > 0 has the tag `{V.b.s}`, the salt `s` chosen
//! once so that the tags' slots are served by different masters; the tag is
//! recorded, not recomputed, because a reshard later moves slots, not keys.

use crate::error::{Error, Result};
use crate::store::keys::bucket_tag as tag;
use crate::store::slot_map::{slot_of, SlotMap};

/// The most buckets a voucher may have: a bucket costs the mover a script
/// call per round, and past one per master a bucket buys nothing.
pub const MAX_BUCKETS: u32 = 64;

/// How many salts the choice tries per bucket before it settles for a
/// master that serves a bucket already (16384 slots: a master serving a
/// third of them is found in a handful of tries).
const SALT_TRIES: u32 = 10_000;

/// The bucket of `user` in a voucher of `buckets` buckets: the first 8
/// bytes of the SHA-1 of the user id's decimal form, big-endian, modulo
/// `buckets`. `lua/seckill.lua` computes the same (a test holds the two
/// together) and the README gives it to application servers.
pub fn bucket_of(user: u64, buckets: u32) -> u32 {
    if buckets <= 1 {
        return 0;
    }
    let digest = sha1_smol::Sha1::from(user.to_string()).digest().bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % u64::from(buckets)) as u32
}

/// Checks a bucket count given by a person.
pub fn validate_buckets(buckets: u32) -> Result<u32> {
    if (1..=MAX_BUCKETS).contains(&buckets) {
        Ok(buckets)
    } else {
        Err(Error::InvalidInput(format!(
            "--buckets must be between 1 and {MAX_BUCKETS}, not {buckets}"
        )))
    }
}

/// One tag per bucket, bucket 0 first: each bucket on a master no earlier
/// bucket is on while there are masters to spare, then on the master
/// serving the fewest buckets. Without a slot map (a single node) every
/// salt is 0.
pub fn choose_tags(voucher: u64, buckets: u32, slots: Option<&SlotMap>) -> Vec<String> {
    let Some(slots) = slots else {
        return (0..buckets).map(|b| tag(voucher, b, 0)).collect();
    };
    let master = |t: &str| {
        slots
            .master_of(slot_of(&format!("{{{t}}}")))
            .map(str::to_string)
    };
    let first = tag(voucher, 0, 0);
    let mut taken: Vec<Option<String>> = vec![master(&first)];
    let mut tags = vec![first];
    for bucket in 1..buckets {
        let uses = |m: &Option<String>| taken.iter().filter(|t| *t == m).count();
        let fewest = slots
            .masters()
            .iter()
            .map(|m| uses(&Some(m.to_string())))
            .min()
            .unwrap_or(0);
        let chosen = (0..SALT_TRIES)
            .map(|salt| tag(voucher, bucket, salt))
            .find(|t| {
                let m = master(t);
                m.is_some() && uses(&m) == fewest
            })
            .unwrap_or_else(|| tag(voucher, bucket, 0));
        taken.push(master(&chosen));
        tags.push(chosen);
    }
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_bucket_is_bucket_zero() {
        for user in [1, 2, 42, u64::MAX] {
            assert_eq!(bucket_of(user, 1), 0);
            assert_eq!(bucket_of(user, 0), 0);
        }
    }

    #[test]
    fn routing_is_the_documented_digest() {
        // SHA-1("1") = 356a192b7913b04c 54574d18c28d46e6395428ab: the first
        // 8 bytes are 0x356a192b7913b04c = 3848916506047131724.
        assert_eq!(bucket_of(1, 3), (3_848_916_506_047_131_724u64 % 3) as u32);
        assert_eq!(bucket_of(1, 7), (3_848_916_506_047_131_724u64 % 7) as u32);
    }

    #[test]
    fn routing_spreads_users_evenly() {
        let mut per = [0u32; 3];
        for user in 1..=30_000 {
            per[bucket_of(user, 3) as usize] += 1;
        }
        for n in per {
            assert!((9_500..=10_500).contains(&n), "{per:?}");
        }
    }

    #[test]
    fn a_single_node_takes_salt_zero() {
        assert_eq!(choose_tags(7, 3, None), vec!["7", "7.1.0", "7.2.0"]);
    }

    #[test]
    fn bucket_counts_are_checked() {
        assert!(validate_buckets(0).is_err());
        assert!(validate_buckets(MAX_BUCKETS + 1).is_err());
        assert_eq!(validate_buckets(3).unwrap(), 3);
    }
}
