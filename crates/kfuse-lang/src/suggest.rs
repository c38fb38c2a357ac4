//! "Did you mean" suggestions: the closest known name by edit distance, if it is close enough
//! to be a likely typo. Nothing else.

/// The candidate closest to `wrong`: Levenshtein distance at most a third of its length (at
/// least 1, but names of one or two characters only match up to case), ties going to the first.
pub(crate) fn closest<'a>(wrong: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let len = wrong.chars().count();
    let limit = (len / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = if c.eq_ignore_ascii_case(wrong) {
            1
        } else if len < 3 {
            continue;
        } else {
            edit_distance(wrong, c)
        };
        if d <= limit && d > 0 && !matches!(best, Some((bd, _)) if bd <= d) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let swap = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + swap).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_only_close_names() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(closest("ara1", ["area1", "valid"]), Some("area1"));
        assert_eq!(closest("sigmod", ["sigmoid", "sin"]), Some("sigmoid"));
        assert_eq!(closest("zzz", ["area1", "valid"]), None);
        assert_eq!(closest("N", ["x", "n"]), Some("n"));
        assert_eq!(closest("y", ["x"]), None);
    }
}
