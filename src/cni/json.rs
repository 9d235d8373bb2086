//! JSON objects as their members, each value kept as the text it was
//! written as: read without parsing a value, written back byte for byte.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A JSON object's members in their order, duplicates included, each value
/// as the text it was written as. Reading them parses no value.
#[derive(Debug)]
pub struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'a> Members<'a> {
    /// The value of `key`; of a duplicated key, the last one, as Go's
    /// encoding/json (runtimes, Go delegates) reads it.
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// Every member in order, duplicates included.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &'a RawValue)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;

        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }

        deserializer.deserialize_map(MembersVisitor)
    }
}

/// A JSON string's value; `None` for any other JSON.
pub fn string(value: &RawValue) -> Option<String> {
    serde_json::from_str(value.get()).ok()
}

/// Whether `bytes` is one JSON object, with only whitespace around it.
pub fn is_object(bytes: &[u8]) -> bool {
    check_object(bytes).is_ok()
}

/// Checks that `bytes` is one JSON object, with only whitespace around it,
/// or says why not. Nothing is built: only the syntax is read.
pub fn check_object(bytes: &[u8]) -> Result<(), String> {
    match serde_json::from_slice::<&RawValue>(bytes) {
        Ok(_) if bytes.trim_ascii_start().starts_with(b"{") => Ok(()),
        Ok(_) => Err("JSON, but not an object".to_owned()),
        Err(error) => Err(error.to_string()),
    }
}

/// Appends `"key":value`, the key escaped as JSON, the value as given.
pub fn push_member(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    out.extend_from_slice(serde_json::Value::from(key).to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(value);
}
