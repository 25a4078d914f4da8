//! Fallible allocation for sizes read from files: a size the system cannot provide is an error
//! the caller reports, not an aborted process.

use std::collections::TryReserveError;

/// `n` copies of `fill`, reserved with `try_reserve_exact` before any is written.
pub fn try_filled<T: Clone>(n: usize, fill: T) -> Result<Vec<T>, TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    v.resize(n, fill);
    Ok(v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn refuses_what_cannot_be_reserved() {
        assert_eq!(super::try_filled(3, 7u8), Ok(vec![7, 7, 7]));
        assert!(super::try_filled(usize::MAX / 2, 0u64).is_err());
    }
}
