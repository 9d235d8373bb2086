//! Address ranges: a range read and checked whole, the addresses it may
//! give out, and arithmetic on addresses as 128-bit numbers, so that even a
//! /48 of IPv6 is never enumerated.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::Value;

/// An IP version; IPv4's addresses sort before IPv6's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    fn bits(self) -> u32 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// An address as a number in its family (IPv4's in the low 32 bits), in
/// the order the family's addresses come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Addr {
    family: Family,
    value: u128,
}

impl Addr {
    /// The address of `ip`; an IPv4-mapped IPv6 address is the IPv4 one,
    /// as libcni reads it.
    pub fn new(ip: IpAddr) -> Addr {
        match ip {
            IpAddr::V4(v4) => Addr::v4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Addr::v4(v4),
                None => Addr {
                    family: Family::V6,
                    value: u128::from(v6),
                },
            },
        }
    }

    fn v4(v4: Ipv4Addr) -> Addr {
        Addr {
            family: Family::V4,
            value: u128::from(u32::from(v4)),
        }
    }

    /// Its IP version.
    pub fn family(self) -> Family {
        self.family
    }

    /// The address as std has it.
    pub fn ip(self) -> IpAddr {
        match self.family {
            // Only IPv4 values (at most u32::MAX) are made for V4.
            Family::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(self.value).unwrap_or(0))),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(self.value)),
        }
    }

    /// How far `self` is past `earlier`, in addresses (0 if it is not).
    pub fn distance(self, earlier: Addr) -> u128 {
        self.value.saturating_sub(earlier.value)
    }

    /// The address `n` after this one, if the family has it.
    pub fn plus(self, n: u128) -> Option<Addr> {
        let value = self.value.checked_add(n)?;
        let fits = self.family.bits() == 128 || value >> self.family.bits() == 0;
        fits.then_some(Addr { value, ..self })
    }

    /// A fixed-width text that sorts as the addresses do: dotted quads of
    /// three digits, or the eight groups of IPv6 in full. What the stores
    /// name addresses by, so that a range of names is a range of addresses.
    pub fn sortable(self) -> String {
        match self.ip() {
            IpAddr::V4(v4) => {
                let [a, b, c, d] = v4.octets();
                format!("{a:03}.{b:03}.{c:03}.{d:03}")
            }
            IpAddr::V6(v6) => {
                let groups: Vec<String> =
                    v6.segments().iter().map(|g| format!("{g:04x}")).collect();
                groups.join(":")
            }
        }
    }

    /// The address a [`Self::sortable`] text names.
    pub fn from_sortable(text: &str) -> Option<Addr> {
        if text.contains('.') {
            let octets: Vec<u8> = text
                .split('.')
                .map(|o| o.parse().ok())
                .collect::<Option<_>>()?;
            let octets: [u8; 4] = octets.try_into().ok()?;
            Some(Addr::v4(Ipv4Addr::from(octets)))
        } else {
            text.parse::<Ipv6Addr>()
                .ok()
                .map(|v6| Addr::new(IpAddr::V6(v6)))
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ip().fmt(f)
    }
}

/// A range of a pool: a subnet, the part of it addresses are given from,
/// and its gateway, which is never given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The subnet's network address.
    pub network: Addr,
    /// The subnet's prefix length: an address given from the range has it.
    pub prefix: u8,
    /// The first address that may be given.
    pub start: Addr,
    /// The last address that may be given.
    pub end: Addr,
    /// The gateway (by default the subnet's first address).
    pub gateway: Addr,
    /// `exclude`: the addresses and blocks never given, in address order.
    pub exclude: Vec<Block>,
}

/// A block of addresses: one address, or a CIDR's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Its first address.
    pub first: Addr,
    /// Its last address.
    pub last: Addr,
    prefix: u8,
}

