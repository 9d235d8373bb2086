//! A port's age by the controller's clock: its `created_at` (RFC 3339,
//! as Neutron writes it, with or without the `Z`) against the `Date` of
//! the controller's answer (RFC 1123), each as seconds since the epoch,
//! so that a node's own clock, skewed or not, never decides it.

/// Seconds since the epoch of `2026-11-26T18:00:00Z` (fractions and a
/// zero offset allowed).
pub fn rfc3339(text: &str) -> Option<u64> {
    let text = text.trim_end_matches('Z').trim_end_matches("+00:00");
    let (date, time) = text.split_once(['T', ' '])?;
    let mut date = date.splitn(3, '-').map(|p| p.parse::<u64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let time = time.split('.').next()?;
    let mut time = time.splitn(3, ':').map(|p| p.parse::<u64>().ok());
    let (hour, minute, second) = (time.next()??, time.next()??, time.next()??);
    seconds(year, month, day, hour, minute, second)
}

/// Seconds since the epoch of an HTTP date: `Thu, 26 Nov 2026 18:00:00 GMT`.
pub fn http_date(text: &str) -> Option<u64> {
    let mut words = text.split_whitespace().skip(1);
    let day = words.next()?.parse().ok()?;
    let month = words.next()?;
    let year = words.next()?.parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m.eq_ignore_ascii_case(month))? as u64
        + 1;
    let mut time = words.next()?.splitn(3, ':').map(|p| p.parse::<u64>().ok());
    let (hour, minute, second) = (time.next()??, time.next()??, time.next()??);
    seconds(year, month, day, hour, minute, second)
}

/// Days from the civil date (Howard Hinnant's algorithm), then seconds.
fn seconds(year: u64, month: u64, day: u64, hour: u64, minute: u64, second: u64) -> Option<u64> {
    if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let shifted_month = (month + 9) % 12;
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = (era * 146_097 + day_of_era).checked_sub(719_468)?;
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_clocks_read_as_the_same_seconds() {
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339("2026-11-26T18:00:00Z"), Some(1_795_716_000));
        assert_eq!(rfc3339("2026-11-26T18:00:00"), Some(1_795_716_000));
        assert_eq!(rfc3339("2026-11-26 18:00:00.123456"), Some(1_795_716_000));
        assert_eq!(rfc3339("2024-02-29T00:00:01+00:00"), Some(1_709_164_801));
        assert_eq!(
            http_date("Thu, 26 Nov 2026 18:00:00 GMT"),
            Some(1_795_716_000)
        );
        assert_eq!(
            http_date("Thu, 26 Nov 2026 18:00:05 GMT").unwrap()
                - rfc3339("2026-11-26T18:00:00Z").unwrap(),
            5
        );
        for bad in ["", "2026-13-01T00:00:00Z", "yesterday", "2026-11-26"] {
            assert_eq!(rfc3339(bad), None, "{bad}");
        }
        assert_eq!(http_date("Thu, 26 Foo 2026 18:00:00 GMT"), None);
    }
}
