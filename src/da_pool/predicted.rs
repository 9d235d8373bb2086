//! An ADD in one round trip where the node can guess: a claim of the
//! address its own notes predict free in each pool, with nothing read
//! before it. If another claim took one, the failed claim brings back a
//! page of the held addresses from there, and a second claim takes a free
//! one of it. Anything else (an ADD repeated, or whose answer was lost; a
//! range full from the guess on; a third try) goes the usual way.

use super::error::PoolError;
use super::search::{from_hint, gives, random};
use super::store::{Attempt, Owner, Page, PoolAddress, Store, WINDOW};
use crate::addr::{Addr, Range};
use crate::pools::Pool;

/// How many addresses from a guess a failed claim reads the holders of: a
/// page's worth at most. etcd counts every key of a range it reads,
/// whatever the read's limit, so a look to the end of a /16 90 % full
/// costs five times the claim.
const LOOK: u128 = 256;

/// Claims a predicted ADD makes at most: the guess, then one free address
/// of what its failure read. One other claim racing for an address costs
/// the second; more go the usual way, from random places.
const TRIES: usize = 2;

/// How a predicted ADD went.
#[derive(Debug)]
pub(super) enum Predicted {
    /// These addresses are claimed.
    Claimed(Vec<PoolAddress>),
    /// Nothing is claimed; the ADD goes the usual way, `lost` claims
    /// lost already.
    Unsettled { lost: usize },
}

/// Claims for `owner`, an attachment without a workload, an address of
/// each of `pools` where its node guesses one free.
pub(super) fn claim(
    store: &dyn Store,
    owner: &Owner,
    pools: &[Pool],
) -> Result<Predicted, PoolError> {
    let mut chosen: Vec<PoolAddress> = Vec::new();
    for pool in pools {
        let Some(guess) = store.guess(&owner.node, &pool.name) else {
            return Ok(Predicted::Unsettled { lost: 0 });
        };
        let start = from_hint(pool, guess);
        // The first address from there that the pool gives, if its range
        // has one: nothing is read, since nothing is known to be held.
        let page = Page {
            from: start,
            to: range_of(pool, start).end,
            held: Vec::new(),
            whole: true,
        };
        match pick(pool, &page, &chosen, 1) {
            Some(address) => chosen.push(PoolAddress {
                pool: pool.name.clone(),
                address,
            }),
            None => return Ok(Predicted::Unsettled { lost: 0 }),
        }
    }
    for tried in 1..=TRIES {
        let looks: Vec<(Addr, Addr)> = chosen
            .iter()
            .zip(pools)
            .map(|(h, pool)| {
                let end = range_of(pool, h.address).end;
                let look = h.address.plus(LOOK - 1).filter(|to| *to <= end);
                (h.address, look.unwrap_or(end))
            })
            .collect();
        let seen = match store.claim_or_look(owner, &chosen, &looks) {
            Ok(Attempt::Claimed) => return Ok(Predicted::Claimed(chosen)),
            Ok(Attempt::Refused(seen)) => seen,
            // Its answer lost: the usual way looks for the claim first.
            Err(e) if e.may_have_landed() => return Ok(Predicted::Unsettled { lost: tried }),
            Err(e) => return Err(e),
        };
        // An ADD repeated answers what the attachment holds, fenced or
        // not, as the usual way does. After the last try, what the pages
        // show is only noted.
        if seen.attached || seen.pages.len() != pools.len() {
            return Ok(Predicted::Unsettled { lost: tried });
        }
        if let Some(fenced) = seen.fenced {
            return Err(fenced);
        }
        // One of the first free addresses each page shows, drawn at
        // random: two ADDs that raced for one address do not race again
        // for the next.
        let mut again: Vec<PoolAddress> = Vec::new();
        for (pool, page) in pools.iter().zip(&seen.pages) {
            match pick(pool, page, &again, WINDOW as usize) {
                Some(address) => again.push(PoolAddress {
                    pool: pool.name.clone(),
                    address,
                }),
                None => return Ok(Predicted::Unsettled { lost: tried }),
            }
        }
        chosen = again;
    }
    Ok(Predicted::Unsettled { lost: TRIES })
}

/// One of the first `among` addresses of `page` that `pool` gives and
/// `chosen` does not have, drawn at random; `None` if the page shows none.
fn pick(pool: &Pool, page: &Page, chosen: &[PoolAddress], among: usize) -> Option<Addr> {
    let range = range_of(pool, page.from);
    let free = page.free(range, &|a| gives(pool, range, a, chosen), among);
    let drawn = usize::try_from(random() % free.len().max(1) as u64).unwrap_or(0);
    free.get(drawn).copied()
}

