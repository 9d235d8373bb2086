//! How a free address of a pool is found without enumerating the pool:
//! from just after the last address given, then at random places (in a
//! pool 90 % full, one in ten is free, however it is laid out), and only
//! when the pool may be exhausted, through every range in order.

use super::error::{Cooldowns, PoolError};
use super::store::{PoolAddress, Store, WINDOW};
use crate::addr::Addr;
use crate::pools::Pool;

/// How many random places a search looks at before it goes through the
/// pool in order. In a pool 90 % full, a random place is free one time in
/// ten: all 128 looks fail about once in a million searches.
const RANDOM_LOOKS: usize = 128;

/// Where an attempt of node `node` starts looking in `pool`: until a race
/// is lost, from the hint (just after the last address given; when that
/// is past a range's end, the next range's start), so that addresses go
/// round the pool in order; after `lost` races, at a random address, so
/// that the nodes that raced for one address spread out rather than race
/// again for the next.
pub fn starting_point(
    store: &dyn Store,
    node: &str,
    pool: &Pool,
    lost: usize,
) -> Result<Addr, PoolError> {
    if lost > 0 {
        return Ok(random_address(pool));
    }
    Ok(match store.hint(node, &pool.name)? {
        Some(hint) => from_hint(pool, hint),
        None => pool.ranges[0].start,
    })
}

/// Where a search of `pool` starts from `hint`: the hint itself if a
/// range holds it; else the start of the next range after it, or of the
/// first (the hint was past the last range's end, or left by a range
/// since taken out of the pool).
pub fn from_hint(pool: &Pool, hint: Addr) -> Addr {
    if pool.range_of(hint).is_some() {
        return hint;
    }
    pool.ranges
        .iter()
        .map(|r| r.start)
        .filter(|start| *start > hint)
        .min()
        .unwrap_or(pool.ranges[0].start)
}

/// A free address of `pool` that `taken` (what this claim has chosen
/// already) does not have: first from `start`; unless a search found the
/// pool full moments ago, then at random places, then through every range
/// in order, from `start` round to it again. None is code 110, noted for
/// the next searches if `note` (an ADD; STATUS writes nothing).
pub fn choose_free(
    store: &dyn Store,
    pool: &Pool,
    start: Addr,
    taken: &[PoolAddress],
    note: bool,
) -> Result<Addr, PoolError> {
    // Excluded blocks are stepped over whole, never looked at address by
    // address: one can be a /64.
    let free_in = |range: &crate::addr::Range, from: Addr, to: Addr| {
        let gives = |a: Addr| gives(pool, range, a, taken);
        for (first, last) in range.spans(from, to) {
            if let Some(free) = store.first_free(first, last, &gives)? {
                return Ok(Some(free));
            }
        }
        Ok(None)
    };
    let look = |at: Addr| -> Result<Option<Addr>, PoolError> {
        let Some(range) = pool.range_of(at) else {
            return Ok(None);
        };
        let to = at
            .plus(WINDOW - 1)
            .filter(|to| *to <= range.end)
            .unwrap_or(range.end);
        free_in(range, at, to)
    };
    let exhausted = |cooling: Cooldowns| PoolError::Exhausted {
        pool: pool.name.clone(),
        cooling,
    };
    if let Some(free) = look(start)? {
        return Ok(free);
    }
    // Asked only now: a search that finds an address at once needs not.
    if let Some(cooling) = store.noted_full(&pool.name)? {
        return Err(exhausted(cooling));
    }
    for at in (0..RANDOM_LOOKS).map(|_| random_address(pool)) {
        if let Some(free) = look(at)? {
            return Ok(free);
        }
    }
    let first = pool
        .ranges
        .iter()
        .position(|r| r.contains(start))
        .unwrap_or(0);
    let count = pool.ranges.len();
    for i in 0..count {
        let range = &pool.ranges[(first + i) % count];
        let from = if i == 0 { start } else { range.start };
        if let Some(free) = free_in(range, from, range.end)? {
            return Ok(free);
        }
    }
    let range = &pool.ranges[first];
    if let Some(free) = free_in(range, range.start, start)? {
        return Ok(free);
    }
    // Read once the pool is found full, and noted with it.
    let cooling = match store.cools() {
        true => cooldowns(store, pool)?,
        false => Cooldowns::default(),
    };
    if note {
        // Not noted (etcd at its quota, say): the next search reads it all.
        if let Err(e) = store.note_full(&pool.name, &cooling) {
            tracing::warn!(
                "pool {:?} is full, but that cannot be noted: {e}",
                pool.name
            );
        }
    }
    Err(exhausted(cooling))
}