impl Block {
    /// Reads `ADDRESS` or `ADDRESS/PREFIX` (a network address: the block
    /// is what the operator wrote, not a guess at what was meant).
    fn parse(text: &str) -> Result<Block, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let bad = || format!("{text:?} is not an address or ADDRESS/PREFIX");
        let first = Addr::new(address.parse::<IpAddr>().map_err(|_| bad())?);
        let bits = first.family.bits();
        let prefix = match prefix {
            Some(prefix) => prefix.parse::<u8>().map_err(|_| bad())?,
            // As many bits as the family has: one address.
            None => u8::try_from(bits).map_err(|_| bad())?,
        };
        if u32::from(prefix) > bits {
            return Err(bad());
        }
        let mask = host_mask(first.family, prefix);
        if first.value & mask != 0 {
            return Err(format!(
                "{text} is not a network address: with /{prefix} it is {}/{prefix}",
                Addr {
                    value: first.value & !mask,
                    ..first
                }
            ));
        }
        let last = Addr {
            value: first.value | mask,
            ..first
        };
        Ok(Block {
            first,
            last,
            prefix,
        })
    }

    /// Whether `addr` is one of the block's.
    pub fn contains(&self, addr: Addr) -> bool {
        self.first <= addr && addr <= self.last
    }
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            self.first.fmt(f)
        } else {
            write!(f, "{}/{}", self.first, self.prefix)
        }
    }
}

/// The keys of a range, as host-local reads them.
pub const RANGE_KEYS: [&str; 5] = ["subnet", "rangeStart", "rangeEnd", "gateway", "exclude"];

