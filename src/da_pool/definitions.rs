//! Where a pool is defined: inline in the selector's result, else in the
//! configuration (`ipam.pool.pools`), else in the store (etcd's
//! `PREFIX/pools/NAME`).

use super::error::PoolError;
use super::settings::{invalid, Settings};
use super::store::Store;
use crate::pools::{Pool, Wanted};

/// The pool `wanted` names: its inline ranges, else the configuration's,
/// else the store's.
pub(super) fn pool_of(
    store: &dyn Store,
    settings: &Settings,
    wanted: &Wanted,
) -> Result<Pool, PoolError> {
    if let Some(pool) = &wanted.inline {
        return Ok(pool.clone());
    }
    find_pool(store, settings, &wanted.name)?.ok_or_else(|| {
        invalid(format!(
            "pool {:?} is not defined: not in the previous result, nor in \"ipam.pool.pools\", nor in the store",
            wanted.name
        ))
    })
}

/// Pool `name` as the configuration defines it, else the store.
pub(super) fn find_pool(
    store: &dyn Store,
    settings: &Settings,
    name: &str,
) -> Result<Option<Pool>, PoolError> {
    if let Some(pool) = settings.pool(name) {
        return Ok(Some(pool.clone()));
    }
    match store.pool_definition(name)? {
        Some(ranges) => Ok(Some(Pool::parse(name, &ranges)?)),
        None => Ok(None),
    }
}