/// The range of `pool` that holds `address`, one the pool gives: a
/// search's start or an address found in a page of it always is.
fn range_of(pool: &Pool, address: Addr) -> &Range {
    pool.range_of(address).unwrap_or(&pool.ranges[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::code;
    use crate::cni::Reportable;
    use crate::da_pool::store::fake_store::FakeStore;
    use crate::da_pool::testing::*;
    use serde_json::json;

    /// 10.2.0.2 to 10.2.0.254, and 10.3.0.0/29 for a second pool.
    fn raw(default: serde_json::Value) -> Vec<u8> {
        config(
            "1.1.0",
            json!({"node": "node-a", "default": default, "pools": {
                "p": [{"subnet": "10.2.0.0/24"}],
                "q": [{"subnet": "10.3.0.0/29"}],
            }}),
            None,
        )
    }

    fn guessing() -> FakeStore {
        FakeStore {
            guessing: true,
            ..FakeStore::default()
        }
    }

    /// A store whose node guesses `address` next in `pool`.
    fn guessing_at(pool: &str, address: &str) -> FakeStore {
        let store = guessing();
        store
            .guesses
            .borrow_mut()
            .insert(pool.into(), addr(address));
        store
    }

    fn addr(text: &str) -> Addr {
        Addr::new(text.parse().unwrap())
    }

    fn other(address: &str) -> (Addr, Owner) {
        (
            addr(address),
            Owner {
                node: "node-b".into(),
                ..owner("theirs")
            },
        )
    }

    #[test]
    fn a_right_guess_is_one_claim_with_nothing_read_first() {
        let store = guessing();
        let raw = raw(json!("p"));
        // No guess yet: the usual way, which reads the pool.
        add_for(&store, &raw, "c0", &[]).unwrap();
        let (claims, looked_at) = (store.claims.get(), store.looked_at.get());
        for n in 1..=5 {
            let added = add_for(&store, &raw, &format!("c{n}"), &[]).unwrap();
            assert_eq!(addresses(&added), [format!("10.2.0.{}/24", n + 2)]);
        }
        assert_eq!(store.claims.get() - claims, 5, "one claim per ADD");
        assert_eq!(store.looked_at.get(), looked_at, "no search");
    }

    #[test]
    fn a_stale_guess_or_one_another_took_costs_one_claim_more_and_nothing_read() {
        for taken in [&["10.2.0.9"][..], &["10.2.0.9", "10.2.0.10", "10.2.0.11"]] {
            let store = guessing_at("p", "10.2.0.9");
            store
                .addresses
                .borrow_mut()
                .extend(taken.iter().map(|a| other(a)));
            let added = add_for(&store, &raw(json!("p")), "c1", &[]).unwrap();
            let got = addr(addresses(&added)[0].trim_end_matches("/24"));
            // One of the first 16 free addresses after the guess.
            assert!(!taken.iter().any(|t| addr(t) == got), "{got}");
            assert!(got > addr("10.2.0.9") && got.distance(addr("10.2.0.9")) <= 16 + 3);
            assert_eq!(store.claims.get(), 2);
            assert_eq!(store.looked_at.get(), 0, "no search");
        }
    }

    #[test]
    fn every_pool_of_a_claim_is_guessed_and_the_guess_steps_over_what_no_range_gives() {
        let store = guessing();
        let raw = raw(json!(["p", "q"]));
        // Past the first range's end: the next range's start; the gateway
        // (.1) and the network address are never given.
        store
            .guesses
            .borrow_mut()
            .insert("p".into(), addr("10.2.1.0"));
        store
            .guesses
            .borrow_mut()
            .insert("q".into(), addr("10.3.0.0"));
        let added = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_eq!(addresses(&added), ["10.2.0.2/24", "10.3.0.2/29"]);
        assert_eq!(store.claims.get(), 1);
    }

    #[test]
    fn a_fence_the_claim_meets_is_the_answer() {
        let store = guessing_at("p", "10.2.0.9");
        store
            .fences
            .borrow_mut()
            .insert("node-a".into(), "node node-a is fenced".into());
        let e = add_for(&store, &raw(json!("p")), "c1", &[]).unwrap_err();
        assert!(e.to_string().contains("fenced"), "{e}");
        assert_eq!(store.claims.get(), 1);
        assert!(store.held().is_empty());
    }

    #[test]
    fn an_add_repeated_on_a_node_fenced_since_answers_what_it_holds() {
        let store = guessing();
        let raw = raw(json!("p"));
        let first = add_for(&store, &raw, "c1", &[]).unwrap();
        store
            .fences
            .borrow_mut()
            .insert("node-a".into(), "node node-a is fenced".into());
        assert_eq!(add_for(&store, &raw, "c1", &[]).unwrap(), first);
        let e = add_for(&store, &raw, "c2", &[]).unwrap_err();
        assert!(e.to_string().contains("fenced"), "{e}");
    }

    #[test]
    fn a_claim_whose_answer_was_lost_is_found_and_answered_once() {
        let store = guessing_at("p", "10.2.0.9");
        store.unanswered_claims.set(1);
        let added = add_for(&store, &raw(json!("p")), "c1", &[]).unwrap();
        assert_eq!(addresses(&added), ["10.2.0.9/24"]);
        assert_eq!(store.held(), ["10.2.0.9"]);
        assert_eq!(store.claims.get(), 1, "found, not claimed again");
    }

    #[test]
    fn an_add_repeated_answers_what_the_attachment_holds() {
        let store = guessing();
        let raw = raw(json!("p"));
        let first = add_for(&store, &raw, "c1", &[]).unwrap();
        let again = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_eq!(first, again);
        assert_eq!(store.held(), ["10.2.0.2"]);
        // The repeated ADD's claim met the attachment: no second claim.
        assert_eq!(store.claims.get(), 2);
    }

    #[test]
    fn a_range_full_from_the_guess_on_goes_the_usual_way_and_an_exhausted_pool_says_110() {
        let store = guessing();
        let raw = raw(json!("q"));
        // .2 to .6: .2 and .3 free before the guess, the rest taken.
        store
            .guesses
            .borrow_mut()
            .insert("q".into(), addr("10.3.0.4"));
        store
            .addresses
            .borrow_mut()
            .extend(["10.3.0.4", "10.3.0.5", "10.3.0.6"].map(other));
        let added = add_for(&store, &raw, "c1", &[]).unwrap();
        assert!(["10.3.0.2/29", "10.3.0.3/29"].contains(&addresses(&added)[0]));
        add_for(&store, &raw, "c2", &[]).unwrap();
        let e = add_for(&store, &raw, "c3", &[]).unwrap_err();
        assert_eq!(e.code(), code::POOL_EXHAUSTED, "{e}");
        assert_eq!(store.held().len(), 5);
    }

    #[test]
    fn two_races_lost_go_the_usual_way_from_a_random_place() {
        let store = guessing_at("p", "10.2.0.9");
        store.losing_claims.set(2);
        add_for(&store, &raw(json!("p")), "c1", &[]).unwrap();
        assert_eq!(store.claims.get(), 3, "two predicted, one the usual way");
        assert_eq!(store.held().len(), 1);
    }

    #[test]
    fn a_claim_refused_for_good_is_the_answer_and_not_made_again() {
        let store = guessing_at("p", "10.2.0.9");
        store.refused_claims.set(1);
        let e = add_for(&store, &raw(json!("p")), "c1", &[]).unwrap_err();
        assert!(e.to_string().contains("space exceeded"), "{e}");
        assert_eq!(store.claims.get(), 1);
        assert!(store.held().is_empty());
    }

    #[test]
    fn a_failed_claim_looks_a_page_wide_within_its_range() {
        let raw = config(
            "1.1.0",
            json!({"node": "node-a", "default": "w",
                "pools": {"w": [{"subnet": "10.4.0.0/16"}]}}),
            None,
        );
        for (guess, look) in [
            ("10.4.0.9", ("10.4.0.9", "10.4.1.8")),
            ("10.4.255.250", ("10.4.255.250", "10.4.255.254")),
        ] {
            let store = guessing_at("w", guess);
            store.losing_claims.set(1);
            add_for(&store, &raw, "c1", &[]).unwrap();
            assert_eq!(store.looks.borrow()[0], (addr(look.0), addr(look.1)));
        }
    }

    #[test]
    fn a_page_shows_free_only_what_it_knows() {
        let pool = Pool::parse("p", &json!([{"subnet": "10.2.0.0/24"}])).unwrap();
        let range = &pool.ranges[0];
        let all = |_: Addr| true;
        let page = |held: &[&str], whole| Page {
            from: addr("10.2.0.10"),
            to: addr("10.2.0.254"),
            held: held.iter().map(|a| addr(a)).collect(),
            whole,
        };
        let free = page(&["10.2.0.10", "10.2.0.12"], false).free(range, &all, 16);
        assert_eq!(free, [addr("10.2.0.11")], "nothing past its last key");
        let free = page(&["10.2.0.10", "10.2.0.12"], true).free(range, &all, 3);
        assert_eq!(free, ["10.2.0.11", "10.2.0.13", "10.2.0.14"].map(addr));
        assert!(page(&[], false).free(range, &all, 3).is_empty());
        let odd = |a: Addr| a.distance(addr("10.2.0.0")) % 2 == 1;
        let free = page(&[], true).free(range, &odd, 2);
        assert_eq!(free, ["10.2.0.11", "10.2.0.13"].map(addr));
    }
}