impl Range {
    /// Reads and checks a range, `{"subnet", "rangeStart"?, "rangeEnd"?,
    /// "gateway"?, "exclude"?}`, whole: the subnet a network address of a
    /// size that has addresses to give, every other address (and every
    /// excluded block) inside it and of its family, the start not after the
    /// end. Defaults as host-local's: the
    /// range from the subnet's second address to its last (its broadcast
    /// address excluded in IPv4), the gateway its first. The error names
    /// the field.
    pub fn parse(value: &Value) -> Result<Range, String> {
        let object = value
            .as_object()
            .ok_or_else(|| "must be an object with a \"subnet\"".to_owned())?;
        // A misspelt "exclude" would hand out what it meant to keep back.
        if let Some(key) = object.keys().find(|k| !RANGE_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "unknown key {key:?}: a range has {}",
                RANGE_KEYS.map(|k| format!("{k:?}")).join(", ")
            ));
        }
        let subnet = object
            .get("subnet")
            .and_then(Value::as_str)
            .ok_or_else(|| "\"subnet\" is missing or not a string".to_owned())?;
        let (network, prefix) = parse_subnet(subnet)?;
        let last = network
            .plus(host_mask(network.family, prefix))
            .ok_or_else(|| format!("\"subnet\" {subnet} is not a subnet"))?;
        let inside = |field: &str| -> Result<Option<Addr>, String> {
            let Some(value) = object.get(field) else {
                return Ok(None);
            };
            let text = value
                .as_str()
                .ok_or_else(|| format!("\"{field}\" must be an address"))?;
            let ip: IpAddr = text
                .parse()
                .map_err(|_| format!("\"{field}\" {text:?} is not an address"))?;
            let addr = Addr::new(ip);
            if addr.family != network.family {
                return Err(format!(
                    "\"{field}\" {text} is not of the subnet's IP version ({subnet})"
                ));
            }
            if addr < network || addr > last {
                return Err(format!("\"{field}\" {text} is outside the subnet {subnet}"));
            }
            Ok(Some(addr))
        };
        let start = inside("rangeStart")?;
        let end = inside("rangeEnd")?;
        let gateway = inside("gateway")?;
        let mut exclude = Vec::new();
        if let Some(list) = object.get("exclude") {
            let list = list
                .as_array()
                .ok_or_else(|| "\"exclude\" must be an array of addresses and CIDRs".to_owned())?;
            for entry in list {
                let text = entry
                    .as_str()
                    .ok_or_else(|| format!("\"exclude\" {entry} is not a string"))?;
                let block = Block::parse(text).map_err(|e| format!("\"exclude\" {e}"))?;
                if block.first.family != network.family {
                    return Err(format!(
                        "\"exclude\" {text} is not of the subnet's IP version ({subnet})"
                    ));
                }
                if block.first < network || block.last > last {
                    return Err(format!("\"exclude\" {text} is outside the subnet {subnet}"));
                }
                exclude.push(block);
            }
        }
        exclude.sort_by_key(|block| block.first);
        // A subnet has at least four addresses (checked above), so these
        // neighbours exist.
        let first = Addr {
            value: network.value + 1,
            ..network
        };
        let default_end = match network.family {
            // IPv4's broadcast address is never given.
            Family::V4 => Addr {
                value: last.value - 1,
                ..last
            },
            Family::V6 => last,
        };
        let range = Range {
            network,
            prefix,
            start: start.unwrap_or(first),
            end: end.unwrap_or(default_end),
            gateway: gateway.unwrap_or(first),
            exclude,
        };
        if range.start > range.end {
            return Err(format!(
                "\"rangeStart\" {} is after \"rangeEnd\" {}",
                range.start, range.end
            ));
        }
        Ok(range)
    }

    /// Whether `addr` is in the part of the range addresses are given from.
    pub fn contains(&self, addr: Addr) -> bool {
        self.start <= addr && addr <= self.end
    }

    /// How many addresses the range spans, from its start to its end
    /// (saturated: a whole IPv6 space is one short).
    pub fn size(&self) -> u128 {
        (self.end.value - self.start.value).saturating_add(1)
    }

    /// The address `n` places into the range, counting round it.
    pub fn at(&self, n: u128) -> Addr {
        Addr {
            value: self.start.value + n % self.size(),
            ..self.start
        }
    }

    /// Whether `addr` may be given from this range: in it, and neither the
    /// gateway, nor excluded, nor, in IPv4, the subnet's network or
    /// broadcast address.
    pub fn gives(&self, addr: Addr) -> bool {
        self.refusal(addr).is_none()
    }

    /// Why `addr` may not be given from this range, if it may not.
    pub fn refusal(&self, addr: Addr) -> Option<String> {
        if let Some(why) = self.reserved_by_ipv4(addr) {
            Some(why)
        } else if !self.contains(addr) {
            Some(format!("it is outside the range of {}", self.subnet()))
        } else if addr == self.gateway {
            Some(format!("it is the gateway of {}", self.subnet()))
        } else {
            self.exclude
                .iter()
                .find(|block| block.contains(addr))
                .map(|block| format!("it is excluded ({block}) from {}", self.subnet()))
        }
    }

    /// Why `addr` is never a host's address in this range's IPv4 subnet,
    /// if it is its network or broadcast address (a default range leaves
    /// both out, so they are in no range, but in its subnet).
    pub fn reserved_by_ipv4(&self, addr: Addr) -> Option<String> {
        if self.network.family != Family::V4 {
            return None;
        }
        let broadcast = self
            .network
            .plus(host_mask(self.network.family, self.prefix));
        if addr == self.network {
            Some(format!("it is the network address of {}", self.subnet()))
        } else if Some(addr) == broadcast {
            Some(format!("it is the broadcast address of {}", self.subnet()))
        } else {
            None
        }
    }

    /// How many addresses the range may give: from its start to its end,
    /// but what it never gives (excluded, the gateway, IPv4's network and
    /// broadcast addresses). Counted by blocks, never by address.
    pub fn given_count(&self) -> u128 {
        let spans = self.spans(self.start, self.end);
        let total = spans.iter().fold(0u128, |sum, (first, last)| {
            // Saturated: a span of the whole IPv6 space is one short.
            sum.saturating_add((last.value - first.value).saturating_add(1))
        });
        let broadcast = self
            .network
            .plus(host_mask(self.network.family, self.prefix));
        let mut special = vec![self.gateway];
        if self.network.family == Family::V4 {
            special.push(self.network);
            special.extend(broadcast);
        }
        special.sort();
        special.dedup();
        let in_spans = special
            .iter()
            .filter(|a| spans.iter().any(|(first, last)| first <= *a && *a <= last))
            .count();
        total.saturating_sub(in_spans as u128)
    }

    /// The parts of `[from, to]` that no `exclude` block covers, in order.
    pub fn spans(&self, from: Addr, to: Addr) -> Vec<(Addr, Addr)> {
        let mut spans = Vec::new();
        let mut next = from;
        for block in &self.exclude {
            if block.last < next {
                continue;
            }
            if block.first > to {
                break;
            }
            if block.first > next {
                spans.push((
                    next,
                    Addr {
                        value: block.first.value - 1,
                        ..next
                    },
                ));
            }
            match block.last.plus(1) {
                Some(after) => next = after,
                // The block ends the address space: nothing after it.
                None => return spans,
            }
        }
        if next <= to {
            spans.push((next, to));
        }
        spans
    }

    /// Whether the two ranges share an address that either may give.
    pub fn overlaps(&self, other: &Range) -> bool {
        self.network.family == other.network.family
            && self.start <= other.end
            && other.start <= self.end
    }

    /// The subnet, as text (`10.1.0.0/16`).
    pub fn subnet(&self) -> String {
        format!("{}/{}", self.network, self.prefix)
    }
}

