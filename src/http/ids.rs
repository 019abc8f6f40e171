//! Ids as callers send them: JSON numbers or decimal strings, in path
//! segments or bodies; always within 1..=i64::MAX, like the CLI's.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::error::ApiError;

/// A positive id that fits MySQL's signed BIGINT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Id(pub u64);

pub fn parse_id(what: &str, text: &str) -> Result<u64, ApiError> {
    let bad = || {
        ApiError::BadRequest(format!(
            "{what} must be a whole number between 1 and {}, not {text:?}",
            i64::MAX
        ))
    };
    let n: u64 = text.parse().map_err(|_| bad())?;
    if n == 0 || n > i64::MAX as u64 {
        return Err(bad());
    }
    Ok(n)
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Id, D::Error> {
        struct IdVisitor;
        impl Visitor<'_> for IdVisitor {
            type Value = Id;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(
                    f,
                    "an id: a whole number between 1 and {} (a number or a decimal string)",
                    i64::MAX
                )
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Id, E> {
                if n == 0 || n > i64::MAX as u64 {
                    return Err(E::custom(format!(
                        "id {n} is out of range 1..={}",
                        i64::MAX
                    )));
                }
                Ok(Id(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Id, E> {
                u64::try_from(n)
                    .map_err(|_| E::custom(format!("id {n} is out of range 1..={}", i64::MAX)))
                    .and_then(|n| self.visit_u64(n))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Id, E> {
                let n: u64 = s
                    .parse()
                    .map_err(|_| E::custom(format!("id {s:?} is not a whole number")))?;
                self.visit_u64(n)
            }
        }
        d.deserialize_any(IdVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_as_numbers_or_strings_and_in_range() {
        let id = |j: &str| serde_json::from_str::<Id>(j).map(|i| i.0);
        assert_eq!(id("42").unwrap(), 42);
        assert_eq!(id("\"42\"").unwrap(), 42);
        assert_eq!(id("\"9223372036854775807\"").unwrap(), i64::MAX as u64);
        for bad in [
            "0",
            "-1",
            "1.5",
            "\"x\"",
            "\"9223372036854775808\"",
            "null",
            "true",
        ] {
            assert!(id(bad).is_err(), "{bad}");
        }
        assert!(parse_id("voucher", "0").is_err());
        assert!(parse_id("voucher", "12a").is_err());
        assert_eq!(parse_id("voucher", "12").unwrap(), 12);
    }
}
