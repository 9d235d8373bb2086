//! Lists in a peer's answer, read with a cap on their length: a body's
//! limit bounds its bytes, and this the items they become, each of which
//! takes far more memory than the few bytes of JSON that make it.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, Error, SeqAccess, Visitor};

/// A list of at most `N` items, for `#[serde(default, deserialize_with =
/// "at_most::<_, _, N>")]`; `null` reads as empty, and a longer list fails
/// the answer's reading, naming the cap.
pub fn at_most<'de, D, T, const N: usize>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_any(Capped::<T, N>(PhantomData))
}

struct Capped<T, const N: usize>(PhantomData<T>);

impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for Capped<T, N> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a list of at most {N} items")
    }

    fn visit_unit<E: Error>(self) -> Result<Vec<T>, E> {
        Ok(Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        // Grown as items come, never by the peer's word.
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            if items.len() == N {
                return Err(A::Error::custom(format!("a list of more than {N} items")));
            }
            items.push(item);
        }
        Ok(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Three {
        #[serde(default, deserialize_with = "at_most::<_, _, 3>")]
        items: Vec<u8>,
    }

    #[test]
    fn a_list_is_read_up_to_its_cap_and_refused_past_it() {
        let read = |text: &str| serde_json::from_str::<Three>(text).map(|t| t.items);
        assert_eq!(read(r#"{"items": [1, 2, 3]}"#).unwrap(), [1, 2, 3]);
        assert!(read(r#"{"items": null}"#).unwrap().is_empty());
        assert!(read(r#"{}"#).unwrap().is_empty());
        let e = read(r#"{"items": [1, 2, 3, 4]}"#).unwrap_err();
        assert!(e.to_string().contains("more than 3 items"), "{e}");
        let e = read(r#"{"items": "1, 2"}"#).unwrap_err();
        assert!(
            e.to_string().contains("expected a list of at most 3 items"),
            "{e}"
        );
    }
}