/// A subnet: its network address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    pub network: Addr,
    pub prefix: u8,
}

impl Subnet {
    /// Reads `ADDRESS/PREFIX`, a network address with addresses to give.
    pub fn parse(text: &str) -> Result<Subnet, String> {
        parse_subnet(text).map(|(network, prefix)| Subnet { network, prefix })
    }

    /// Whether `addr` is one of the subnet's addresses.
    pub fn contains(&self, addr: Addr) -> bool {
        addr.family == self.network.family
            && addr.value & !host_mask(addr.family, self.prefix) == self.network.value
    }

    /// Its IP version.
    pub fn family(&self) -> Family {
        self.network.family
    }

    /// Whether every address of `other` is one of this subnet's.
    pub fn covers(&self, other: &Subnet) -> bool {
        other.prefix >= self.prefix && self.contains(other.network)
    }

    /// The first and last addresses of this subnet that a host of
    /// `within`, which covers it, may have: all of them but, in IPv4,
    /// `within`'s network and broadcast addresses.
    pub fn host_bounds_in(&self, within: &Subnet) -> (Addr, Addr) {
        let last = |s: &Subnet| Addr {
            value: s.network.value | host_mask(s.network.family, s.prefix),
            ..s.network
        };
        let (mut first, mut end) = (self.network, last(self));
        if self.network.family == Family::V4 {
            if first == within.network {
                first.value += 1;
            }
            if end == last(within) {
                end.value -= 1;
            }
        }
        (first, end)
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The host part of a subnet of `prefix`, all ones: what added to its
/// network address makes its last address (a whole IPv6 space included).
fn host_mask(family: Family, prefix: u8) -> u128 {
    let host_bits = family.bits() - u32::from(prefix);
    1u128.checked_shl(host_bits).map_or(u128::MAX, |m| m - 1)
}

/// `ADDRESS/PREFIX`, the address a network address, with room for an
/// address besides the network's (and, in IPv4, the broadcast one).
fn parse_subnet(text: &str) -> Result<(Addr, u8), String> {
    let bad = || format!("\"subnet\" {text:?} is not ADDRESS/PREFIX");
    let (address, prefix) = text.split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = address.parse().map_err(|_| bad())?;
    let network = Addr::new(ip);
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    let bits = network.family.bits();
    if u32::from(prefix) > bits {
        return Err(bad());
    }
    let host_bits = bits - u32::from(prefix);
    let mask = host_mask(network.family, prefix);
    if network.value & mask != 0 {
        let real = Addr {
            value: network.value & !mask,
            ..network
        };
        return Err(format!(
            "\"subnet\" {text} is not a network address: with /{prefix} it is {real}/{prefix}"
        ));
    }
    if host_bits < 2 {
        return Err(format!(
            "\"subnet\" {text} is too small: it has no address to give"
        ));
    }
    Ok((network, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn addr(text: &str) -> Addr {
        Addr::new(text.parse().unwrap())
    }

    fn range(value: Value) -> Range {
        Range::parse(&value).unwrap()
    }

    fn refused(value: Value) -> String {
        Range::parse(&value).unwrap_err()
    }

    #[test]
    fn defaults_are_host_locals() {
        let r = range(json!({"subnet": "10.1.0.0/24"}));
        assert_eq!((r.start, r.end), (addr("10.1.0.1"), addr("10.1.0.254")));
        assert_eq!(r.gateway, addr("10.1.0.1"));
        assert!(!r.gives(addr("10.1.0.1")), "the gateway");
        assert!(r.gives(addr("10.1.0.2")));
        assert!(!r.gives(addr("10.1.0.255")) && !r.gives(addr("10.1.0.0")));
        let r = range(json!({"subnet": "fd00::/64"}));
        assert_eq!(r.start, addr("fd00::1"));
        assert_eq!(r.end, addr("fd00::ffff:ffff:ffff:ffff"));
        assert!(r.gives(r.end), "IPv6 has no broadcast address");
        let r = range(json!({"subnet": "fd00::/48"}));
        assert_eq!(r.end, addr("fd00:0:0:ffff:ffff:ffff:ffff:ffff"));
        // The whole space: its last address counted too.
        let r =
            range(json!({"subnet": "::/0", "rangeEnd": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}));
        assert!(r.gives(r.end) && r.size() == u128::MAX);
    }

    #[test]
    fn every_field_is_checked_and_named() {
        for (value, said) in [
            (
                json!({"subnet": "10.1.0.1/24"}),
                "not a network address: with /24 it is 10.1.0.0/24",
            ),
            (json!({"subnet": "10.1.0.0/31"}), "too small"),
            (json!({"subnet": "10.1.0.0"}), "not ADDRESS/PREFIX"),
            (json!({"subnet": "10.1.0.0/33"}), "not ADDRESS/PREFIX"),
            (json!({}), "\"subnet\" is missing"),
            (
                json!({"subnet": "10.1.0.0/24", "rangeStart": "10.2.0.1"}),
                "\"rangeStart\" 10.2.0.1 is outside the subnet",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "rangeEnd": "10.1.1.0"}),
                "\"rangeEnd\" 10.1.1.0 is outside",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "gateway": "10.9.9.9"}),
                "\"gateway\" 10.9.9.9 is outside",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "rangeStart": "fd00::1"}),
                "not of the subnet's IP version",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.9", "rangeEnd": "10.1.0.5"}),
                "\"rangeStart\" 10.1.0.9 is after \"rangeEnd\" 10.1.0.5",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "gateway": 3}),
                "\"gateway\" must be an address",
            ),
            (json!("10.1.0.0/24"), "must be an object"),
            (
                json!({"subnet": "10.1.0.0/24", "exclude": ["10.1.1.0/28"]}),
                "\"exclude\" 10.1.1.0/28 is outside the subnet 10.1.0.0/24",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "exclude": ["10.1.0.0/23"]}),
                "\"exclude\" 10.1.0.0/23 is outside the subnet 10.1.0.0/24",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "exclude": ["10.1.0.8/28"]}),
                "\"exclude\" 10.1.0.8/28 is not a network address: with /28 it is 10.1.0.0/28",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "exclude": ["fd00::1"]}),
                "\"exclude\" fd00::1 is not of the subnet's IP version",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "exclude": ["10.1.0.x"]}),
                "\"exclude\" \"10.1.0.x\" is not an address or ADDRESS/PREFIX",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "exclude": "10.1.0.5"}),
                "\"exclude\" must be an array",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "exclude": [5]}),
                "\"exclude\" 5 is not a string",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "exlude": ["10.1.0.5"]}),
                "unknown key \"exlude\": a range has \"subnet\", \"rangeStart\"",
            ),
            (
                json!({"subnet": "10.1.0.0/24", "rangeStrat": "10.1.0.9"}),
                "unknown key \"rangeStrat\"",
            ),
        ] {
            let error = refused(value.clone());
            assert!(error.contains(said), "{value}: {error}");
        }
    }

    #[test]
    fn a_range_counts_what_it_may_give_by_blocks() {
        // .1 the gateway, .7 broadcast (and .0 outside the range).
        assert_eq!(range(json!({"subnet": "10.1.0.0/29"})).given_count(), 5);
        // Overlapping blocks counted once; the gateway inside one not twice.
        let r = range(
            json!({"subnet": "10.1.0.0/29", "exclude": ["10.1.0.0/30", "10.1.0.2", "10.1.0.3"]}),
        );
        assert_eq!(r.given_count(), 3);
        let r = range(
            json!({"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.100", "rangeEnd": "10.1.0.199", "gateway": "10.1.0.1"}),
        );
        assert_eq!(r.given_count(), 100);
        // IPv6: all of a /48 but its gateway, never enumerated.
        assert_eq!(
            range(json!({"subnet": "fd00::/48"})).given_count(),
            (1u128 << 80) - 2
        );
        let r = range(json!({"subnet": "fd00::/64", "exclude": ["fd00::/65"]}));
        assert_eq!(r.given_count(), 1u128 << 63);
        // The whole space, saturated rather than wrapped.
        let r = range(
            json!({"subnet": "::/0", "rangeStart": "::", "rangeEnd": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}),
        );
        assert_eq!(r.given_count(), u128::MAX - 1);
    }

    #[test]
    fn excluded_addresses_and_blocks_are_not_given_and_are_stepped_over() {
        let r = range(
            json!({"subnet": "10.1.0.0/24", "exclude": ["10.1.0.64/26", "10.1.0.9", "10.1.0.8/32"]}),
        );
        assert!(!r.gives(addr("10.1.0.9")) && !r.gives(addr("10.1.0.8")));
        assert!(!r.gives(addr("10.1.0.64")) && !r.gives(addr("10.1.0.127")));
        assert!(r.gives(addr("10.1.0.10")) && r.gives(addr("10.1.0.128")));
        assert_eq!(
            r.refusal(addr("10.1.0.70")).unwrap(),
            "it is excluded (10.1.0.64/26) from 10.1.0.0/24"
        );
        let spans: Vec<(String, String)> = r
            .spans(addr("10.1.0.2"), addr("10.1.0.200"))
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let expected = [
            ("10.1.0.2", "10.1.0.7"),
            ("10.1.0.10", "10.1.0.63"),
            ("10.1.0.128", "10.1.0.200"),
        ];
        assert_eq!(spans, expected.map(|(a, b)| (a.to_owned(), b.to_owned())));
        // Wholly inside one block: nothing to look at.
        assert!(r.spans(addr("10.1.0.65"), addr("10.1.0.80")).is_empty());
        // A block at the very end of the address space ends the spans.
        let r = range(json!({"subnet": "ffff::/16", "exclude": ["ffff:ffff::/32"]}));
        assert_eq!(
            r.spans(addr("ffff::1"), r.end),
            [(
                addr("ffff::1"),
                addr("ffff:fffe:ffff:ffff:ffff:ffff:ffff:ffff")
            )]
        );
    }

    #[test]
    fn sortable_names_sort_as_addresses_do_and_read_back() {
        let mut addresses = vec![
            addr("10.1.0.10"),
            addr("10.1.0.9"),
            addr("9.255.0.1"),
            addr("10.1.0.200"),
        ];
        let mut names: Vec<String> = addresses.iter().map(|a| a.sortable()).collect();
        addresses.sort();
        names.sort();
        let read: Vec<Addr> = names
            .iter()
            .map(|n| Addr::from_sortable(n).unwrap())
            .collect();
        assert_eq!(read, addresses);
        assert_eq!(addr("10.1.0.9").sortable(), "010.001.000.009");
        let v6 = addr("fd00::1:2");
        assert_eq!(v6.sortable(), "fd00:0000:0000:0000:0000:0000:0001:0002");
        assert_eq!(Addr::from_sortable(&v6.sortable()), Some(v6));
    }

    #[test]
    fn arithmetic_stays_in_the_family() {
        assert_eq!(addr("10.0.0.255").plus(1), Some(addr("10.0.1.0")));
        assert_eq!(addr("255.255.255.255").plus(1), None);
        assert_eq!(addr("fd00::").plus(1 << 64), Some(addr("fd00:0:0:1::")));
        assert_eq!(addr("::ffff:10.0.0.1"), addr("10.0.0.1"));
    }

    #[test]
    fn overlapping_ranges_are_found() {
        let a = range(json!({"subnet": "10.1.0.0/24", "rangeEnd": "10.1.0.100"}));
        let b = range(json!({"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.101"}));
        let c = range(json!({"subnet": "10.1.0.0/16"}));
        assert!(!a.overlaps(&b));
        assert!(a.overlaps(&c) && c.overlaps(&b));
    }

    #[test]
    fn subnets_contain_cover_and_bound_their_hosts() {
        let big = Subnet::parse("10.1.0.0/16").unwrap();
        let low = Subnet::parse("10.1.0.0/24").unwrap();
        let high = Subnet::parse("10.1.255.0/24").unwrap();
        let a = |t: &str| Addr::new(t.parse().unwrap());
        assert!(big.contains(a("10.1.200.3")) && !big.contains(a("10.2.0.0")));
        assert!(!big.contains(a("::1")));
        assert!(big.covers(&low) && !low.covers(&big));
        assert!(!Subnet::parse("10.2.0.0/24").unwrap().covers(&low));
        assert_eq!(low.host_bounds_in(&big), (a("10.1.0.1"), a("10.1.0.255")));
        assert_eq!(
            high.host_bounds_in(&big),
            (a("10.1.255.0"), a("10.1.255.254"))
        );
        let v6 = Subnet::parse("fd00::/64").unwrap();
        assert_eq!(
            v6.host_bounds_in(&v6),
            (a("fd00::"), a("fd00::ffff:ffff:ffff:ffff"))
        );
        assert_eq!(big.to_string(), "10.1.0.0/16");
    }
}