/// What cools down in `pool`: how many of its addresses, and when the
/// first is free again.
fn cooldowns(store: &dyn Store, pool: &Pool) -> Result<Cooldowns, PoolError> {
    let mut cooling = Cooldowns::default();
    for range in &pool.ranges {
        for (address, c) in store.cooling(range.start, range.end)? {
            if range.gives(address) && !pool.reserved.contains(&address) {
                cooling.count += 1;
                cooling.first_until = Some(cooling.first_until.map_or(c.until, |u| u.min(c.until)));
            }
        }
    }
    Ok(cooling)
}

/// Whether `pool` may give `address` of its `range` to a claim that has
/// chosen `taken` already.
pub fn gives(
    pool: &Pool,
    range: &crate::addr::Range,
    address: Addr,
    taken: &[PoolAddress],
) -> bool {
    range.gives(address)
        && !pool.reserved.contains(&address)
        && !taken.iter().any(|h| h.address == address)
}

/// An address of `pool` drawn at random, every address alike among the
/// pool's first 2^64 (a random draw is 64 bits; an IPv6 pool that wide is
/// nowhere near full).
fn random_address(pool: &Pool) -> Addr {
    let sizes: Vec<u128> = pool.ranges.iter().map(|r| r.size()).collect();
    let total = sizes
        .iter()
        .fold(0u128, |sum, size| sum.saturating_add(*size));
    let mut n = u128::from(random()) % total.max(1);
    for (range, size) in pool.ranges.iter().zip(sizes) {
        if n < size {
            return range.at(n);
        }
        n -= size;
    }
    pool.ranges[0].start
}

/// A number no other process draws: SipHash keyed from the system's
/// randomness, which std seeds once per thread and steps per use.
pub fn random() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::da_pool::store::fake_store::FakeStore;
    use crate::da_pool::testing::owner;
    use serde_json::json;
    use std::collections::BTreeSet;

    fn pool(ranges: serde_json::Value) -> Pool {
        Pool::parse("p", &ranges).unwrap()
    }

    fn addr(text: &str) -> Addr {
        Addr::new(text.parse().unwrap())
    }

    #[test]
    fn random_places_are_every_address_of_every_range_alike() {
        let pool = pool(json!([
            {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.13"},
            {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.20", "rangeEnd": "10.1.0.23"},
        ]));
        let drawn: BTreeSet<Addr> = (0..400).map(|_| random_address(&pool)).collect();
        let every: BTreeSet<Addr> = pool
            .ranges
            .iter()
            .flat_map(|r| (0..r.size()).map(|n| r.at(n)))
            .collect();
        // Eight addresses, 400 draws: one missed by chance once in 10^22.
        assert_eq!(drawn, every);
    }

    #[test]
    fn a_hint_no_range_gives_any_more_starts_at_the_next_range() {
        // The hint was left by a range since taken out of the pool.
        let pool = pool(json!([
            {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.19"},
            {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.40", "rangeEnd": "10.1.0.49"},
        ]));
        let store = FakeStore::default();
        for (hint, start) in [
            ("10.1.0.30", "10.1.0.40"),
            ("10.1.0.15", "10.1.0.15"),
            ("10.1.0.60", "10.1.0.10"),
        ] {
            store.hints.borrow_mut().insert("p".into(), addr(hint));
            let from = starting_point(&store, "node-a", &pool, 0).unwrap();
            assert_eq!(from, addr(start), "hint {hint}");
        }
    }

    #[test]
    fn the_search_in_order_goes_round_every_range_from_wherever_it_starts() {
        // The first range is 2^64 wide, all excluded but its first four
        // addresses, so that no random look finds a free address: only the
        // search in order, round the ranges from the one it starts in.
        let exclude: Vec<String> = (65..=126u32)
            .map(|p| {
                format!(
                    "{}/{p}",
                    std::net::Ipv6Addr::from(0xfd00u128 << 112 | 1u128 << (128 - p))
                )
            })
            .collect();
        let pool = pool(json!([
            {"subnet": "fd00::/64", "exclude": exclude},
            {"subnet": "fd00:1::/125"},
            {"subnet": "fd00:2::/125"},
        ]));
        // Each range full but one address, from each other range.
        for (start, free) in [("fd00:2::3", "fd00::2"), ("fd00:1::3", "fd00:2::5")] {
            let store = FakeStore::default();
            for range in 0..3 {
                for n in 0..8 {
                    let taken = addr(&format!("fd00:{range}::{n}"));
                    if taken != addr(free) {
                        store.addresses.borrow_mut().insert(taken, owner("full"));
                    }
                }
            }
            let found = choose_free(&store, &pool, addr(start), &[], true).unwrap();
            assert_eq!(found, addr(free), "from {start}");
        }
    }
}
