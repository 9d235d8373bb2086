//! `ipam-da-pool validate`: its settings checked, as the doctor of
//! ipam-delegated asks every delegate of the family, allocating, writing
//! and pinning nothing.

use crate::args::Verb;
use crate::da_pool::settings::Settings;
use crate::skel;

/// `validate`.
pub(super) const VERB: Verb = skel::validate_verb(
    "\
Reads a plugin's configuration on stdin, as a runtime gives it,
and checks ipam.pool whole (every pool, range and key) as an ADD
does, but allocating, writing and pinning nothing: exit 0,
printing nothing, when it holds; else the CNI error object an
ADD would print (code 7, naming the key), and exit 1. Pools the
etcd store defines are not read. The doctor of ipam-delegated
runs it.
",
    |_| Ok(skel::validate(|net| Settings::checked(net).map(drop))),
);
