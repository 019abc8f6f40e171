//! Ids as callers send them: in a path, a plain decimal; in a body, a JSON
//! number or its plain decimal string. One spelling per id: no sign, no
//! leading zero, no space, no exponent; always within 1..=i64::MAX, like
//! the CLI's. Anything else is a 400 `invalid_id` and nothing is done.

use super::error::{excerpt, quote, ApiError};
use axum::extract::{FromRequestParts, MatchedPath};
use axum::http::request::Parts;

/// The largest id: MySQL's signed BIGINT.
pub const MAX_ID: u64 = i64::MAX as u64;

pub fn parse_id(what: &str, text: &str) -> Result<u64, ApiError> {
    plain_decimal(text).ok_or_else(|| {
        ApiError::invalid_id(format!(
            "{what} must be a plain decimal between 1 and {MAX_ID}, not {}",
            quote(text)
        ))
    })
}

/// The ids of a request's path, read from the path as sent (not
/// percent-decoded: `%38` is not a spelling of 8) at the places of the
/// route's `{name}`s.
pub struct PathIds(Vec<(String, u64)>);

impl PathIds {
    /// The id named `name` in the route (the routes name every one they
    /// take: a missing one is a route without it, answered as bad input).
    pub fn get(&self, name: &str) -> Result<u64, ApiError> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| *id)
            .ok_or_else(|| ApiError::invalid_id(format!("the path has no {name}")))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for PathIds {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let template = parts
            .extensions
            .get::<MatchedPath>()
            .map(|m| m.as_str().to_string())
            .unwrap_or_default();
        let mut ids = Vec::new();
        for (place, raw) in template.split('/').zip(parts.uri.path().split('/')) {
            if let Some(name) = place.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                ids.push((name.to_string(), parse_id(name, raw)?));
            }
        }
        Ok(PathIds(ids))
    }
}

/// An id in a body, as its JSON text: a number whose value is a whole
/// number (`8`, `8.0`, `8e0`), or its plain decimal string.
pub fn id_from_json(what: &str, literal: &str) -> Result<u64, ApiError> {
    let id = match literal.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(literal)
            .ok()
            .and_then(|s| plain_decimal(&s)),
        _ => whole_number(literal),
    };
    id.filter(|n| (1..=MAX_ID).contains(n)).ok_or_else(|| {
        ApiError::invalid_id(format!(
            "{what} must be a whole number between 1 and {MAX_ID} (a JSON number or a plain decimal string), not {}",
            excerpt(literal)
        ))
    })
}

/// The value of a JSON number literal when it is a whole number that
/// fits (`19`, `19.0`, `1.9e1`, `1e18`), computed exactly from its digits:
/// never a float's rounding of it (`9007199254740993.0` is not
/// `...992`). None for anything else, a negative number included.
pub fn whole_number(literal: &str) -> Option<u64> {
    let (mantissa, exponent) = match literal.find(['e', 'E']) {
        Some(at) => (&literal[..at], literal[at + 1..].parse::<i32>().ok()?),
        None => (literal, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !all_digits(int) || !all_digits(frac) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let scale = exponent.checked_sub(frac.len() as i32)?;
    let digits = match scale {
        s if s >= 0 => format!("{digits}{}", "0".repeat(s.min(40) as usize)),
        s => {
            let cut = digits.len().checked_sub(s.unsigned_abs() as usize);
            let (kept, dropped) = match cut {
                Some(cut) => digits.split_at(cut),
                None => ("", digits.as_str()),
            };
            if !dropped.bytes().all(|b| b == b'0') {
                return None;
            }
            kept.to_string()
        }
    };
    let digits = digits.trim_start_matches('0');
    match digits.is_empty() {
        true => Some(0),
        false => digits.parse().ok(),
    }
}

/// `1`..`9223372036854775807` with nothing else: what `u64::from_str`
/// takes less its `+` sign, and leading zeros.
fn plain_decimal(text: &str) -> Option<u64> {
    let digits = text.bytes().all(|b| b.is_ascii_digit());
    if !digits || text.is_empty() || text.starts_with('0') {
        return None;
    }
    text.parse().ok().filter(|n| *n <= MAX_ID)
}

/// The pattern of an id's decimal string, exactly 1..=`MAX_ID` (for the
/// OpenAPI document, so a generated client and a fuzzer know the range).
pub fn id_pattern() -> String {
    let max = MAX_ID.to_string();
    let width = max.len();
    // Shorter numbers: any, without a leading zero.
    let mut ways = vec![format!("[1-9][0-9]{{0,{}}}", width - 2)];
    // As long: below the maximum at the first digit that differs.
    for (i, c) in max.char_indices() {
        let digit = c.to_digit(10).unwrap_or(0);
        let low = if i == 0 { 1 } else { 0 };
        if digit > low {
            let rest = width - i - 1;
            ways.push(format!("{}[{low}-{}][0-9]{{{rest}}}", &max[..i], digit - 1));
        }
    }
    ways.push(max);
    format!("^({})$", ways.join("|"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_spelling_per_id() {
        assert_eq!(parse_id("voucher", "12").unwrap(), 12);
        assert_eq!(parse_id("voucher", "9223372036854775807").unwrap(), MAX_ID);
        for bad in [
            "0",
            "08",
            "+8",
            "-1",
            " 8",
            "8 ",
            "1e3",
            "12a",
            "%38",
            "",
            "9223372036854775808",
            "99999999999999999999",
        ] {
            assert!(parse_id("voucher", bad).is_err(), "{bad:?}");
        }
        let id = |literal: &str| id_from_json("user", literal);
        assert_eq!(id("42").unwrap(), 42);
        assert_eq!(id("\"42\"").unwrap(), 42);
        assert_eq!(id("42.0").unwrap(), 42);
        assert_eq!(id("4.2e1").unwrap(), 42);
        assert_eq!(id("1e18").unwrap(), 1_000_000_000_000_000_000);
        assert_eq!(id("9007199254740993.0").unwrap(), 9_007_199_254_740_993);
        assert_eq!(id("9223372036854775807").unwrap(), MAX_ID);
        for bad in [
            "0",
            "-1",
            "1.5",
            "1.0000000000000001",
            "1e300",
            "1e-1",
            "\"+900010\"",
            "\"042\"",
            "\"1e3\"",
            "null",
            "true",
            "[1]",
            "{\"id\": 1}",
            "9223372036854775808",
        ] {
            assert!(id(bad).is_err(), "{bad}");
        }
        assert_eq!(whole_number("19.0"), Some(19));
        assert_eq!(whole_number("190e-1"), Some(19));
        assert_eq!(whole_number("0.0"), Some(0));
        assert_eq!(whole_number("-3"), None);
    }

    #[test]
    fn the_pattern_takes_exactly_the_ids() {
        let re = regex::Regex::new(&id_pattern()).unwrap();
        for ok in [
            "1",
            "9",
            "10",
            "999999999999999999",
            "9223372036854775807",
            "9223372036854775799",
            "8999999999999999999",
            "9213372036854775807",
        ] {
            assert!(re.is_match(ok), "{ok}");
            assert!(plain_decimal(ok).is_some(), "{ok}");
        }
        for bad in [
            "0",
            "01",
            "9223372036854775808",
            "9223372036854775810",
            "9300000000000000000",
            "10000000000000000000",
            "+1",
            "",
        ] {
            assert!(!re.is_match(bad), "{bad}");
            assert!(plain_decimal(bad).is_none(), "{bad}");
        }
    }
}
