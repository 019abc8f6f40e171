//! An order message of a voucher's stream, parsed and checked.

use std::collections::HashMap;

use redis::Value;

use crate::store::redis_conn::value_text;
use crate::stream::id::StreamId;

use crate::orders::voucher::MAX_ID;

/// How the order entered the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Admitted at the gate by `lua/seckill.lua`.
    Admit,
    /// A released unit handed to the head of the waitlist.
    Promote,
}

impl Kind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::Admit => "admit",
            Kind::Promote => "promote",
        }
    }
}

/// A well-formed order message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderMessage {
    /// The stream entry id, e.g. `1764400000123-0`.
    pub entry_id: String,
    pub user: u64,
    pub order: u64,
    pub voucher: u64,
    pub kind: Kind,
    /// The units the order holds: the entry's `quantity`, 1 when it has
    /// none (every entry of a release before quantities).
    pub quantity: u32,
    /// The entry's time (Redis server clock at admission): the order's creation time.
    pub created_ms: i64,
    /// The caller's client reference (the entry's `ref`), if it gave one.
    pub client_reference: Option<String>,
}

/// A quantity above this is no quantity (the column is a signed INT, and
/// no per-user limit comes near it).
pub const MAX_QUANTITY: u32 = 1_000_000;

/// A stream entry as read, valid or not: poison messages are kept whole so
/// they can be dead-lettered with what they carried.
#[derive(Debug, Clone)]
pub struct RawEntry {
    pub entry_id: String,
    pub fields: Vec<(String, String)>,
}

impl RawEntry {
    /// An entry with its fields as stored (in stream order).
    pub fn new(entry_id: String, fields: Vec<(String, String)>) -> RawEntry {
        RawEntry { entry_id, fields }
    }

    pub fn from_map(entry_id: &str, map: &HashMap<String, Value>) -> RawEntry {
        let mut fields: Vec<(String, String)> = map
            .iter()
            .map(|(k, v)| (k.clone(), value_text(v)))
            .collect();
        fields.sort();
        RawEntry {
            entry_id: entry_id.to_string(),
            fields,
        }
    }

    /// The field's value; of a field given twice, the last (as Redis's own
    /// map replies and the reclaim path read it).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Checks the entry against the stream's voucher; the error is the reason
    /// a dead letter will carry.
    pub fn parse(&self, stream_voucher: u64) -> Result<OrderMessage, String> {
        let id = |name: &str| -> Result<u64, String> {
            let text = self
                .field(name)
                .ok_or_else(|| format!("missing field '{name}'"))?;
            match text.parse::<u64>() {
                Ok(n) if (1..=MAX_ID).contains(&n) => Ok(n),
                _ => Err(format!("field '{name}' is not an id: '{text}'")),
            }
        };
        let user = id("user")?;
        let order = id("order")?;
        let voucher = id("voucher")?;
        if voucher != stream_voucher {
            return Err(format!(
                "voucher {voucher} in the stream of voucher {stream_voucher}"
            ));
        }
        let kind = match self.field("kind") {
            None | Some("admit") => Kind::Admit,
            Some("promote") => Kind::Promote,
            Some(other) => return Err(format!("unknown kind '{other}'")),
        };
        let quantity = match self.field("quantity") {
            None => 1,
            Some(text) => match text.parse::<u32>() {
                Ok(q) if (1..=MAX_QUANTITY).contains(&q) => q,
                _ => return Err(format!("field 'quantity' is not a quantity: '{text}'")),
            },
        };
        let client_reference = match self.field("ref") {
            None => None,
            Some(text) => match crate::orders::reference::check(text) {
                Ok(()) => Some(text.to_string()),
                Err(why) => return Err(format!("field 'ref' is not a client reference: {why}")),
            },
        };
        let created_ms = self
            .entry_id
            .parse::<StreamId>()?
            .time_ms()
            .ok_or_else(|| format!("entry id '{}' is out of range", self.entry_id))?;
        Ok(OrderMessage {
            entry_id: self.entry_id.clone(),
            user,
            order,
            voucher,
            kind,
            quantity,
            created_ms,
            client_reference,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(fields: &[(&str, &str)]) -> RawEntry {
        RawEntry {
            entry_id: "1764400000123-4".into(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn parses_a_good_entry() {
        let m = raw(&[
            ("user", "5"),
            ("order", "77"),
            ("voucher", "3"),
            ("kind", "promote"),
        ])
        .parse(3)
        .unwrap();
        assert_eq!(
            (m.user, m.order, m.voucher, m.kind),
            (5, 77, 3, Kind::Promote)
        );
        assert_eq!(m.created_ms, 1_764_400_000_123);
        assert_eq!(m.quantity, 1, "no quantity field: one unit");
        let three = raw(&[
            ("user", "5"),
            ("order", "77"),
            ("voucher", "3"),
            ("quantity", "3"),
        ])
        .parse(3)
        .unwrap();
        assert_eq!(three.quantity, 3);
        assert_eq!(three.client_reference, None, "no ref field: none");
        let referenced = raw(&[
            ("user", "5"),
            ("order", "77"),
            ("voucher", "3"),
            ("ref", "cart 42"),
        ])
        .parse(3)
        .unwrap();
        assert_eq!(referenced.client_reference.as_deref(), Some("cart 42"));
    }

    #[test]
    fn names_what_is_wrong_with_poison() {
        let cases = [
            (
                raw(&[("order", "77"), ("voucher", "3")]),
                "missing field 'user'",
            ),
            (
                raw(&[("user", "x"), ("order", "77"), ("voucher", "3")]),
                "field 'user' is not an id",
            ),
            (
                raw(&[("user", "0"), ("order", "77"), ("voucher", "3")]),
                "field 'user' is not an id",
            ),
            (
                raw(&[("user", "5"), ("order", "77"), ("voucher", "4")]),
                "voucher 4 in the stream of voucher 3",
            ),
            (
                raw(&[
                    ("user", "5"),
                    ("order", "77"),
                    ("voucher", "3"),
                    ("kind", "refund"),
                ]),
                "unknown kind",
            ),
            (
                raw(&[
                    ("user", "5"),
                    ("order", "77"),
                    ("voucher", "3"),
                    ("quantity", "0"),
                ]),
                "field 'quantity' is not a quantity",
            ),
            (
                raw(&[
                    ("user", "5"),
                    ("order", "77"),
                    ("voucher", "3"),
                    ("quantity", "two"),
                ]),
                "field 'quantity' is not a quantity",
            ),
            (
                raw(&[
                    ("user", "5"),
                    ("order", "77"),
                    ("voucher", "3"),
                    ("ref", "tab\there"),
                ]),
                "field 'ref' is not a client reference",
            ),
        ];
        for (entry, needle) in cases {
            let e = entry.parse(3).unwrap_err();
            assert!(e.contains(needle), "{e} lacks {needle}");
        }
    }
}
