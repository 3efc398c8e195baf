//! Checking the ranks of a new sub-group (`new_group`), and the
//! store namespace each sub-group gets.
//!
//! As in PyTorch, every rank of the parent group calls `new_group` for
//! every sub-group, in the same order, whether or not it is a member: the
//! n-th call on every rank names the n-th namespace, so members of one
//! sub-group meet under keys that no other group uses. Ranks are sorted:
//! rank `i` of the sub-group is the `i`-th smallest parent rank.

use crate::{Error, Result};

/// `ranks` sorted, after checking that they are distinct ranks of a group
/// of `size` and that there is at least one.
pub(crate) fn check_group_ranks(ranks: &[usize], size: usize) -> Result<Vec<usize>> {
    let bad = |reason: String| Error::InvalidCollective {
        op: "new_group".into(),
        reason,
    };
    if ranks.is_empty() {
        return Err(bad("expected at least one rank, found none".into()));
    }
    if let Some(&r) = ranks.iter().find(|&&r| r >= size) {
        return Err(bad(format!(
            "expected ranks of the parent group in 0..{size}, found {r}"
        )));
    }
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    if let Some(pair) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(bad(format!(
            "expected distinct ranks, found {} more than once in {ranks:?}",
            pair[0]
        )));
    }
    Ok(sorted)
}

/// The store namespace of the `n`-th sub-group created from the group
/// whose keys live under `parent_prefix`.
pub(crate) fn subgroup_prefix(parent_prefix: &str, n: u64) -> String {
    format!("{parent_prefix}/subgroup{n}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(result: Result<Vec<usize>>) -> String {
        match result {
            Err(Error::InvalidCollective { op, reason }) if op == "new_group" => reason,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ranks_are_sorted_and_bad_ones_named() {
        assert_eq!(check_group_ranks(&[3, 0, 2], 4).unwrap(), [0, 2, 3]);
        assert!(reason(check_group_ranks(&[], 4)).contains("found none"));
        assert!(reason(check_group_ranks(&[1, 4], 4)).contains("0..4, found 4"));
        assert!(reason(check_group_ranks(&[2, 1, 2], 4)).contains("found 2 more than once"));
        assert_ne!(subgroup_prefix("pg", 0), subgroup_prefix("pg", 1));
    }
}
